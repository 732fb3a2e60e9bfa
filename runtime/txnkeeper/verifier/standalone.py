"""A real Spark standalone cluster on this machine: a master and N workers from the installed pyspark.

Why: a `spark://` master is a deployment the verifier's CRDs accept, and the only honest test of it is
a real one: separate master, worker and executor JVMs, executors on their own hosts (each worker binds
its own loopback address, 127.0.0.2, 127.0.0.3, ... as machines on a network would), code shipped to
them over Spark's own file server. Tests and benchmarks start one with `StandaloneCluster`; it is also
a quick way to try `--master spark://...` by hand (`python -m txnkeeper.verifier.standalone`).

Every process it starts (the daemons, the executors the workers launch and their Python workers) carries
the cluster's marker in its environment, so `stop` can prove that nothing outlived the cluster, even the
Python daemons that put themselves in process groups of their own; and the daemons die with the process
that started them, should it be killed before it could stop them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnkeeper.verifier.model import VerifierInfraError

MARKER_ENV = "TXNKEEPER_SPARK_CLUSTER"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Daemons live for a test: a small heap, C1 only and the serial GC start them fastest on a busy machine.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
"""
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spark_home() -> Path:
    """The installed pyspark's own Spark distribution (bin/spark-class, jars/)."""
    try:
        import pyspark
    except ImportError as exc:
        raise VerifierInfraError("pyspark is not installed (pip install 'txnkeeper[spark]')") from exc
    return Path(pyspark.__file__).resolve().parent


# What a Spark daemon logs when the port it was given is taken (by anything that bound it between
# free_port and the daemon's bind): it then binds the next port, where nobody looks for it.
PORT_CLASH = "could not bind on port"
START_ATTEMPTS = 3


class _PortClash(VerifierInfraError):
    """A daemon found one of its ports taken: the cluster starts again on fresh ports."""


def free_port(host: str) -> int:
    """A port free on `host` now (the daemons bind it a moment later; a daemon that finds it taken
    logs PORT_CLASH, and the cluster starts again on fresh ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Sizes of the cluster and of every application's executors (one per worker)."""

    workers: int = 2
    cores_per_worker: int = 1
    memory_per_worker: str = "512m"
    daemon_memory: str = "256m"
    start_timeout_s: float = 120.0
    # How long an application waits for all its executors before it runs its first task. Waiting for
    # all of them is what makes "every executor got work" deterministic rather than a race.
    executors_timeout_s: float = 120.0
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores_per_worker < 1:
            raise ValueError(f"need at least one worker with one core, got {self}")


@dataclass(slots=True)
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


