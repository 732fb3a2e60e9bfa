"""What the e2e tests share: the cluster handle (local control plane or kind), waits, diagnostics.

Why: the same tests run on the local control plane and on kind. The few things that differ (how a test
reaches a pod's port, where container logs come from, which kubectl/helm binary to run) live here,
behind one `Cluster` object, so the tests themselves never branch on the cluster kind.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from kubernetes import client, config

from e2e.localcluster.config import REPO_ROOT, Layout, cache_dir, k8s_bin_dir, state_dir

T = TypeVar("T")
# The image pods use: ignored on the local node (commands run from the venv), loaded into kind by
# e2e/kind/up.sh.
IMAGE = os.environ.get("E2E_IMAGE", "txnkeeper:e2e")
VERIFIER_IMAGE = os.environ.get("E2E_VERIFIER_IMAGE", "txnkeeper-verifier:e2e")
Obj = dict[str, Any]


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


def http_post(url: str, body: Obj | None = None, timeout: float = 5.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


@dataclass
class Cluster:
    kind: str  # "local" or "kind"
    kubeconfig: Path
    api: client.ApiClient

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

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run([tool("kubectl"), *args], self.env(), input_text, check)

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
        """`host:port` reaching the pod's port from this test process: the pod IP on the local node
        (pods are local processes on 127.0.0.x), a kubectl port-forward on kind."""
        if self.kind == "local":
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

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The local process behind a container (local node only: containerID is local://PID)."""
        assert self.kind == "local", "process ids exist only on the local node"
        obj = self.pod(namespace, pod)
        assert obj is not None
        for cs in obj["status"].get("containerStatuses", []):
            if cs["name"] == container and cs.get("containerID", "").startswith("local://"):
                return int(cs["containerID"].removeprefix("local://"))
        raise AssertionError(f"no running container {container} in {namespace}/{pod}")

    def pod_logs(self, namespace: str, pod: str) -> str:
        """Container output: the node agent's log files locally, the API (kubelet) on kind."""
        if self.kind == "local":
            obj = self.pod(namespace, pod)
            if obj is None:
                return "(pod gone)"
            pod_dir = Layout(state_dir()).pods / obj["metadata"]["uid"] / "logs"
            parts = [
                f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                for p in sorted(pod_dir.glob("*.log"))
            ]
            return "\n".join(parts) or "(no logs)"
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


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


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
    new_client = cast(Callable[..., client.ApiClient], config.new_client_from_config)
    return new_client(config_file=str(kubeconfig))


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
