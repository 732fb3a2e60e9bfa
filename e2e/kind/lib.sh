# Shared by the image and kind scripts (sourced, not run): where things live, which Debian mirror to
# use, and a stamp per locally built image so that a warm run skips what its inputs have not changed.
# shellcheck shell=bash
CACHE_DIR=${CACHE_DIR:-$HOME/.cache/txnkeeper}
KIND_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$KIND_DIR/../.." && pwd)
STAMPS=$CACHE_DIR/docker/stamps
SUITE=bookworm
# Kubernetes release of the node image: the one the wrapper module pins (the same as the API server
# the operator's unit tests run against).
K8S_VERSION=$(sed -n 's/^require k8s\.io\/kubernetes v//p' "$REPO_ROOT/e2e/k8s/go.mod")
# Where e2e/scripts/build-k8s.sh puts that release's binaries (kubectl among them).
K8S_BIN=$CACHE_DIR/k8s/v$K8S_VERSION/bin

# Each line also goes to $E2E_SETUP_LOG when set (`make e2e` sets it): when the cluster cannot be set
# up, the test digest at the end of `make test` shows why from there.
log() {
    local line
    line="$(basename "$0"): $*"
    echo "$line" >&2
    if [[ -n ${E2E_SETUP_LOG:-} ]]; then echo "$line" >>"$E2E_SETUP_LOG"; fi
}

# mmdebstrap's mirror arguments: this machine's own Debian sources when it is Debian $SUITE (they may
# point at a snapshot or a local mirror that is the only one reachable), else deb.debian.org.
debian_mirrors() {
    local f found=0
    if grep -qs "VERSION_CODENAME=$SUITE" /etc/os-release; then
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
            [[ -f $f ]] && grep -qs "debian" "$f" && grep -qsE "^(deb |Types:)" "$f" && echo "$f" && found=1
        done
    fi
    if ((!found)); then
        echo "deb http://deb.debian.org/debian $SUITE main"
        echo "deb http://deb.debian.org/debian $SUITE-updates main"
        echo "deb http://deb.debian.org/debian-security $SUITE-security main"
    fi
}

# A customize hook that gives a rootfs this machine's extra CA certificates (an egress proxy that
# intercepts TLS signs with one) and pip configuration, so pip and curl inside work as they do here.
HOST_TRUST_HOOK='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"; fi
chroot "$1" update-ca-certificates >/dev/null 2>&1 || true
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$1/etc/pip.conf"; fi'

# A Debian rootfs (mmdebstrap, minbase + packages) imported as image $1; the rest are docker import
# --change options followed by `--` and the packages.
debian_image() {
    local tag=$1
    shift
    local changes=() packages
    while [[ $1 != -- ]]; do
        changes+=(-c "$1")
        shift
    done
    shift
    packages=$(
        IFS=,
        echo "$*"
    )
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        if [[ $(id -u) != 0 ]]; then
            log "building $tag needs mmdebstrap (Debian package mmdebstrap); install it, or run as root"
            return 1
        fi
        log "installing Debian's mmdebstrap with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null ||
            { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null; }
    fi
    local mirrors=()
    mapfile -t mirrors < <(debian_mirrors)
    log "building $tag: Debian $SUITE rootfs with $packages (mmdebstrap)"
    mkdir -p "$CACHE_DIR/logs"
    # As Debian's -slim images: no Recommends, no documentation or translations (dpkg excludes them),
    # and /usr merged by mmdebstrap's hook (the usrmerge package would pull in all of Perl).
    nice -n 10 mmdebstrap --quiet --variant=minbase --include="$packages" \
        --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook="$HOST_TRUST_HOOK" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
        "$SUITE" - "${mirrors[@]}" 2>"$CACHE_DIR/logs/mmdebstrap.log" |
        docker import "${changes[@]}" - "$tag" >/dev/null || {
        log "building $tag failed; mmdebstrap said:"
        tail -20 "$CACHE_DIR/logs/mmdebstrap.log" >&2
        return 1
    }
}

# Whether image $1 exists and was built from inputs hashing to $2 (the stamp written by mark_built).
built_from() {
    [[ -f $STAMPS/${1//[\/:]/_} && $(cat "$STAMPS/${1//[\/:]/_}") == "$2" ]] &&
        docker image inspect "$1" >/dev/null 2>&1
}
mark_built() {
    mkdir -p "$STAMPS"
    echo "$2" >"$STAMPS/${1//[\/:]/_}"
}
inputs_hash() { cat "$@" | sha256sum | cut -c1-32; }
# The source directory of module@version in the Go module cache (downloaded if needed).
module_dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
# The stamp of a debian_image build: how it builds (the function itself and the trust hook), what it
# installs, and this machine's CAs and pip configuration (the image carries them). Not all of lib.sh:
# an unrelated edit here must not rebuild a base every image layer sits on.
debian_recipe() {
    { declare -f debian_image debian_mirrors; echo "$HOST_TRUST_HOOK $*"; cat /etc/pip.conf \
        /usr/local/share/ca-certificates/*.crt 2>/dev/null; } | sha256sum | cut -c1-32
}
