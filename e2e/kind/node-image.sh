#!/usr/bin/env bash
# The kind node image kindest/node:v<release>, assembled locally. Why not `kind build node-image`: it
# pulls etcd, CoreDNS, pause, kindnetd and local-path images and kind's base image from registries,
# none of which can be reached on the machines we run on. Every piece is built here instead:
#   rootfs     Debian (mmdebstrap): systemd, Debian's containerd and runc, CNI plugins, iptables
#   base       + kind's own files/ from the kind module source (e2e/kind/node/Dockerfile.base)
#   components registry.k8s.io images kubeadm asks for (`kubeadm config images list`), each one binary
#              of the Kubernetes build or e2e/kind/components.sh on scratch (kube-proxy on the rootfs,
#              which has iptables and conntrack), plus local-path-provisioner and its helper
#   node       + kubeadm, kubelet, kubectl, containerd config, bridge CNI (e2e/kind/node/Dockerfile);
#              run once, privileged, to import the component images into its containerd; committed.
# A stamp over every input (scripts, node files, binaries' stamps) makes a warm run one hash.
#
# Usage: node-image.sh   print the node image's name (building it if needed)
set -euo pipefail
# shellcheck source=e2e/kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
NODE_IMAGE=kindest/node:v$K8S_VERSION
ROOTFS=txnkeeper/kind-rootfs:$SUITE
BASE=txnkeeper/kind-base:$SUITE
K8S_BIN=$(bash "$REPO_ROOT/e2e/scripts/build-k8s.sh")
COMP_BIN=$(bash "$KIND_DIR/components.sh")
KIND_SRC=$(GOMODCACHE=$CACHE_DIR/go/mod GOFLAGS=-modcacherw module_dir "sigs.k8s.io/kind@$("$COMP_BIN/kind" version | awk '{print $2}')")
LPP_IMAGE=txnkeeper.local/local-path-provisioner:$(cut -d' ' -f1 "$COMP_BIN/.local-path-provisioner")
HELPER_IMAGE=txnkeeper.local/local-path-helper:$SUITE
eval "$(bash "$KIND_DIR/engine.sh" up)"
export DOCKER_HOST

stamp=$(inputs_hash "${BASH_SOURCE[0]}" "$KIND_DIR/lib.sh" "$KIND_DIR/runc-nosysres" "$KIND_DIR"/node/* \
    "$K8S_BIN/.stamp" "$COMP_BIN"/.[a-z]*)
if built_from "$NODE_IMAGE" "$stamp"; then
    echo "$NODE_IMAGE"
    exit 0
fi
start=$SECONDS
work=$(mktemp -d)
trap 'docker rm -f txnkeeper-node-build >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# 1. rootfs (the slow part, 2-3 min: kept under its own stamp)
packages=(systemd systemd-sysv dbus conntrack iptables nftables iproute2 ethtool util-linux mount kmod
    libseccomp2 pigz fuse-overlayfs bash ca-certificates curl jq procps containerd runc
    containernetworking-plugins)
rootfs_stamp=$(debian_recipe "${packages[@]}")
if ! built_from "$ROOTFS" "$rootfs_stamp"; then
    debian_image "$ROOTFS" 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -- "${packages[@]}"
    mark_built "$ROOTFS" "$rootfs_stamp"
fi

# 2. kind's base
mkdir -p "$work/base"
cp -r "$KIND_SRC/images/base/files" "$work/base/files"
chmod -R u+w "$work/base"
cp "$KIND_DIR/node/Dockerfile.base" "$work/base/Dockerfile"
docker build -q --build-arg "ROOTFS=$ROOTFS" -t "$BASE" "$work/base" >/dev/null

# 3. component images. kubeadm names them; each maps to a binary we built.
images=()
component() { # component IMAGE BINARY [ENTRYPOINT] [FROM]
    local image=$1 binary=$2 entry=${3:-} from=${4:-scratch} dir
    dir=$work/img-$(basename "$binary")-${#images[@]}
    mkdir -p "$dir"
    cp "$binary" "$dir/"
    {
        echo "FROM $from"
        echo "COPY $(basename "$binary") /usr/local/bin/$(basename "$binary")"
        echo "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        [[ -n $entry ]] && echo "ENTRYPOINT [\"/usr/local/bin/$(basename "$binary")\"]"
    } >"$dir/Dockerfile"
    docker build -q -t "$image" "$dir" >/dev/null
    images+=("$image")
}
while read -r image; do
    name=${image##*/}
    name=${name%%:*}
    case $name in
    kube-apiserver | kube-controller-manager | kube-scheduler) component "$image" "$K8S_BIN/$name" ;;
    kube-proxy) component "$image" "$K8S_BIN/kube-proxy" "" "$ROOTFS" ;;
    etcd) component "$image" "$COMP_BIN/etcd" ;;
    coredns) component "$image" "$COMP_BIN/coredns" entry ;;
    pause)
        component "$image" "$COMP_BIN/pause" entry
        # kind's containerd configuration names pause:3.10 as the sandbox image; kubeadm may ask for a
        # newer tag. One binary serves both.
        docker tag "$image" registry.k8s.io/pause:3.10 && images+=(registry.k8s.io/pause:3.10)
        ;;
    *)
        log "kubeadm asks for $image, which this script does not know how to build"
        exit 1
        ;;
    esac
