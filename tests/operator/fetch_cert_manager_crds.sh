#!/usr/bin/env bash
# Fetch cert-manager's Certificate CRD for the operator's cert-manager mode tests (no cert-manager
# controller runs: the test apiserver only validates the Certificate objects the operator makes).
#
# Why from the Go module proxy: the module github.com/cert-manager/cert-manager carries its CRDs as
# plain YAML under deploy/crds, and the proxy is reachable wherever `go` works. `go mod download` puts
# the module in the Go module cache the Makefile owns ($GOMODCACHE under $CACHE_DIR) and checks it
# against the checksum database; the module's h1 hash is pinned here as well. The CRD is other
# projects' code: it is copied into $CACHE_DIR, never committed.
#
# usage: fetch_cert_manager_crds.sh VERSION H1SUM OUTDIR
set -euo pipefail
version=$1 sum=$2 out=$3
module=github.com/cert-manager/cert-manager
info=$(go mod download -json "$module@$version") || {
  echo "fetch_cert_manager_crds.sh: go mod download $module@$version failed (the Go module proxy must be" \
    "reachable once; afterwards the module cache is reused)" >&2
  exit 1
}
got=$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["Sum"]); print(d["Dir"])' <<<"$info")
got_sum=$(sed -n 1p <<<"$got") dir=$(sed -n 2p <<<"$got")
if [[ $got_sum != "$sum" ]]; then
  echo "fetch_cert_manager_crds.sh: $module@$version has hash $got_sum, not the pinned $sum; refusing it" >&2
  exit 1
fi
crd=$dir/deploy/crds/cert-manager.io_certificates.yaml
# The release's CRDs are plain YAML; a Helm-templated one would need rendering, so say so rather than
# install something half-rendered.
if grep -q '{{' "$crd"; then
  echo "fetch_cert_manager_crds.sh: $crd holds Helm template directives; render it first" >&2
  exit 1
fi
mkdir -p "$out"
install -m 644 "$crd" "$out/certificates.cert-manager.io.yaml.tmp"
mv "$out/certificates.cert-manager.io.yaml.tmp" "$out/certificates.cert-manager.io.yaml"
