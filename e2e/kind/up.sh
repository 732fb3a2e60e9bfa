#!/usr/bin/env bash
# The kind cluster of the e2e suite: a container engine (e2e/kind/engine.sh), the node image
# (node-image.sh), the project's runtime and verifier images (image.sh), then `kind create cluster`,
# the images loaded into the node (no registry involved), the kubeconfig written to
# e2e/.state/kind.kubeconfig and the environment to use it printed and written to e2e/.state/kind.env.
# An existing cluster of the same name is reused (the images are loaded again: a rebuilt image
# replaces the old one).
#
# Usage: up.sh   (E2E_IMAGE / E2E_VERIFIER_IMAGE name the project's images; KIND_CLUSTER the cluster)
set -Eeuo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NAME=${KIND_CLUSTER:-txnkeeper-e2e}
IMAGE=${E2E_IMAGE:-txnkeeper:e2e}
VERIFIER_IMAGE=${E2E_VERIFIER_IMAGE:-txnkeeper-verifier:e2e}
STATE=$REPO_ROOT/e2e/.state
KUBECONFIG_OUT=$STATE/kind.kubeconfig
POD_CIDR=10.244.0.0/16 # kind's podSubnet; the node image's bridge CNI hands out 10.244.0.0/24 of it
# Any failing step says which it was (also into $E2E_SETUP_LOG, for the test digest).
# -E carries the trap into functions, where it fires first; the guard keeps the call site's second firing quiet.
failed_step=""
trap 'rc=$?; [[ -n $failed_step ]] || { failed_step=$LINENO; log "failed (exit $rc) at line $LINENO: $BASH_COMMAND"; }' ERR
eval "$(bash "$KIND_DIR/engine.sh" up)"
export DOCKER_HOST
KIND=$(bash "$KIND_DIR/components.sh")/kind
node_image=$(bash "$KIND_DIR/node-image.sh")
IMAGE=$IMAGE VERIFIER_IMAGE=$VERIFIER_IMAGE bash "$KIND_DIR/image.sh" >&2
mkdir -p "$STATE"
start=$SECONDS
# A cluster left from an earlier run whose node container is no longer running (the machine or the
# engine restarted since) cannot be reused: kind would still list it.
if "$KIND" get clusters 2>/dev/null | grep -qx "$NAME" &&
    [[ $(docker inspect -f '{{.State.Running}}' "$NAME-control-plane" 2>/dev/null) != true ]]; then
    log "deleting cluster $NAME: its node container is not running"
    "$KIND" delete cluster --name "$NAME" >&2
fi
create() {
    log "creating kind cluster $NAME from $node_image"
    "$KIND" create cluster --name "$NAME" --config "$KIND_DIR/kind-config.yaml" --image "$node_image" \
        --kubeconfig "$KUBECONFIG_OUT" --wait 240s >&2
    log "cluster $NAME up in $((SECONDS - start)) s"
}
# `kind create --wait` asks the API server from inside the node; the suite asks it from here, through
# the port the engine publishes. Wait until that answers /readyz three times in a row (a control plane
# that restarts a component right after coming up answers once, then resets connections). The last
# refusal is kept in $last_refusal: it is what the failure message quotes.
last_refusal=""
answers_here() {
    local deadline=$((SECONDS + $1)) streak=0 out
    while ((SECONDS < deadline)); do
        if out=$("$KUBECTL" --kubeconfig "$KUBECONFIG_OUT" --request-timeout=5s get --raw /readyz 2>&1); then
            ((++streak >= 3)) && return 0
        else
            streak=0
            last_refusal=$(tail -n 1 <<<"$out" | cut -c1-300)
        fi
        sleep 1
    done
    return 1
}
KUBECTL=$K8S_BIN/kubectl
reused=0
if "$KIND" get clusters 2>/dev/null | grep -qx "$NAME"; then
    reused=1
else
    create
fi
"$KIND" get kubeconfig --name "$NAME" >"$KUBECONFIG_OUT"
# A cluster that does not answer from here is deleted and created once more: a reused one may belong
# to an engine that restarted, and a fresh one's control plane can fail to settle when the machine is
# saturated (the unit suite computes beside it). The first failure's diagnostics are printed before
# the cluster is deleted, as they would be lost with it.
if ! answers_here 120; then
    log "cluster $NAME does not answer from here within 120 s (${last_refusal:-no answer}):" \
        "deleting and creating it again"
    ((reused)) || bash "$KIND_DIR/diagnose.sh" >&2
    "$KIND" delete cluster --name "$NAME" >&2
    start=$SECONDS
    create
    "$KIND" get kubeconfig --name "$NAME" >"$KUBECONFIG_OUT"
    if ! answers_here 180; then
        log "the API server of $NAME does not answer at $(sed -n 's/^ *server: //p' "$KUBECONFIG_OUT")" \
            "from here within 180 s of a second creation (${last_refusal:-no answer})"
        bash "$KIND_DIR/diagnose.sh" >&2
        exit 1
    fi
fi
# The pod network, routed from this machine through the node container (as root), so that tests reach
# pods at their pod IPs as in-cluster clients do; without it they use `kubectl port-forward`.
node_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NAME-control-plane")
if [[ $(id -u) == 0 ]] && ip route replace "$POD_CIDR" via "$node_ip" 2>/dev/null; then
    log "routing $POD_CIDR via the node ($node_ip)"
    echo "$POD_CIDR" >"$STATE/kind.routed"
else
    log "not routing $POD_CIDR here (needs root): tests reach pods through kubectl port-forward"
    rm -f "$STATE/kind.routed"
fi
start=$SECONDS
"$KIND" load docker-image --name "$NAME" "$IMAGE" "$VERIFIER_IMAGE" >&2
log "loaded $IMAGE and $VERIFIER_IMAGE into $NAME in $((SECONDS - start)) s"
env_line="export DOCKER_HOST=$DOCKER_HOST KUBECONFIG=$KUBECONFIG_OUT E2E_IMAGE=$IMAGE E2E_VERIFIER_IMAGE=$VERIFIER_IMAGE"
echo "$env_line" >"$STATE/kind.env"
echo "$env_line"