done < <("$K8S_BIN/kubeadm" config images list --kubernetes-version "v$K8S_VERSION" 2>/dev/null)
component "$LPP_IMAGE" "$COMP_BIN/local-path-provisioner"
docker tag "$ROOTFS" "$HELPER_IMAGE" && images+=("$HELPER_IMAGE")

# 4. the node: binaries and configuration, then the component images imported into its containerd
mkdir -p "$work/node"
cp "$KIND_DIR"/node/{Dockerfile,containerd.toml,10-bridge.conflist,pin-host-sysctls.service} "$work/node/"
sed -e "s|LPP_IMAGE|$LPP_IMAGE|g" -e "s|HELPER_IMAGE|$HELPER_IMAGE|g" "$KIND_DIR/node/default-storage.yaml" \
    >"$work/node/default-storage.yaml"
cp "$KIND_DIR/runc-nosysres" "$K8S_BIN/kubeadm" "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$work/node/"
docker build -q --build-arg "BASE=$BASE" --build-arg "K8S_VERSION=$K8S_VERSION" \
    -t "txnkeeper/kind-node-pre:v$K8S_VERSION" "$work/node" >/dev/null
docker rm -f txnkeeper-node-build >/dev/null 2>&1 || true
docker run -d --name txnkeeper-node-build --privileged --security-opt seccomp=unconfined \
    --tmpfs /tmp --tmpfs /run --volume /lib/modules:/lib/modules:ro \
    "txnkeeper/kind-node-pre:v$K8S_VERSION" >/dev/null
deadline=$((SECONDS + 120))
until docker exec txnkeeper-node-build ctr version >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
        log "containerd did not start in the node build container:"
        docker logs txnkeeper-node-build 2>&1 | tail -20 >&2
        exit 1
    fi
    sleep 1
done
docker save "${images[@]}" |
    docker exec -i txnkeeper-node-build ctr -n k8s.io images import --all-platforms --digests \
        --snapshotter=overlayfs - >/dev/null
# (Every name above carries its registry, so containerd lists it unchanged.)
missing=$(comm -23 <(printf '%s\n' "${images[@]}" | sort -u) \
    <(docker exec txnkeeper-node-build ctr -n k8s.io images ls -q | sort -u))
if [[ -n $missing ]]; then
    log "not imported into the node: $missing"
    exit 1
fi
docker stop -t 30 txnkeeper-node-build >/dev/null
docker commit txnkeeper-node-build "$NODE_IMAGE" >/dev/null
mark_built "$NODE_IMAGE" "$stamp"
log "built $NODE_IMAGE in $((SECONDS - start)) s ($(($(docker image inspect -f '{{.Size}}' "$NODE_IMAGE") / 1000000)) MB)"
echo "$NODE_IMAGE"
