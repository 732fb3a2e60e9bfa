#!/usr/bin/env bash
# Deletes the kind cluster made by e2e/kind/up.sh (the engine and its image cache stay: engine.sh down
# stops the engine).
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=${KIND_CLUSTER:-txnkeeper-e2e}
KIND=$CACHE_DIR/kind/bin/kind
if host=$(bash "$KIND_DIR/engine.sh" host) && [[ -x $KIND ]]; then
    DOCKER_HOST=$host "$KIND" delete cluster --name "$NAME" >&2
fi
if [[ -f $REPO_ROOT/e2e/.state/kind.routed ]]; then
    ip route del "$(cat "$REPO_ROOT/e2e/.state/kind.routed")" 2>/dev/null || true
fi
rm -f "$REPO_ROOT/e2e/.state/kind.kubeconfig" "$REPO_ROOT/e2e/.state/kind.routed"
