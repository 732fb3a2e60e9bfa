#!/usr/bin/env bash
# `make image`: the runtime and verifier images from the Dockerfile, with whatever engine is present
# (e2e/kind/engine.sh starts one as root where there is none). Why a script: where the Dockerfile's
# FROM (python:3.11-slim-bookworm) cannot be pulled (no registry reachable), it first builds an
# equivalent base from the Debian mirror (Debian's Python 3.11, venv, CA certificates, this machine's
# extra CAs and pip configuration) and passes it as PYTHON_IMAGE; it then reports both images' sizes
# against their budgets.
#
# Usage: image.sh [TAG]   builds txnkeeper:TAG and txnkeeper-verifier:TAG (TAG defaults to e2e);
#        IMAGE / VERIFIER_IMAGE override the full names.
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
TAG=${1:-e2e}
IMAGE=${IMAGE:-txnkeeper:$TAG}
VERIFIER_IMAGE=${VERIFIER_IMAGE:-txnkeeper-verifier:$TAG}
UPSTREAM_BASE=python:3.11-slim-bookworm
LOCAL_BASE=txnkeeper/python-base:3.11-$SUITE
BASE_PACKAGES=(ca-certificates python3 python3-venv python-is-python3 passwd)
RUNTIME_BUDGET_MB=${RUNTIME_BUDGET_MB:-300}
VERIFIER_BUDGET_MB=${VERIFIER_BUDGET_MB:-1000}

eval "$(bash "$KIND_DIR/engine.sh" up)"
export DOCKER_HOST

base=$UPSTREAM_BASE
if ! docker image inspect "$UPSTREAM_BASE" >/dev/null 2>&1 &&
    ! timeout 60 docker pull -q "$UPSTREAM_BASE" >/dev/null 2>&1; then
    base=$LOCAL_BASE
    recipe=$(debian_recipe "${BASE_PACKAGES[@]}")
    if built_from "$LOCAL_BASE" "$recipe"; then
        log "$UPSTREAM_BASE cannot be pulled; using $LOCAL_BASE (built earlier)"
    else
        log "$UPSTREAM_BASE cannot be pulled; building $LOCAL_BASE from the Debian mirror instead"
        debian_image "$LOCAL_BASE" 'ENV LANG=C.UTF-8' \
            'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["python3"]' -- \
            "${BASE_PACKAGES[@]}"
        mark_built "$LOCAL_BASE" "$recipe"
    fi
fi

cd "$REPO_ROOT"
start=$SECONDS
# The legacy builder builds every stage before the target; the verifier build then reuses the cache.
nice -n 10 docker build -q --build-arg "PYTHON_IMAGE=$base" --target runtime -t "$IMAGE" . >/dev/null
nice -n 10 docker build -q --build-arg "PYTHON_IMAGE=$base" --target verifier -t "$VERIFIER_IMAGE" . >/dev/null
log "built $IMAGE and $VERIFIER_IMAGE in $((SECONDS - start)) s (base $base)"

over=0
for pair in "$IMAGE:$RUNTIME_BUDGET_MB" "$VERIFIER_IMAGE:$VERIFIER_BUDGET_MB"; do
    name=${pair%:*} budget=${pair##*:}
    size=$(($(docker image inspect -f '{{.Size}}' "$name") / 1000000))
    digest=$(docker image inspect -f '{{.Id}}' "$name")
    verdict="within"
    ((size > budget)) && verdict="OVER" && over=1
    echo "image $name $digest: $size MB ($verdict the $budget MB budget)"
done
exit $over
