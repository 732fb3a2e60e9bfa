"""Start and stop the local control plane: etcd, kube-apiserver, controller-manager, scheduler, node agent.

Why this shape: every component is the real upstream binary (the API server, admission, RBAC, the
StatefulSet/Job/PV controllers and the scheduler are what the operator meets on any cluster); only the
kubelet is replaced, by e2e/localcluster/nodeagent.py, because pods here are local processes.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import pki
from .config import (
    NODE_NAME,
    PROVISIONER_NAME,
    REPO_ROOT,
    SERVICE_ACCOUNT_ISSUER,
    SERVICE_CIDR,
    STORAGE_CLASS,
    ClusterInfo,
    Layout,
    claim_pod_subnet,
    free_port,
    k8s_bin_dir,
    k8s_version,
    release_pod_subnet,
    state_dir,
)
from .procs import exit_error, read_pidfile, spawn, stop, wait_until

# Stop order: the node agent first (it stops the pods), the API server and etcd last.
COMPONENTS = ["node-agent", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]


def log(msg: str) -> None:
    print(f"[localcluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Https:
    """Tiny HTTPS client with a client certificate: health endpoints and bootstrap objects."""

    def __init__(self, layout: Layout, server: str, user: str = "admin") -> None:
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(layout.pki / f"{user}.crt"), str(layout.pki / f"{user}.key"))

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            return 0, str(e)

    def ok(self, path: str) -> bool:
        return self.request("GET", path)[0] == 200


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise RuntimeError("etcd is not installed: run `make cluster-deps` (apt-get install etcd-server)")
    return found


def k8s_binary(name: str) -> str:
    path = k8s_bin_dir() / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run `make k8s-bins` (builds Kubernetes {k8s_version()})")
    return str(path)


def is_up(layout: Layout | None = None) -> bool:
    """True when cluster.json exists and its API server answers /readyz."""
    layout = layout or Layout(state_dir())
    if not layout.cluster_file.exists() or read_pidfile(layout.pids / "kube-apiserver.pid") is None:
        return False
    info = ClusterInfo.load(layout.cluster_file)
    return Https(layout, info.server).ok("/readyz")


def up(timeout: float = 180.0) -> ClusterInfo:
    """Start everything (idempotent: an already running cluster is left as it is)."""
    layout = Layout(state_dir())
    if is_up(layout):
        log(f"already up ({layout.admin_kubeconfig})")
        return ClusterInfo.load(layout.cluster_file)
    down(quiet=True)  # a half-started or crashed cluster: start clean
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        k8s_binary(name)  # fail before starting anything
    etcd_binary()
    try:
        return _up(layout, timeout)
    except BaseException:
        log("start failed; stopping what was started (logs kept in the state directory)")
        down(quiet=True, purge=False)
        raise


def _up(layout: Layout, timeout: float) -> ClusterInfo:
    started = time.monotonic()
    layout.root.mkdir(parents=True, exist_ok=True)
    for d in (layout.logs, layout.pids, layout.pods, layout.volumes):
        d.mkdir(parents=True, exist_ok=True)
    pki.generate(layout)
    info = ClusterInfo(
        version=k8s_version(),
        etcd_client_port=free_port(),
        etcd_peer_port=free_port(),
        apiserver_port=free_port(),
        controller_manager_port=free_port(),
        scheduler_port=free_port(),
        pod_subnet=claim_pod_subnet(layout.root),
    )
    pki.write_kubeconfigs(layout, info.server)
    info.save(layout.cluster_file)
    p = layout.pki

    etcd_url = f"http://127.0.0.1:{info.etcd_client_port}"
    info.pids["etcd"] = spawn(
        "etcd",
        [
            etcd_binary(),
            "--name=local",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{info.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{info.etcd_peer_port}",
            f"--initial-cluster=local=http://127.0.0.1:{info.etcd_peer_port}",
            # etcd's default 2 GiB quota and fsync-per-commit are fine; keep history short for a test cluster.
            "--auto-compaction-retention=1",
            "--log-level=warn",
        ],
        layout.logs,
        layout.pids,
    )
    wait_until(
        lambda: _http_ok(f"{etcd_url}/health"),
        "etcd /health",
        60,
        alive=exit_error("etcd", info.pids["etcd"], layout.logs),
    )
    log(f"etcd up ({etcd_url})")

    info.pids["kube-apiserver"] = spawn(
        "kube-apiserver",
        [
            k8s_binary("kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={info.apiserver_port}",
            f"--cert-dir={p}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            # Endpoints may not hold loopback addresses, and nothing routes the `kubernetes` Service VIP
            # here anyway (no kube-proxy): pods get KUBERNETES_SERVICE_HOST=127.0.0.1 from the node agent.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ],
        layout.logs,
        layout.pids,
    )
    api = Https(layout, info.server)
    wait_until(
        lambda: api.ok("/readyz"),
        "kube-apiserver /readyz",
        timeout,
        alive=exit_error("kube-apiserver", info.pids["kube-apiserver"], layout.logs),
    )
    info.save(layout.cluster_file)
    log(f"kube-apiserver up ({info.server})")
    _bootstrap(api)

    info.pids["kube-controller-manager"] = spawn(
        "kube-controller-manager",
        [
            k8s_binary("kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            f"--authentication-kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            f"--authorization-kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={info.controller_manager_port}",
            f"--cert-dir={p / 'kcm-serving'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--v=1",
        ],
        layout.logs,
        layout.pids,
    )
    info.pids["kube-scheduler"] = spawn(
        "kube-scheduler",
        [
            k8s_binary("kube-scheduler"),
            f"--kubeconfig={layout.kubeconfig('kube-scheduler')}",
            f"--authentication-kubeconfig={layout.kubeconfig('kube-scheduler')}",
            f"--authorization-kubeconfig={layout.kubeconfig('kube-scheduler')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={info.scheduler_port}",
            f"--cert-dir={p / 'scheduler-serving'}",
            "--leader-elect=false",
            "--v=1",
        ],
        layout.logs,
        layout.pids,
    )
    info.pids["node-agent"] = spawn(
        "node-agent",
        [sys.executable, "-m", "e2e.localcluster.nodeagent", "--state-dir", str(layout.root)],
        layout.logs,
        layout.pids,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
    )
    info.save(layout.cluster_file)
    for name, port in (
        ("kube-controller-manager", info.controller_manager_port),
        ("kube-scheduler", info.scheduler_port),
    ):
        wait_until(
            lambda port=port: _https_ok_insecure(f"https://127.0.0.1:{port}/healthz"),  # type: ignore[misc]
            f"{name} /healthz",
            timeout,
            alive=exit_error(name, info.pids[name], layout.logs),
        )
    wait_until(
        lambda: _node_ready(api),
        f"node {NODE_NAME} Ready",
        timeout,
        alive=exit_error("node-agent", info.pids["node-agent"], layout.logs),
    )
    # Pods cannot be created before the ServiceAccount controller made the namespace's default account.
    wait_until(
        lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
        "the default ServiceAccount",
        timeout,
        alive=exit_error("kube-controller-manager", info.pids["kube-controller-manager"], layout.logs),
    )
    log(f"cluster up in {time.monotonic() - started:.1f} s; KUBECONFIG={layout.admin_kubeconfig}")
    return info


def down(quiet: bool = False, purge: bool = True) -> None:
    """Stop every component (pods first) and, by default, delete the cluster's state."""
    layout = Layout(state_dir())
    for name in COMPONENTS:
        # The node agent stops pods on SIGTERM (each with its grace period): give it time.
        if stop(layout.pids / f"{name}.pid", grace=60.0 if name == "node-agent" else 20.0) and not quiet:
            log(f"stopped {name}")
    # Pods of a node agent that died without cleaning up (kill -9): their pid files remain.
    for pidfile in sorted(layout.pods.glob("*/pids/*.pid")) if layout.pods.exists() else []:
        if stop(pidfile, grace=5.0) and not quiet:
            log(f"stopped leftover pod process {pidfile}")
    release_pod_subnet(layout.root)
    if purge and layout.root.exists():
        _unmount_all(layout.root)
        shutil.rmtree(layout.root)
        if not quiet:
            log(f"removed {layout.root}")


