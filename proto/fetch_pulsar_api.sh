#!/usr/bin/env bash
# Fetch Apache Pulsar's wire protocol definition (PulsarApi.proto) for `make proto`.
#
# Why from the Go module proxy: Maven's pulsar-common jar ships generated Java only, while the module
# github.com/apache/pulsar-client-go carries the .proto itself (pulsar/internal/pulsar_proto), and the
# proxy is reachable wherever `go` works. The zip is pinned by version and SHA-256 and cached in
# $CACHE_DIR, so a rebuild needs no network.
#
# One edit: `package pulsar.proto` becomes `package pulsar.api`. Pulsar compiles PulsarApi.proto and
# its storage protos (proto/PulsarTransactionMetadata.proto, proto/TransactionPendingAck.proto, both
# `pulsar.proto`) in separate modules; Python keeps them in one descriptor pool, where their shared
# names (Subscription, CommandAck) would clash. Package names never travel on the wire.
#
# usage: fetch_pulsar_api.sh VERSION SHA256 OUTPUT
set -euo pipefail
version=$1 sha=$2 out=$3
cache=${CACHE_DIR:-$HOME/.cache/txnkeeper}/pulsar-go
zip=$cache/pulsar-client-go-$version.zip
mkdir -p "$cache" "$(dirname "$out")"
if [[ ! -f $zip ]] || ! echo "$sha  $zip" | sha256sum -c --quiet - 2>/dev/null; then
  url=${GOPROXY_URL:-https://proxy.golang.org}/github.com/apache/pulsar-client-go/@v/$version.zip
  curl -fsSL --retry 3 -o "$zip.part" "$url" || {
    echo "fetch_pulsar_api.sh: could not download $url (the Go module proxy must be reachable once;" \
      "afterwards $zip is reused)" >&2
    exit 1
  }
  if ! echo "$sha  $zip.part" | sha256sum -c --quiet -; then
    echo "fetch_pulsar_api.sh: $url does not have the pinned SHA-256 $sha; refusing it" >&2
    rm -f "$zip.part"
    exit 1
  fi
  mv "$zip.part" "$zip"
fi
member=github.com/apache/pulsar-client-go@$version/pulsar/internal/pulsar_proto/PulsarApi.proto
unzip -p "$zip" "$member" | sed 's/^package pulsar\.proto;/package pulsar.api;/' >"$out.tmp"
grep -q '^package pulsar.api;' "$out.tmp" || {
  echo "fetch_pulsar_api.sh: $member has no 'package pulsar.proto;' line to rename" >&2
  exit 1
}
mv "$out.tmp" "$out"
