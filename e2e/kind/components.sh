#!/usr/bin/env bash
# The Go-built pieces of the kind cluster, into $CACHE_DIR/kind/bin: kind itself, and the component
# images' binaries that no registry can give us here (etcd, CoreDNS, local-path-provisioner, pause).
# Why from source: registries are out of reach on the machines this runs on, the Go module proxy is
# not. Every build uses the one Go module and build cache under $CACHE_DIR/go (shared with the
# Kubernetes build, helm and MinIO), and a stamp per binary (its version and this script's hash)
# makes a warm run a few file reads. Run in parallel with the Kubernetes build where it pays: these are
# small next to it.
#
# Usage: components.sh   build what is missing; print the bin directory
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OUT=$CACHE_DIR/kind/bin
KIND_VERSION=v0.33.0
COREDNS_VERSION=v1.14.6
LPP_VERSION=v0.0.30
export GOMODCACHE=$CACHE_DIR/go/mod GOCACHE=$CACHE_DIR/go/build GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-modcacherw ${GOFLAGS:-}"
mkdir -p "$OUT"
self=$(inputs_hash "${BASH_SOURCE[0]}" "$KIND_DIR/components/go.mod" "$KIND_DIR/components/go.sum" \
    "$KIND_DIR"/components/*/main.go)

# build NAME STAMP CMD...: run CMD (which writes $OUT/NAME) unless NAME was built with this stamp.
build() {
    local name=$1 stamp=$2
    shift 2
    [[ -x $OUT/$name && -f $OUT/.$name && $(cat "$OUT/.$name") == "$stamp" ]] && return 0
    local start=$SECONDS
    log "building $name"
    "$@"
    echo "$stamp" >"$OUT/.$name"
    log "built $name in $((SECONDS - start)) s"
}
install_at() { GOBIN=$OUT nice -n 19 go install -trimpath -ldflags "-s -w" "$1"; }
# CoreDNS with the plugins kubeadm's Corefile uses (errors, health, ready, kubernetes, prometheus,
# forward, cache, loop, reload, loadbalance) and a few small general ones: CoreDNS's documented custom
# build (its own plugin.cfg, its own generator) from the release's module source. The cloud DNS plugins
# (route53, azure, clouddns), etcd and the rest were 40 % of its 1,362 packages and most of its
# 9-minute cold build here.
COREDNS_PLUGINS="root|metadata|cancel|timeouts|reload|bufsize|bind|debug|ready|health|prometheus|errors|log"
COREDNS_PLUGINS+="|loadbalance|cache|rewrite|hosts|kubernetes|loop|forward|whoami"
coredns() {
    local src work
    src=$(module_dir "github.com/coredns/coredns@$COREDNS_VERSION")
    work=$(mktemp -d)
    cp -r "$src/." "$work/"
    chmod -R u+w "$work"
    grep -E "^($COREDNS_PLUGINS):" "$src/plugin.cfg" >"$work/plugin.cfg"
    (cd "$work" && go run directives_generate.go && nice -n 19 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT/coredns" .)
    rm -rf "$work"
}
in_wrapper() { (cd "$KIND_DIR/components" && nice -n 19 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT/$1" "./$1"); }

build kind "$KIND_VERSION $self" install_at "sigs.k8s.io/kind@$KIND_VERSION"
build pause "$self" in_wrapper pause
build etcd "$self" in_wrapper etcd
build coredns "$COREDNS_VERSION $self" coredns
build local-path-provisioner "$LPP_VERSION $self" install_at "github.com/rancher/local-path-provisioner@$LPP_VERSION"
echo "$OUT"
