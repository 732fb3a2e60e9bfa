#!/usr/bin/env bash
# Creates the kind cluster for E2E_CLUSTER=kind, builds the txnkeeper image and loads it into the node
# (no registry involved), and writes its kubeconfig to e2e/.state/kind.kubeconfig.
# Needs docker and kind on PATH; the local control plane (make cluster-up) needs neither.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
NAME=txnkeeper-e2e
VERSION=$(sed -n 's/^require k8s\.io\/kubernetes v//p' e2e/k8s/go.mod)
IMAGE=${E2E_IMAGE:-txnkeeper:e2e}
VERIFIER_IMAGE=${E2E_VERIFIER_IMAGE:-txnkeeper-verifier:e2e}
mkdir -p e2e/.state
if ! kind get clusters | grep -qx "$NAME"; then
    kind create cluster --name "$NAME" --config e2e/kind/kind-config.yaml \
        --image "kindest/node:v$VERSION" --wait 180s
fi
docker build --target runtime -t "$IMAGE" .
docker build --target verifier -t "$VERIFIER_IMAGE" .
kind load docker-image "$IMAGE" "$VERIFIER_IMAGE" --name "$NAME"
kind get kubeconfig --name "$NAME" >e2e/.state/kind.kubeconfig
echo "export KUBECONFIG=$PWD/e2e/.state/kind.kubeconfig E2E_CLUSTER=kind E2E_IMAGE=$IMAGE E2E_VERIFIER_IMAGE=$VERIFIER_IMAGE"
