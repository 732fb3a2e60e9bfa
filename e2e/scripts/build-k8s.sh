#!/usr/bin/env bash
# Builds the Kubernetes binaries at the release pinned in e2e/k8s/go.mod, from the Go module proxy, into
# $CACHE_DIR/k8s/v<version>/bin: kube-apiserver and kubectl (the operator's API-server test and the e2e
# tools), and kubelet, kubeadm, kube-proxy, kube-controller-manager and kube-scheduler for the kind node
# image (e2e/kind/node-image.sh). One `go build` of all seven shares every common package: the three
# node binaries add ~200 packages to the control plane's ~2,650.
#
# Why a script and not `go install`: k8s.io/kubernetes replaces its staging modules with local paths,
# which `go install pkg@version` refuses; the wrapper module in e2e/k8s pins them to published tags.
# The build is long on two cores (see README "Cluster tests"), so it is skipped when a stamp (hash of
# go.mod, go.sum and this script) matches: a warm run costs one sha256sum.
#
# Usage: build-k8s.sh            build if needed, print the bin directory
#        build-k8s.sh --bin-dir  only print the bin directory
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD_DIR=$E2E_DIR/k8s
VERSION=$(sed -n 's/^require k8s\.io\/kubernetes v//p' "$MOD_DIR/go.mod")
CACHE_DIR=${CACHE_DIR:-$HOME/.cache/txnkeeper}
OUT=$CACHE_DIR/k8s/v$VERSION/bin
COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy)

if [[ ${1:-} == --bin-dir ]]; then
    echo "$OUT"
    exit 0
fi

stamp=$(cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
if [[ -f $OUT/.stamp && $(cat "$OUT/.stamp") == "$stamp" ]]; then
    echo "$OUT"
    exit 0
fi

if ! command -v go >/dev/null; then
    echo "build-k8s: Go is not installed; cannot build Kubernetes v$VERSION" >&2
    exit 2
fi

# Module and build caches live under CACHE_DIR so that one directory holds everything this project
# downloads and builds (and `rm -rf` of it is a true cold start; -modcacherw keeps that removable).
export GOMODCACHE=${GOMODCACHE_OVERRIDE:-$CACHE_DIR/go/mod}
export GOCACHE=${GOCACHE_OVERRIDE:-$CACHE_DIR/go/build}
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-modcacherw -mod=readonly ${GOFLAGS:-}"

# The same version stamping as hack/lib/version.sh, so the API server reports v<version> (helm's
# kubeVersion checks and kubectl's skew warnings read it).
minor=$(cut -d. -f2 <<<"$VERSION")
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

pkgs=()
for c in "${COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done

tmp=$OUT.tmp.$$
rm -rf "$tmp"
mkdir -p "$tmp"
start=$(date +%s)
echo "build-k8s: building Kubernetes v$VERSION (${COMMANDS[*]}) into $OUT; cold builds take a while" >&2
(cd "$MOD_DIR" && nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
echo "$stamp" >"$tmp/.stamp"
rm -rf "$OUT"
mv "$tmp" "$OUT"
echo "build-k8s: built in $(($(date +%s) - start)) s" >&2
echo "$OUT"