class StandaloneCluster:
    """Master + workers as child processes; a context manager. `master_url` is what drivers use.

    `spark_defaults` (written to `conf_dir/spark-defaults.conf`) sizes each application's executors to
    fit the workers and makes it wait for all of them; a driver started with `driver_env()` (the conf
    dir, the executors' Python) picks it up, whether it is spark-submit, the verifier's CLI or a test.
    """

    def __init__(self, settings: ClusterSettings | None = None, root: Path | None = None) -> None:
        self.settings = settings or ClusterSettings()
        self._owned_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="txnkeeper-spark-")) if root is None else root
        self.home = spark_home()
        self.conf_dir = self.root / "conf"
        self.master_host = "127.0.0.1"
        self._pick_master_ports()
        self.worker_hosts = [f"127.0.0.{2 + i}" for i in range(self.settings.workers)]
        self._daemons: list[_Daemon] = []
        self._stopped = threading.Event()

    # ---- configuration -------------------------------------------------------------------------------

    def _pick_master_ports(self) -> None:
        # master_url and master_ui are final once start() returned (a port clash picks new ones).
        self.master_port = free_port(self.master_host)
        self.master_ui = f"http://{self.master_host}:{free_port(self.master_host)}"
        self.master_url = f"spark://{self.master_host}:{self.master_port}"

    def spark_defaults(self) -> dict[str, str]:
        s = self.settings
        return {
            "spark.master": self.master_url,
            "spark.executor.cores": str(s.cores_per_worker),
            "spark.executor.memory": s.memory_per_worker,
            "spark.cores.max": str(s.workers * s.cores_per_worker),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(s.executors_timeout_s)}s",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.extraJavaOptions": DAEMON_JAVA_OPTS,
        }

    def driver_env(self) -> dict[str, str]:
        """Environment additions for a driver process that should run on this cluster."""
        return {"SPARK_CONF_DIR": str(self.conf_dir), "PYSPARK_PYTHON": self.settings.python}

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "log4j2.properties").write_text(LOG4J2)
        lines = [f"{key} {value}" for key, value in self.spark_defaults().items()]
        (self.conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")

    def _env(self, host: str) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_MASTER_HOST"):
            env.pop(key, None)
        env.update(
            {
                "SPARK_HOME": str(self.home),
                "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_LOG_DIR": str(self.root / "logs"),
                "SPARK_PID_DIR": str(self.root / "pids"),
                "SPARK_LOCAL_IP": host,
                "SPARK_LOCAL_DIRS": str(self.root / "local" / host),
                "SPARK_DAEMON_MEMORY": self.settings.daemon_memory,
                "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS,
                "PYSPARK_PYTHON": self.settings.python,
                MARKER_ENV: str(self.root),
            }
        )
        return env

    # ---- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master and the workers; returns once the master lists every worker ALIVE.

        A port taken between picking it and the daemon's bind (another process on a busy machine)
        makes the daemon bind the next one, where nobody looks: the cluster is then stopped and
        started again on fresh ports, up to START_ATTEMPTS times."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except _PortClash:
                if attempt == START_ATTEMPTS:
                    raise
                self._stopped.clear()
                self._daemons.clear()
                self._pick_master_ports()

    def _start_once(self) -> None:
        self._write_conf()
        (self.root / "logs").mkdir(exist_ok=True)
        try:
            self._spawn(
                "master",
                self.master_host,
                [MASTER_CLASS, "--host", self.master_host, "--port", str(self.master_port),
                 "--webui-port", self.master_ui.rsplit(":", 1)[1]],
            )  # fmt: skip
            for index, host in enumerate(self.worker_hosts):
                work = self.root / f"worker-{index}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    f"worker-{index}",
                    host,
                    [WORKER_CLASS, "--host", host, "--port", str(free_port(host)),
                     "--webui-port", str(free_port(host)), "--cores", str(self.settings.cores_per_worker),
                     "--memory", self.settings.memory_per_worker, "--work-dir", str(work), self.master_url],
                )  # fmt: skip
            self.wait_for_workers(self.settings.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, host: str, arguments: Sequence[str]) -> None:
        log = self.root / "logs" / f"{name}.log"
        with log.open("wb") as sink:
            # A session (and process group) of its own: stop() signals the daemon and the executors it
            # launched as one group, never this process's own.
            process = subprocess.Popen(
                [*_die_with_parent(), str(self.home / "bin" / "spark-class"), *arguments],
                env=self._env(host),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._daemons.append(_Daemon(name, process, log))

    def master_state(self) -> Mapping[str, Any]:
        """The master's own JSON view (its web UI's /json): workers, applications, their states."""
        with _OPENER.open(self.master_ui + "/json", timeout=5) as response:
            state: Mapping[str, Any] = json.loads(response.read())
        return state

    def alive_workers(self) -> list[Mapping[str, Any]]:
        return [w for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE"]

    def wait_for_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "the master's web UI did not answer yet"
        while True:
            for daemon in self._daemons:
                clash = self._port_clash(daemon)
                if clash is not None:
                    raise _PortClash(f"Spark {daemon.name} found a port taken: {clash}")
                if daemon.process.poll() is not None:
                    raise VerifierInfraError(
                        f"Spark {daemon.name} exited with {daemon.process.returncode} while the cluster "
                        f"started; its log {daemon.log}:\n{self.log_tail(daemon.name)}"
                    )
            try:
                alive = self.alive_workers()
                if len(alive) >= self.settings.workers:
                    return
                last = f"{len(alive)} of {self.settings.workers} workers ALIVE"
            except (OSError, ValueError) as exc:
                last = f"{self.master_ui}/json: {exc}"
            if time.monotonic() > deadline:
                raise VerifierInfraError(
                    f"the Spark standalone cluster did not come up in {timeout_s:.0f} s ({last}); logs in "
                    f"{self.root / 'logs'}:\n{self.log_tail('master')}"
                )
            self._stopped.wait(0.2)  # poll interval of a condition with a deadline

    @staticmethod
    def _port_clash(daemon: _Daemon) -> str | None:
        try:
            text = daemon.log.read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if PORT_CLASH in line:
                return line.strip()
        return None

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / "logs" / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {path})"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Terminate every process of the cluster (SIGTERM to their groups, then SIGKILL), and wait
        until none is left. Raises VerifierInfraError naming any process that survived."""
        self._stopped.set()
        tree = self._all_processes()
        own_group = os.getpgrp()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            groups = {_process_group(pid) for pid in tree} - {None, own_group, 0, 1}
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, sig)  # type: ignore[arg-type]
            if self._reap(tree, timeout_s / 2):
                break
        survivors = self.leftovers()
        if survivors:
            raise VerifierInfraError(
                f"Spark cluster processes outlived stop(): {survivors} (marker {MARKER_ENV}={self.root})"
            )
        if self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _all_processes(self) -> set[int]:
        pids = {d.process.pid for d in self._daemons if d.process.poll() is None}
        return pids | set(self.leftovers())

    def _reap(self, pids: set[int], timeout_s: float) -> bool:
        """Whether every one of `pids` (and every marked process) is gone within the timeout."""
        deadline = time.monotonic() + timeout_s
        for daemon in self._daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(timeout=max(0.01, deadline - time.monotonic()))
        while any(_alive(pid) for pid in pids | set(self.leftovers())):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # poll interval of a condition with a deadline
        return True

    def leftovers(self) -> list[int]:
        """Live processes carrying this cluster's marker (daemons, executors, Python workers)."""
        marker = f"{MARKER_ENV}={self.root}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0") and _alive(int(entry.name)):
                found.append(int(entry.name))
        return sorted(found)


def _die_with_parent() -> list[str]:
    """A prefix that kills the daemon when this process dies without stopping the cluster (a test
    runner killed outright); its executors then exit when they lose their worker, and their Python
    daemons when they lose their executor. Linux (util-linux setpriv); elsewhere only stop() cleans up."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def main(argv: Sequence[str] | None = None) -> int:
    """Start a cluster and keep it until interrupted, printing how to use it."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    with StandaloneCluster(ClusterSettings(workers=args.workers)) as cluster:
        env = " ".join(f"{k}={v}" for k, v in cluster.driver_env().items())
        print(f"master {cluster.master_url} (UI {cluster.master_ui}); drivers: {env}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: cluster._stopped.set())
        with contextlib.suppress(KeyboardInterrupt):
            cluster._stopped.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
