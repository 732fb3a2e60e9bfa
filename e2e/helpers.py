"""What the e2e tests share: the cluster handle (a kind cluster), waits, diagnostics.

Why: the tests talk to the cluster three ways (the Kubernetes API, the pods' own ports, and the
container runtime inside the kind node) and need the same few tools (kubectl, helm, a wait with a
deadline). They live here, behind one `Cluster` object, so that a test reads as what it checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import urllib3
from kubernetes import client, config

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[1]
# The images pods run: built by `make image` and loaded into the kind node by e2e/kind/up.sh.
IMAGE = os.environ.get("E2E_IMAGE", "txnkeeper:e2e")
VERIFIER_IMAGE = os.environ.get("E2E_VERIFIER_IMAGE", "txnkeeper-verifier:e2e")
Obj = dict[str, Any]


def cache_dir() -> Path:
    """The Makefile-owned cache: binaries built from the Go module proxy live there."""
    return Path(os.environ.get("CACHE_DIR", str(Path.home() / ".cache" / "txnkeeper")))


def state_dir() -> Path:
    """Per-checkout state written by e2e/kind/up.sh (kubeconfig, whether pods are routed)."""
    return Path(os.environ.get("E2E_STATE_DIR", str(REPO_ROOT / "e2e" / ".state"))).resolve()


def k8s_version() -> str:
    """The pinned Kubernetes release, read from the wrapper module so there is one source of truth."""
    for line in (REPO_ROOT / "e2e" / "k8s" / "go.mod").read_text().splitlines():
        if line.startswith("require k8s.io/kubernetes v"):
            return line.split()[-1].removeprefix("v")
    raise RuntimeError("e2e/k8s/go.mod does not require k8s.io/kubernetes")


def k8s_bin_dir() -> Path:
    return cache_dir() / "k8s" / f"v{k8s_version()}" / "bin"


# Pod Security Admission "restricted" (enforced on every test namespace, see conftest.py): what a pod and
# its containers must say to be admitted. The operator's own pods say the same (builders.py); the tests'
# pods use these.
RESTRICTED_POD: Obj = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER: Obj = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
# /tmp for the test pods' Python (the root filesystem is read-only).
TMP_VOLUME: Obj = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT: Obj = {"name": "tmp", "mountPath": "/tmp"}


class ConditionTimeout(AssertionError):
    pass


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.25,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll `probe` until it returns something truthy; on timeout say what was last seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            seen = describe() if describe else repr(last)
            raise ConditionTimeout(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {seen}")
        time.sleep(interval)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def http_post(
    url: str, body: Obj | None = None, timeout: float = 5.0, token: str | None = None
) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


@dataclass
class Cluster:
    kind: str  # what runs the pods: "kind" (the only cluster the suite runs on)
    kubeconfig: Path
    api: client.ApiClient
    containers_seen: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def pods_routed(self) -> bool:
        """Whether pod IPs are reachable from here (e2e/kind/up.sh routes them when run as root)."""
        return (state_dir() / "kind.routed").exists()

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl, run again with back-off while the API server cannot be reached (see load_api);
        `create` is not, since it may have been done before the connection broke."""
        deadline = time.monotonic() + API_OUTAGE_S
        pause = 1.0
        while True:
            proc = _run([tool("kubectl"), *args], self.env(), input_text, check=False)
            unreachable = proc.returncode != 0 and _UNREACHABLE.search(proc.stderr)
            if not unreachable or "create" in args or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)  # back-off while the control plane restarts, not a synchronisation
            pause = min(pause * 2, 15.0)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([tool("helm"), *args], self.env(), None, check)

    # -- pods -----------------------------------------------------------------------------------
    def pod(self, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = to_json(self.api, self.core.read_namespaced_pod(name, namespace))
            return result
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    @contextlib.contextmanager
    def endpoint(self, namespace: str, pod: str, port: int) -> Iterator[str]:
        """`host:port` reaching the pod's port from this test process: the pod IP where this machine
        routes the pod network (e2e/kind/up.sh adds the route as root), else a kubectl port-forward."""
        if self.pods_routed:
            obj = self.pod(namespace, pod)
            assert obj is not None, f"pod {namespace}/{pod} not found"
            yield f"{obj['status']['podIP']}:{port}"
            return
        proc = subprocess.Popen(
            [tool("kubectl"), "-n", namespace, "port-forward", f"pod/{pod}", f":{port}"],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> PORT"
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert m, f"kubectl port-forward said: {line!r}"
            yield f"127.0.0.1:{m.group(1)}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    # -- the container runtime (kind: containerd inside the node container) -----------------------
    def node_exec(self, *argv: str) -> str:
        """Run a command in the kind node container (`docker exec`): the container runtime's own view."""
        node = f"{os.environ.get('KIND_CLUSTER', 'txnkeeper-e2e')}-control-plane"
        return _run(["docker", "exec", node, *argv], dict(os.environ), None, True).stdout

    def container_id(self, namespace: str, pod: str, container: str) -> str:
        """The runtime's id of a running container (status.containerStatuses[].containerID)."""
        obj = self.pod(namespace, pod)
        assert obj is not None, f"pod {namespace}/{pod} not found"
        for cs in obj["status"].get("containerStatuses", []):
            if cs["name"] == container and "running" in cs.get("state", {}):
                return str(cs["containerID"]).partition("://")[2]
        raise AssertionError(f"no running container {container} in {namespace}/{pod}")

    def kill_container(self, namespace: str, pod: str, container: str) -> str:
        """SIGKILL a container through containerd (the runtime kills it, not a process of ours); its id."""
        cid = self.container_id(namespace, pod, container)
        self.node_exec("ctr", "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", cid)
        return cid

    def container_running(self, cid: str) -> bool:
        """Whether containerd still runs a task for container `cid`."""
        for line in self.node_exec("ctr", "-n", "k8s.io", "tasks", "ls").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == cid:
                return fields[-1] == "RUNNING"
        return False

    def record_containers(self, namespace: str) -> None:
        """Remember which container and image each pod of `namespace` ran (printed at the session's end:
        the proof that pods ran as containers of the images under test)."""
        for pod in self.core.list_namespaced_pod(namespace).items:
            status = to_json(self.api, pod.status) or {}
            for cs in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
                if cs.get("containerID"):
                    self.containers_seen.append(
                        f"{namespace}/{name_of(pod)}/{cs['name']}: {cs['containerID']} "
                        f"image {cs.get('image')} {cs.get('imageID')}"
                    )

    def control_plane_restarts(self) -> list[str]:
        """Restarts of the node container and of kube-system's containers since the cluster was created:
        printed at the session's end, so a run on a control plane that restarted under it says so."""
        node = f"{os.environ.get('KIND_CLUSTER', 'txnkeeper-e2e')}-control-plane"
        seen = _run(["docker", "inspect", "-f", "{{.RestartCount}}", node], dict(os.environ), None, False)
        lines = [f"node container {node}: restarts {seen.stdout.strip() or seen.stderr.strip()}"]
        for pod in self.core.list_namespaced_pod("kube-system").items:
            status = to_json(self.api, pod.status) or {}
            for cs in status.get("containerStatuses", []):
                if cs.get("restartCount"):
                    last = cs.get("lastState", {}).get("terminated", {})
                    lines.append(
                        f"kube-system/{name_of(pod)}/{cs['name']}: restarts {cs['restartCount']}, last "
                        f"{last.get('reason')} exit {last.get('exitCode')} at {last.get('finishedAt')}"
                    )
        return lines

    def pod_logs(self, namespace: str, pod: str) -> str:
        """A pod's container output, from the kubelet through the API."""
        try:
            text: str = self.core.read_namespaced_pod_log(pod, namespace, tail_lines=80)
            return text
        except client.ApiException as e:
            return f"(logs unavailable: {e.reason})"

    def diagnostics(self, namespace: str) -> str:
        """Pods, events and logs of a namespace: printed when a test fails."""
        out = [self.kubectl("-n", namespace, "get", "all,pvc,events", "-o", "wide", check=False).stdout]
        for pod in self.core.list_namespaced_pod(namespace).items:
            status = json.dumps(to_json(self.api, pod.status))[:3000]
            out.append(f"=== pod {name_of(pod)} status: {status}")
            out.append(self.pod_logs(namespace, name_of(pod)))
        return "\n".join(out)


def pod_ready(pod: Obj | None) -> bool:
    if not pod:
        return False
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )


def tool(name: str) -> str:
    """kubectl comes from the pinned Kubernetes build; helm from the chart's build ($CACHE_DIR/bin)."""
    if os.environ.get(name.upper()):  # the Makefile exports HELM=$(CACHE_DIR)/bin/helm
        return os.environ[name.upper()]
    for candidate in (k8s_bin_dir() / name, cache_dir() / "bin" / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found (make k8s-bins builds kubectl; the chart's target builds helm)"
        )
    return found


# How long a client of the suite waits out an API server that cannot be reached (the retries of
# load_api add up to about this), and how kubectl says it could not reach it.
API_OUTAGE_S = 150.0
_UNREACHABLE = re.compile(
    r"Unable to connect to the server|connection refused|connection reset by peer|TLS handshake timeout"
    r"|http2: client connection lost|: EOF\b|the server is currently unable to handle the request"
)


def _run(
    argv: list[str], env: dict[str, str], input_text: str | None, check: bool
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv,
        env=env,
        input=input_text,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# The kubernetes client's API classes and models are annotated, its ApiClient methods and config
# functions are not: the casts below give the two whose results the tests use their real types.
def load_api(kubeconfig: Path) -> client.ApiClient:
    """A client of the cluster whose connections ride out a control-plane restart.

    When the kubelet restarts the API server of a one-node kind control plane (a failed liveness
    probe on a loaded machine, or a test's fault), the port the engine publishes resets connections
    for about a minute. urllib3's default is three retries with no pause, all spent within a
    millisecond, so the test that happened to ask failed. Here a refused or reset connection is
    retried with back-off for about API_OUTAGE_S; once a request was sent, only idempotent methods are
    retried (urllib3's default set), so a create is never sent twice.
    """
    configuration = client.Configuration()
    configuration.retries = urllib3.Retry(total=10, connect=10, read=10, backoff_factor=0.5, backoff_max=30)
    new_client = cast(Callable[..., client.ApiClient], config.new_client_from_config)
    return new_client(config_file=str(kubeconfig), client_configuration=configuration)


def api_ready(api: client.ApiClient) -> bool:
    """Whether the API server serves a read from its storage here (any error: not yet)."""
    try:
        client.CoreV1Api(api).list_namespace(limit=1, _request_timeout=10)
    except Exception:  # any failure to answer means "not ready", which the caller waits out
        return False
    return True


def to_json(api: client.ApiClient, obj: object) -> Any:
    """The JSON form of a model object (or list, or None) as the API server sends it: camelCase keys."""
    sanitize = cast(Callable[[object], Any], api.sanitize_for_serialization)
    return sanitize(obj)


class _Named(Protocol):
    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def name_of(obj: _Named) -> str:
    """metadata.name of an object read from the API server (always set there; Optional in the models)."""
    assert obj.metadata is not None and obj.metadata.name is not None, obj
    return obj.metadata.name
