#!/usr/bin/env bash
# A container engine for `make image` and the kind e2e cluster: the one already there, else a dockerd
# of our own. Why: the project's images and the kind cluster need an engine, and fresh machines of our
# kind have none (only the docker CLI). As root we install Debian's docker.io and run dockerd with its
# socket, data root and logs under $CACHE_DIR/docker, so the images it builds (the kind node image,
# the project's images) outlive clones and `make cluster-down` / `make image-down` stop it again.
#
# Usage: engine.sh up     ensure an engine answers; print `export DOCKER_HOST=...` (stdout)
#        engine.sh host   print the DOCKER_HOST of a running engine (exit 1 if none)
#        engine.sh why    print why no engine can be had here (nothing, exit 0, when one can)
#        engine.sh down   stop the dockerd this script started (an engine we found is left alone)
set -euo pipefail
CACHE_DIR=${CACHE_DIR:-$HOME/.cache/txnkeeper}
ROOT=$CACHE_DIR/docker
SOCK=$ROOT/docker.sock
OURS=unix://$SOCK
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

answers() { DOCKER_HOST=$1 timeout 20 docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

# An engine the user already runs (DOCKER_HOST, or the default socket) wins over ours.
existing() {
    command -v docker >/dev/null 2>&1 || return 1
    if [[ -n ${DOCKER_HOST:-} && $DOCKER_HOST != "$OURS" ]]; then
        answers "$DOCKER_HOST" && echo "$DOCKER_HOST" && return 0
    fi
    [[ -S /var/run/docker.sock ]] && answers unix:///var/run/docker.sock && echo unix:///var/run/docker.sock && return 0
    [[ -S $SOCK ]] && answers "$OURS" && echo "$OURS" && return 0
    return 1
}

why() {
    existing >/dev/null && return 0
    if [[ $(id -u) != 0 ]]; then
        echo "no container engine answers (DOCKER_HOST, /var/run/docker.sock) and starting one needs root"
    elif ! command -v dockerd >/dev/null 2>&1 && ! command -v apt-get >/dev/null 2>&1; then
        echo "no container engine answers and dockerd cannot be installed here (no apt-get)"
    fi
}

# The machine's MTU (the default route's interface): a bridge MTU above it drops large packets, which
# shows up as TLS handshakes to the package index hanging inside `docker build`.
host_mtu() {
    local dev
    dev=$(ip -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
    cat "/sys/class/net/${dev:-eth0}/mtu" 2>/dev/null || echo 1500
}

# CAP_SYS_RESOURCE (bit 24) missing from the bounding set: privileged containers need runc-nosysres.
lacks_sys_resource() {
    local bnd
    bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
    (((0x$bnd >> 24) & 1)) && return 1 || return 0
}

# A bridge left by an engine that no longer runs (another data root: an earlier CACHE_DIR, a dockerd
# since stopped) keeps its address and its kernel route. When its subnet is one this engine uses (kind's
# network is 172.18.0.0/16 in every data root), that dead route can come first: the node container
# becomes unreachable from here, its published API-server port resets every connection, and the
# cluster looks up inside while the suite cannot reach it. Such a bridge is deleted: one with no port
# attached, not a network of this engine, with a subnet of one of this engine's.
clear_stale_bridges() {
    [[ $(id -u) == 0 ]] && command -v ip >/dev/null 2>&1 || return 0
    local ours subnets dev subnet
    ours=$(DOCKER_HOST=$1 docker network ls -q --no-trunc --filter driver=bridge 2>/dev/null) || return 0
    # shellcheck disable=SC2086 # one argument per network id
    subnets=$(DOCKER_HOST=$1 docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}}{{"\n"}}{{end}}' \
        $ours 2>/dev/null) || return 0
    for dev in $(ip -o link show type bridge | awk -F': ' '$2 ~ /^br-/ {print $2}'); do
        grep -q "^${dev#br-}" <<<"$ours" && continue
        [[ -d /sys/class/net/$dev/brif && -z $(ls -A "/sys/class/net/$dev/brif") ]] || continue
        for subnet in $(ip -4 route show dev "$dev" proto kernel | awk '{print $1}'); do
            if grep -qxF "$subnet" <<<"$subnets"; then
                echo "engine: deleting bridge $dev: no engine here uses it, and its route to $subnet" \
                    "hides the engine's own network" >&2
                ip link delete "$dev" || true
                break
            fi
        done
    done
}

up() {
    local host
    if host=$(existing); then
        clear_stale_bridges "$host"
        echo "export DOCKER_HOST=$host"
        return 0
    fi
    local reason
    reason=$(why)
    if [[ -n $reason ]]; then
        echo "engine: $reason" >&2
        return 2
    fi
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
        echo "engine: installing Debian's docker.io (dockerd, containerd, runc) with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null
        apt-get install -y -q --no-install-recommends docker.io iptables jq >/dev/null
    fi
    mkdir -p "$ROOT/data" "$ROOT/exec"
    local runtime=()
    if lacks_sys_resource; then
        install -m 0755 "$HERE/runc-nosysres" "$ROOT/runc-nosysres"
        runtime=(--add-runtime "nosysres=$ROOT/runc-nosysres" --default-runtime nosysres)
    fi
    echo "engine: starting dockerd (data root $ROOT/data, log $ROOT/dockerd.log)" >&2
    # setsid: the engine outlives the make that started it (later targets and runs reuse it).
    setsid dockerd --data-root "$ROOT/data" --exec-root "$ROOT/exec" --pidfile "$ROOT/dockerd.pid" \
        -H "$OURS" --storage-driver overlay2 --mtu "$(host_mtu)" "${runtime[@]}" \
        >"$ROOT/dockerd.log" 2>&1 </dev/null &
    local deadline=$((SECONDS + 60))
    until answers "$OURS"; do
        if ((SECONDS > deadline)); then
            echo "engine: dockerd did not answer on $SOCK within 60 s; its log:" >&2
            tail -20 "$ROOT/dockerd.log" >&2
            return 1
        fi
        sleep 0.5
    done
    clear_stale_bridges "$OURS"
    echo "export DOCKER_HOST=$OURS"
}

down() {
    [[ -f $ROOT/dockerd.pid ]] || return 0
    local pid
    pid=$(cat "$ROOT/dockerd.pid")
    if kill -0 "$pid" 2>/dev/null; then
        echo "engine: stopping dockerd ($pid)" >&2
        kill "$pid"
        local deadline=$((SECONDS + 60))
        while kill -0 "$pid" 2>/dev/null; do
            ((SECONDS > deadline)) && kill -9 "$pid" && break
            sleep 0.5
        done
    fi
    rm -f "$ROOT/dockerd.pid"
}

case ${1:-} in
up) up ;;
host) existing ;;
why) why ;;
down) down ;;
*)
    echo "usage: $0 up|host|why|down" >&2
    exit 2
    ;;
esac
