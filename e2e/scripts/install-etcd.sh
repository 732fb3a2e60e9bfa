#!/usr/bin/env bash
# Installs etcd from the Debian archive (package etcd-server) unless an etcd binary is already there.
# Why Debian's: it is the distribution's maintained build, so the control plane needs no download
# from outside the package mirrors; the API server only needs the etcd v3 API it provides.
set -euo pipefail
if command -v etcd >/dev/null 2>&1 || [[ -x /usr/bin/etcd ]]; then
    exit 0
fi
sudo=()
if [[ $(id -u) != 0 ]]; then sudo=(sudo); fi
echo "install-etcd: apt-get install etcd-server" >&2
"${sudo[@]}" apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends etcd-server >/dev/null
/usr/bin/etcd --version | head -1 >&2