def _unmount_all(root: Path) -> None:
    """Pods mount in private namespaces, so nothing should be mounted here; refuse to rm through one."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    for line in mounts:
        target = line.split()[1]
        if target.startswith(str(root) + "/"):
            raise RuntimeError(f"{target} is still mounted; not deleting {root}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _https_ok_insecure(url: str) -> bool:
    # The controller-manager and scheduler serve /healthz with self-signed certificates.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _node_ready(api: Https) -> bool:
    code, body = api.request("GET", f"/api/v1/nodes/{NODE_NAME}")
    if code != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _bootstrap(api: Https) -> None:
    """Cluster objects a real cluster's installer would create: a default StorageClass and its
    provisioner's RBAC (the node agent provisions PersistentVolumes as local directories)."""
    objects: list[tuple[str, dict[str, object]]] = [
        (
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": PROVISIONER_NAME,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
            },
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "txnkeeper:local-path-provisioner"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["persistentvolumes"],
                        "verbs": ["get", "list", "watch", "create", "delete", "patch", "update"],
                    },
                    {
                        "apiGroups": [""],
                        "resources": ["persistentvolumeclaims"],
                        "verbs": ["get", "list", "watch", "update", "patch"],
                    },
                    {
                        "apiGroups": ["storage.k8s.io"],
                        "resources": ["storageclasses"],
                        "verbs": ["get", "list", "watch"],
                    },
                    {
                        "apiGroups": ["", "events.k8s.io"],
                        "resources": ["events"],
                        "verbs": ["create", "patch"],
                    },
                ],
            },
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "txnkeeper:local-path-provisioner"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "txnkeeper:local-path-provisioner",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "system:txnkeeper:local-path-provisioner",
                    }
                ],
            },
        ),
    ]
    for path, obj in objects:
        code, body = api.request("POST", path, obj)
        if code not in (201, 409):
            raise RuntimeError(f"creating {path}: HTTP {code}: {body}")
