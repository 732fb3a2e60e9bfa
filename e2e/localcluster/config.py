"""Where the local cluster keeps its state, and the facts every component needs to find each other.

Why a module of its own: the CLI, the node agent and the pytest fixtures all read the same state
directory (certificates, kubeconfigs, pid files, volumes), so its layout is defined once, here.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = REPO_ROOT / "e2e"
NODE_NAME = "local-node"
STORAGE_CLASS = "local-path"
PROVISIONER_NAME = "txnkeeper.io/local-path"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def cache_dir() -> Path:
    """The Makefile-owned cache (binaries built from the Go module proxy live there)."""
    return Path(os.environ.get("CACHE_DIR", str(Path.home() / ".cache" / "txnkeeper")))


def state_dir() -> Path:
    """Per-checkout state: two checkouts on one machine never share a cluster by accident."""
    return Path(os.environ.get("E2E_STATE_DIR", str(E2E_DIR / ".state"))).resolve()


def k8s_version() -> str:
    """The pinned Kubernetes release, read from the wrapper module so there is one source of truth."""
    for line in (E2E_DIR / "k8s" / "go.mod").read_text().splitlines():
        if line.startswith("require k8s.io/kubernetes v"):
            return line.split()[-1].removeprefix("v")
    raise RuntimeError("e2e/k8s/go.mod does not require k8s.io/kubernetes")


def k8s_bin_dir() -> Path:
    return cache_dir() / "k8s" / f"v{k8s_version()}" / "bin"


def venv_bin_dir() -> Path:
    """Pods' commands resolve here first: images are ignored, the repo's venv stands in for them."""
    return REPO_ROOT / ".venv" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Layout:
    """Paths inside the state directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def kubeconfig(self, user: str) -> Path:
        return self.root / "kubeconfigs" / f"{user}.kubeconfig"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"


@dataclass
class ClusterInfo:
    """What `up` decided (ports) and started (pids); written to cluster.json for `down` and the tests."""

    version: str
    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    pod_subnet: int = 0  # pod IPs are 127.0.<pod_subnet>.2-254 (see claim_pod_subnet)
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ClusterInfo:
        return cls(**json.loads(path.read_text()))


SUBNET_CLAIMS = Path("/tmp/txnkeeper-e2e-pod-subnets")


def claim_pod_subnet(state: Path) -> int:
    """A /24 of 127/8 for this cluster's pod IPs that no other running local cluster uses.

    Several checkouts (a CI clone next to a developer's tree) may run clusters at once; their pods bind
    port 8080 on their pod IPs, so two clusters must never hand out the same address. A claim is a
    symlink SUBNET_CLAIMS/<n> -> state dir (created atomically); a claim whose state dir is gone or
    belongs to a stopped cluster is taken over.
    """
    SUBNET_CLAIMS.mkdir(parents=True, exist_ok=True)
    for n in range(255):
        link = SUBNET_CLAIMS / str(n)
        try:
            link.symlink_to(state)
            return n
        except FileExistsError:
            owner = Path(os.readlink(link))
            if owner == state or not (owner / "pids" / "kube-apiserver.pid").exists():
                link.unlink(missing_ok=True)
                try:
                    link.symlink_to(state)
                    return n
                except FileExistsError:
                    continue
    raise RuntimeError(f"no free pod subnet in 127.0.0.0/16 ({SUBNET_CLAIMS} is full)")


def release_pod_subnet(state: Path) -> None:
    if not SUBNET_CLAIMS.exists():
        return
    for link in SUBNET_CLAIMS.iterdir():
        if link.is_symlink() and Path(os.readlink(link)) == state:
            link.unlink(missing_ok=True)
