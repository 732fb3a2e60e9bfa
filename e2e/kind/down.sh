#!/usr/bin/env bash
# Deletes the kind cluster made by e2e/kind/up.sh.
set -euo pipefail
kind delete cluster --name txnkeeper-e2e
rm -f "$(dirname "${BASH_SOURCE[0]}")/../.state/kind.kubeconfig"
