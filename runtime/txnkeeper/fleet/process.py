"""One runtime process of the local fleet: `txnkeeper serve` started, awaited, stopped, never leaked.

The local fleet plays the role of a StatefulSet's pods: a member has a stable name and data directory
(its "PV"), is (re)started at a release with a start-up config file, and is reached through its admin
API. Ports are chosen by the OS (port 0) and read back from --ports-file, so fleets never collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from txnkeeper.fleet.certificates import FleetCertificates

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ProcessStartError(RuntimeError):
    """The runtime process exited or never became ready; carries the tail of its log."""


def write_admin_token(path: Path, token: str) -> Path:
    """The admin token file members read, readable by its owner only (serve refuses any other)."""
    path.write_text(token)
    path.chmod(0o600)
    return path


@dataclass
class RuntimeProcess:
    name: str
    role: str
    data_dir: Path
    work_dir: Path
    release: str
    token_file: Path
    extra_args: list[str] = field(default_factory=list)
    # Port 0: the OS picks (read back from the ports file); the fleet pins ports that must survive restarts.
    listen: str = "127.0.0.1:0"
    admin_listen: str = "127.0.0.1:0"
    proc: subprocess.Popen[bytes] | None = None
    client_address: str | None = None
    admin_address: str | None = None
    # With certificates: TLS on every listener, this process's leaf issued by the fleet's CA.
    certificates: FleetCertificates | None = None

    @classmethod
    def in_work_dir(
        cls,
        work_dir: Path,
        name: str,
        role: str,
        *,
        token_file: Path,
        release: str,
        extra_args: tuple[str, ...] | list[str] = (),
        config: dict[str, object] | None = None,
    ) -> RuntimeProcess:
        """A member whose data directory is ``work_dir/name``, its start-up config file written
        (``config``, else empty: the defaults). Not started."""
        member = cls(
            name=name,
            role=role,
            data_dir=work_dir / name,
            work_dir=work_dir,
            release=release,
            token_file=token_file,
            extra_args=list(extra_args),
        )
        member.config_file.write_text(json.dumps(config or {}))
        return member

    @property
    def config_file(self) -> Path:
        return self.work_dir / f"{self.name}.config.json"

    @property
    def cluster_secret_file(self) -> Path:
        # Next to the admin token, which every member of one fleet shares: so is this secret.
        return self.token_file.parent / "cluster-secret"

    @property
    def log_file(self) -> Path:
        return self.work_dir / f"{self.name}.log"

    @property
    def ports_file(self) -> Path:
        return self.work_dir / f"{self.name}.ports.json"

    @property
    def admin_url(self) -> str:
        if self.admin_address is None:
            raise ProcessStartError(f"{self.name} is not running")
        return f"{self.scheme}://{self.admin_address}"

    @property
    def scheme(self) -> str:
        """The admin API's URL scheme."""
        return "https" if self.certificates is not None else "http"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
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
            self.listen,
            "--admin-listen",
            self.admin_listen,
            "--pod-name",
            self.name,
            "--admin-token-file",
            str(self.token_file),
            "--cluster-secret-file",
            str(self.cluster_secret_file),
            "--config",
            str(self.config_file),
            "--ports-file",
            str(self.ports_file),
            "--log-level",
            "WARNING",
            *(self.certificates.serve_flags(self.name) if self.certificates is not None else []),
            *self.extra_args,
        ]

    def start(self) -> None:
        if self.running():
            raise ProcessStartError(f"{self.name} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports_file.unlink(missing_ok=True)
        if not self.cluster_secret_file.exists():
            tmp = self.cluster_secret_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(secrets.token_urlsafe(32))
            tmp.chmod(0o600)
            tmp.replace(self.cluster_secret_file)
        self.client_address = self.admin_address = None
        log = self.log_file.open("ab")
        try:
            # Own session: the fleet can always signal the whole process group, and a Ctrl-C on the
            # demo's terminal reaches the demo first, which then stops its members in order.
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()

    async def wait_started(self, timeout: float = START_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """Until the process has written its ports file (it does so once ready), or fail with its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise ProcessStartError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            if self.ports_file.exists():
                ports = json.loads(self.ports_file.read_text())
                self.client_address, self.admin_address = ports["listen"], ports["admin"]
                return
            await asyncio.sleep(0.05)
        raise ProcessStartError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:  # noqa: ASYNC109
        """SIGTERM (graceful close of every store), SIGKILL if it does not exit in time."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, timeout)
        if proc.poll() is None:
            self.kill()
        self.proc = None
        self.client_address = self.admin_address = None

    def kill(self) -> None:
        """SIGKILL the process group at once (crash tests and the last-resort cleanup)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        # The group's id is the leader's pid, which stays ours only until the leader is reaped: after
        # that the number may name another process group (pid_max is 32,768 here and wraps within
        # minutes under a test run), and a SIGKILL sent there could hit anything, a container's shim
        # included. An unreaped leader (running, or a zombie) still holds the number.
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
