"""Real ``txnkeeper serve`` processes for integration tests: start, wait ready, kill, restart.

Ports are ephemeral (port 0, reported through --ports-file); readiness is awaited by polling the
admin API's /ready with a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import load_cluster_secret
from txnkeeper.protocol.rpc import RpcConnection, connect

TOKEN = "test-admin-token"
READY_TIMEOUT = 30.0


class ServePod:
    def __init__(
        self,
        workdir: Path,
        name: str,
        role: str,
        *,
        release: str = "2.0.0",
        config: dict[str, Any] | None = None,
        extra: list[str] | None = None,
        secret: bool = True,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.role = role
        self.release = release
        self.data_dir = workdir / name / "data"
        self.ports_file = workdir / name / "ports.json"
        self.log_path = workdir / name / "serve.log"
        self.token_file = workdir / "token"
        # One per test's pods, shared by coordinator and store pods (as the operator's Secret is).
        self.secret_file = workdir / "cluster-secret"
        self.secret = secret
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = workdir / name / "config.json"
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(json.dumps(config))
        self.extra = extra or []
        self.process: subprocess.Popen[bytes] | None = None
        self.listen = ""
        self.admin = ""
        self._fixed_listen: str | None = None

    def start(self, *, wait: bool = True) -> ServePod:
        self.token_file.write_text(TOKEN)
        self.token_file.chmod(0o600)  # serve refuses a token file others can read
        if self.secret and not self.secret_file.exists():
            self.secret_file.write_text(secrets.token_urlsafe(32))
            self.secret_file.chmod(0o600)  # serve refuses a secret file others can read
        self.ports_file.parent.mkdir(parents=True, exist_ok=True)
        self.ports_file.unlink(missing_ok=True)
        # Keep the client port stable across restarts (clients and coordinators remember it).
        listen = self._fixed_listen or "127.0.0.1:0"
        cmd = [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "serve",
            "--role",
            self.role,
            "--data-dir",
            str(self.data_dir),
            "--release",
            self.release,
            "--listen",
            listen,
            "--admin-listen",
            "127.0.0.1:0",
            "--pod-name",
            self.name,
            "--ports-file",
            str(self.ports_file),
            "--admin-token-file",
            str(self.token_file),
            *(["--cluster-secret-file", str(self.secret_file)] if self.secret else []),
            *(["--config", str(self.config_path)] if self.config_path else []),
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXNKEEPER_")}
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pod {self.name} exited with {self.process.returncode}:\n{self.log()}")
            if self.ports_file.exists():
                ports = json.loads(self.ports_file.read_text())
                self.listen, self.admin = ports["listen"], ports["admin"]
                self._fixed_listen = self.listen
                try:
                    with urllib.request.urlopen(f"http://{self.admin}/ready", timeout=2) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"pod {self.name} not ready within {timeout}s:\n{self.log()}")

    def rss_bytes(self) -> int:
        """The process's resident set size, from /proc."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pod {self.name}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin_url(self) -> str:
        return f"http://{self.admin}"

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def restart(self) -> ServePod:
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def pod_metric(pod: ServePod, name: str, labels: str = "") -> float | None:
    """The value of sample ``name{labels}`` on the pod's /metrics now, or None when it has none."""
    status, text = http("GET", f"{pod.admin_url()}/metrics")
    assert status == 200
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" ([0-9.e+]+)"
    found = re.search(r"^" + pattern + "$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def pod_gauge(pod: ServePod, name: str, labels: str = "") -> float:
    """``pod_metric``, a sample not exported yet read as 0 (a counter or gauge nothing moved)."""
    value = pod_metric(pod, name, labels)
    return 0.0 if value is None else value


def http(
    method: str, url: str, body: object = None, token: str | None = None, *, timeout: float = 10.0
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        status = exc.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


async def coordinator_connection(store: ServePod) -> RpcConnection:
    """A connection to ``store`` authenticated the way a coordinator pod does it (with the secret)."""
    secret = load_cluster_secret(store.secret_file)
    assert secret is not None
    conn = await connect(store.listen)
    challenge = api.Command()
    challenge.auth_challenge.SetInParent()
    nonce = (await conn.request(challenge, 10)).auth_nonce.nonce
    proof = api.Command()
    proof.authenticate.proof = secret.coordinator_proof(nonce)
    await conn.request(proof, 10)
    return conn


def started_pods(tmp_path: Path) -> Iterator[Callable[..., ServePod]]:
    """The ``pods`` fixtures' body: a factory of started pods under ``tmp_path``, each stopped after."""
    started: list[ServePod] = []

    def make(name: str, role: str, **kwargs: Any) -> ServePod:
        pod = ServePod(tmp_path, name, role, **kwargs)
        started.append(pod)
        return pod.start()

    yield make
    for pod in started:
        pod.stop()
