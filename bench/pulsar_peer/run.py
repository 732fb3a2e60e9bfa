"""Pulsar side by side: the same transaction workload on Apache Pulsar standalone and on txnkeeper.

Why it exists: txnkeeper's figures only mean something next to the system it re-implements. This
driver starts Pulsar standalone (a real JVM from Maven Central jars, ``make bench-pulsar`` fetches
them) on 127.0.0.1 with transactions, fsync'd bookie journal, and PIP-160 batched writes off and
then on; runs Pulsar's own ``pulsar-perf transaction`` (PerformanceTransaction: begin, consume and
ack 1, produce 1, commit) at each concurrency; then runs ``bench/txn_e2e.py`` at the same levels and
prints one JSON with both and the txnkeeper/Pulsar ratios.

``--same-tool`` (issue 26) takes client differences out: the SAME ``pulsar-perf`` runs against Pulsar
standalone and against txnkeeper (one coordinator pod + one store pod, ``txnkeeper serve`` speaking
Pulsar's protocol, fsync on), ``transaction`` at each concurrency with batching off and on, and
``produce`` (the producer batching, 1 KiB messages, as fast as it goes). txnkeeper's commits are read
from its coordinator's ``txnkeeper_coordinator_committed_transactions``; CPU per transaction is the
server processes' (broker JVM; coordinator + store pods) and the tool's.

Throughput is measured by this driver, not taken from the tool's summary (whose clock includes
creating producers and consumers): after every consumer has subscribed and commits flow, it reads
the broker's ``pulsar_txn_committed_total`` and the CPU of the broker and client JVMs (/proc)
at the start and end of a fixed window.

    make bench-pulsar        # or: .venv/bin/python bench/pulsar_peer/run.py --lib DIR [--seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
START_TIMEOUT_S = 180.0
FIRST_COMMIT_TIMEOUT_S = 30.0
# JVM flags the pulsar launcher script passes too: without them the broker logs access errors while
# reading container limits and GC stats.
JVM_OPENS = [
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
]
# The partitioned topic that maps transactions to coordinators: it exists once transactions are up.
ASSIGN = "pulsar/system/transaction_coordinator_assign"
COMMITTED = re.compile(r"^pulsar_txn_committed_total\{[^}]*\}\s+(\S+)$", re.MULTILINE)
TXNKEEPER_COMMITTED = re.compile(
    r"^txnkeeper_coordinator_committed_transactions(?:_total)?(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE
)
PRODUCED = re.compile(r"Aggregated throughput stats --- (\d+) records sent --- ([0-9.]+) msg/s")
ADMIN_TOKEN = "pulsar-peer-bench-token"


class PeerError(RuntimeError):
    """A step of the peer run failed; the message says which and where its log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User+system CPU of a process from /proc (all its threads): the JVM's cost per transaction."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(what: str, check: Any, timeout: float, log: Path | None = None, poll: float = 0.2) -> Any:
    """Poll ``check`` until it returns a truthy value; fail naming ``what`` and the log to read."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise PeerError(f"timed out after {timeout:.0f}s waiting for {what}" + (f"; see {log}" if log else ""))


def http(method: str, url: str, timeout: float = 30.0) -> str:
    request = urllib.request.Request(url, method=method, data=b"" if method == "PUT" else None)
    request.add_header("Content-Type", "application/json")  # the admin API refuses a PUT without it
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return str(response.read().decode())


@dataclass
class Broker:
    """A server pulsar-perf runs against: Pulsar standalone (``web``: its admin and metrics URL) or
    txnkeeper's pods (``web`` None; ``committed`` reads the coordinator's metrics)."""

    proc: subprocess.Popen[bytes]
    web: str | None
    service: str
    log: Path
    committed: Callable[[], int] | None = None
    server_pids: list[int] = field(default_factory=list)
    system: str = "pulsar"


class Runner:
    """Owns every JVM it starts and kills all of them on exit, failure or Ctrl-C."""

    def __init__(self, lib: Path, work: Path) -> None:
        self.classpath = f"{lib}/*"
        self.work = work
        self.children: list[subprocess.Popen[bytes]] = []
        self.perf_args: list[str] = []
        self.client_conf = work / "client.conf"
        self.client_conf.write_text("")  # pulsar-perf wants a client config file; defaults suffice

    def java(self, args: list[str], log: Path, heap: str) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["java", f"-Xmx{heap}", *JVM_OPENS, "-cp", self.classpath, *args],
                cwd=self.work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop the JVMs in order
            )
        self.children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        if proc in self.children:
            self.children.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.children):
            self.stop(proc)

    def start_broker(self, batched: bool) -> Broker:
        mode = "on" if batched else "off"
        data = self.work / f"standalone-{mode}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        broker_port, web_port, bk_port = free_port(), free_port(), free_port()
        conf = data / "standalone.conf"
        conf.write_text(
            (HERE / "standalone.conf").read_text()
            + f"\nbrokerServicePort={broker_port}\nwebServicePort={web_port}\n"
            + f"transactionLogBatchedWriteEnabled={str(batched).lower()}\n"
            + f"transactionPendingAckBatchedWriteEnabled={str(batched).lower()}\n"
        )
        log = data / "broker.log"
        proc = self.java(
            [
                "org.apache.pulsar.PulsarStandaloneStarter",
                "--config", str(conf),
                "--no-functions-worker",
                "--no-stream-storage",
                "--wipe-data",
                "--bookkeeper-dir", str(data / "bookkeeper"),
                "--metadata-dir", str(data / "metadata"),
                "--bookkeeper-port", str(bk_port),
            ],
            log,
            heap="1g",
        )  # fmt: skip
        broker = Broker(proc, f"http://127.0.0.1:{web_port}", f"pulsar://127.0.0.1:{broker_port}", log)

        def ready() -> bool:
            if proc.poll() is not None:
                raise PeerError(f"Pulsar standalone exited with {proc.returncode} while starting; see {log}")
            try:
                clusters = json.loads(http("GET", f"{broker.web}/admin/v2/clusters", timeout=5))
                assign = json.loads(
                    http("GET", f"{broker.web}/admin/v2/persistent/{ASSIGN}/partitions", timeout=5)
                )
            except (OSError, urllib.error.URLError, ValueError):
                return False
            return "standalone" in clusters and assign.get("partitions", 0) > 0

        wait_for(
            "Pulsar standalone (broker, bookie, transaction coordinator)", ready, START_TIMEOUT_S, log, 1.0
        )
        return broker

    def prefill(self, broker: Broker, topic: str, count: int) -> None:
        """The input the transactions consume: the topic and its subscription exist first, so
        nothing written is trimmed before the perf tool's consumers attach. Unbatched (``-db``):
        one message per entry, as txnkeeper's input, so each transaction acks a whole entry."""
        path = topic.removeprefix("persistent://")
        if broker.web is not None:
            http("PUT", f"{broker.web}/admin/v2/persistent/{path}")
            http("PUT", f"{broker.web}/admin/v2/persistent/{path}/subscription/sub")
        # (txnkeeper keeps a topic's entries until a subscription consumed them: the perf consumers
        # subscribe from Earliest, -sp below)
        log = self.work / f"prefill-{broker.system}-{path.replace('/', '_')}.log"
        admin = ["-au", broker.web] if broker.web is not None else []
        proc = self.java(
            [
                "org.apache.pulsar.testclient.PulsarPerfTestTool", str(self.client_conf), "produce",
                "-u", broker.service, *admin,
                "-m", str(count), "-r", "1000000", "-o", "1000", "-s", "16", "-db", "-time", "300", topic,
            ],
            log,
            # -o bounds the tool's own queue: -m counts acknowledged sends, and unbounded the tool goes
            # on queueing at -r until they reach it (past the count, and out of a 1g heap).
            heap="1g",
        )  # fmt: skip
        try:
            proc.wait(timeout=300)
        finally:
            self.stop(proc)
        if broker.web is None:
            sent = PRODUCED.search(log.read_text(errors="replace"))
            written = int(sent.group(1)) if sent else 0
        else:
            written = json.loads(http("GET", f"{broker.web}/admin/v2/persistent/{path}/stats"))[
                "msgInCounter"
            ]
        if written < count:
            raise PeerError(f"prefill of {topic} wrote {written} of {count} messages; see {log}")

    def perf_level(
        self, broker: Broker, mode: str, threads: int, seconds: float, prefill: int
    ) -> dict[str, Any]:
        topic_in = f"persistent://public/default/in-{mode}-{threads}"
        topic_out = f"persistent://public/default/out-{mode}-{threads}"
        self.prefill(broker, topic_in, prefill)
        log = self.work / f"perf-{broker.system}-{mode}-{threads}.log"
        admin = ["-au", broker.web] if broker.web is not None else []
        proc = self.java(
            [
                "org.apache.pulsar.testclient.PulsarPerfTestTool", str(self.client_conf), "transaction",
                "-u", broker.service, *admin, "-sp", "Earliest",
                "--topics-c", topic_in, "--topics-p", topic_out, "-ss", "sub",
                "-threads", str(threads), "-nmp", "1", "-nmc", "1", "-ntxn", "0",
                "-time", str(int(seconds * 3 + 60)), "-tto", "60",
                *self.perf_args,
            ],
            log,
            heap="1g",
        )  # fmt: skip
        try:

            def subscribed() -> bool:
                if proc.poll() is not None:
                    raise PeerError(f"pulsar-perf transaction exited with {proc.returncode}; see {log}")
                return log.read_text(errors="replace").count("Subscribed to topic") >= threads

            wait_for(f"{threads} perf consumers to subscribe", subscribed, START_TIMEOUT_S, log)
            first = committed(broker)
            try:
                wait_for("the first commits", lambda: committed(broker) > first, FIRST_COMMIT_TIMEOUT_S, log)
            except PeerError:
                # Seen at 256 threads: every thread holds an open transaction and none commits. That is
                # a figure (0 txn/s, and why), not a reason to lose the other levels' figures.
                return {
                    "concurrency": threads,
                    "transactions": 0,
                    "txn_per_s": 0.0,
                    "stalled": f"no commit within {FIRST_COMMIT_TIMEOUT_S:.0f}s after all {threads} "
                    f"perf consumers subscribed: {perf_summary(log)}",
                    "client_deadlock": client_deadlock(proc.pid),
                }
            warmup_until = time.monotonic() + min(3.0, seconds)
            wait_for("the warm-up (JIT)", lambda: time.monotonic() >= warmup_until, seconds + 5, log)
            before = (time.monotonic(), committed(broker), server_cpu(broker), cpu_seconds(proc.pid))
            window_end = before[0] + seconds
            wait_for("the measurement window", lambda: time.monotonic() >= window_end, seconds + 5, log, 0.05)
            after = (time.monotonic(), committed(broker), server_cpu(broker), cpu_seconds(proc.pid))
            # Also after commits: the tool's client can deadlock inside the window, and the level then
            # shows a low rate with idle servers (2026-11-29: two runs of twelve at 16 threads).
            deadlock = client_deadlock(proc.pid)
            if proc.poll() is not None:
                raise PeerError(f"pulsar-perf transaction exited during the window; see {log}")
        finally:
            self.stop(proc)
        done = after[1] - before[1]
        result: dict[str, Any] = {
            "concurrency": threads,
            "transactions": done,
            "seconds": round(after[0] - before[0], 3),
            "txn_per_s": round(done / (after[0] - before[0]), 1),
            "cpu_ms_per_txn": {
                "broker": round((after[2] - before[2]) * 1000 / done, 3) if done else None,
                "client": round((after[3] - before[3]) * 1000 / done, 3) if done else None,
            },
            "cpu_s_in_window": {
                "broker": round(after[2] - before[2], 3),
                "client": round(after[3] - before[3], 3),
            },
        }
        if broker.web is not None:
            stats = http(
                "GET", f"{broker.web}/admin/v2/persistent/{topic_in.removeprefix('persistent://')}/stats"
            )
            result["input_left"] = json.loads(stats)["subscriptions"]["sub"]["msgBacklog"]
        if not done:
            result["stalled"] = f"commits began, then none in the window: {perf_summary(log)}"
            result["client_deadlock"] = deadlock
        elif deadlock is not None:
            result["stalled"] = (
                f"the tool's client deadlocked inside the window, after {done} commits: {perf_summary(log)}"
            )
            result["client_deadlock"] = deadlock
        return result

    def perf_produce(self, broker: Broker, seconds: float) -> dict[str, Any]:
        """``pulsar-perf produce`` with its default batching, 1 KiB messages, unthrottled: msg/s as
        the tool reports it over the run, and the server's CPU per message."""
        topic = f"persistent://public/default/produce-{broker.system}-{time.monotonic_ns()}"
        log = self.work / f"produce-{broker.system}.log"
        admin = ["-au", broker.web] if broker.web is not None else []
        cpu_before = server_cpu(broker)
        proc = self.java(
            [
                "org.apache.pulsar.testclient.PulsarPerfTestTool", str(self.client_conf), "produce",
                "-u", broker.service, *admin, "-r", "1000000", "-s", "1024", "-time", str(int(seconds)),
                topic,
            ],
            log,
            heap="1g",
        )  # fmt: skip
        try:
            proc.wait(timeout=seconds + 120)
        finally:
            self.stop(proc)
        cpu = server_cpu(broker) - cpu_before
        found = PRODUCED.search(log.read_text(errors="replace"))
        if found is None:
            raise PeerError(f"pulsar-perf produce against {broker.system} printed no summary; see {log}")
        sent = int(found.group(1))
        return {
            "messages": sent,
            "msg_per_s": float(found.group(2)),
            "server_cpu_us_per_msg": round(cpu * 1e6 / sent, 2) if sent else None,
            "message_bytes": 1024,
        }


# The Java client (4.0.x) asks its transaction-coordinator handler for a permit (1,000 in all) before
# each coordinator request; the commit of a transaction runs on the netty IO thread that delivered
# its last send receipt, and blocks it there while 1,000 requests are outstanding; the responses that
# would free permits wait for that same thread. pulsar-perf never waits for its commits, so open
# transactions pile up whenever a server's transactions take longer than its NEW_TXN.
CLIENT_DEADLOCK = "TransactionMetaStoreHandler.canSendRequest"


def client_deadlock(pid: int) -> str | None:
    """Why a stalled pulsar-perf stopped, when its own client deadlocked (read from a thread dump):
    the IO thread that blocks, None when none does (or no dump could be taken)."""
    try:
        jstack = subprocess.run(["jstack", str(pid)], check=False, capture_output=True, text=True, timeout=60)
        dump = jstack.stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for thread in dump.split("\n\n"):
        if thread.startswith('"pulsar-client-io') and CLIENT_DEADLOCK in thread:
            name = thread.split('"')[1]
            return (
                f"{name} blocked in {CLIENT_DEADLOCK} (the Java client's 1,000 coordinator-request permits"
                " are taken and the thread that would read the answers freeing them waits for one)"
            )
    return None


def perf_summary(log: Path) -> str:
    """The perf tool's last interval report (it prints one every 10 s), for a stalled level."""
    lines = [
        line for line in log.read_text(errors="replace").splitlines() if "Throughput transaction:" in line
    ]
    return lines[-1].split(" - ", 2)[-1][:160] if lines else "the perf tool reported no interval yet"


def server_cpu(broker: Broker) -> float:
    return sum(cpu_seconds(pid) for pid in (broker.server_pids or [broker.proc.pid]))


def committed(broker: Broker) -> int:
    if broker.committed is not None:
        return broker.committed()
    text = http("GET", f"{broker.web}/metrics/", timeout=30)
    return int(sum(float(v) for v in COMMITTED.findall(text)))


@contextlib.contextmanager
def txnkeeper_pods(work: Path) -> Iterator[tuple[Broker, list[str]]]:
    """One coordinator pod and one store pod (``txnkeeper serve``, fsync on), each told where the
    other is for Pulsar's lookups; yields the Broker the perf tool runs against and the admin
    addresses (to switch batching)."""
    python = REPO / ".venv" / "bin" / "python"
    exe = str(python if python.exists() else sys.executable)
    token, secret = work / "admin-token", work / "cluster-secret"
    for path, text in ((token, ADMIN_TOKEN), (secret, "pulsar-peer-bench-cluster-secret-0123456789")):
        path.write_text(text)
        path.chmod(0o600)
    ports = {role: (free_port(), free_port()) for role in ("coordinator", "store")}
    placement = [
        "--pulsar-urls", f"pulsar://127.0.0.1:{ports['store'][0]}",
        "--pulsar-coordinator-urls", f"pulsar://127.0.0.1:{ports['coordinator'][0]}",
    ]  # fmt: skip
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role, (client_port, admin_port) in ports.items():
            data = work / f"txnkeeper-{role}"
            shutil.rmtree(data, ignore_errors=True)
            log = work / f"txnkeeper-{role}.log"
            with log.open("wb") as out:
                procs[role] = subprocess.Popen(
                    [
                        exe, "-m", "txnkeeper.cli", "serve", "--role", role, "--data-dir", str(data),
                        "--listen", f"127.0.0.1:{client_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
                        "--pod-name", f"{role}-0", "--admin-token-file", str(token),
                        "--cluster-secret-file", str(secret), *placement,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    start_new_session=True,
                    env={k: v for k, v in os.environ.items() if not k.startswith("TXNKEEPER_")},
                )  # fmt: skip
        for role, (_, admin_port) in ports.items():

            def ready(role: str = role, admin_port: int = admin_port) -> bool:
                if procs[role].poll() is not None:
                    raise PeerError(f"txnkeeper {role} pod exited; see {work}/txnkeeper-{role}.log")
                try:
                    http("GET", f"http://127.0.0.1:{admin_port}/ready", timeout=2)  # raises unless 2xx
                except (OSError, urllib.error.URLError):
                    return False
                return True

            wait_for(f"the txnkeeper {role} pod", ready, START_TIMEOUT_S, work / f"txnkeeper-{role}.log")
        coordinator_admin = f"127.0.0.1:{ports['coordinator'][1]}"

        def read_committed() -> int:
            request = urllib.request.Request(f"http://{coordinator_admin}/metrics")
            request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
            return int(sum(float(v) for v in TXNKEEPER_COMMITTED.findall(text)))

        broker = Broker(
            procs["store"],
            None,
            f"pulsar://127.0.0.1:{ports['store'][0]}",
            work / "txnkeeper-store.log",
            committed=read_committed,
            server_pids=[p.pid for p in procs.values()],
            system="txnkeeper",
        )
        yield broker, [f"127.0.0.1:{admin}" for _, admin in ports.values()]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def set_txnkeeper_batching(admins: list[str], enabled: bool) -> None:
    stat = {"batchEnabled": enabled}
    body = json.dumps({"coordinator": stat, "pendingAck": stat}).encode()
    for admin in admins:
        request = urllib.request.Request(f"http://{admin}/admin/v1/batch-log", data=body, method="POST")
        request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise PeerError(f"switching batching on {admin} answered {response.status}")


def run_same_tool(runner: Runner, levels: list[int], seconds: float, skip_pulsar: bool) -> dict[str, Any]:
    """The same pulsar-perf against Pulsar standalone and txnkeeper (module docstring)."""
    results: dict[str, Any] = {"pulsar": {}, "txnkeeper": {}}
    for batched in () if skip_pulsar else (False, True):
        mode = "batching_on" if batched else "batching_off"
        broker = runner.start_broker(batched)
        try:
            results["pulsar"][mode] = same_tool_levels(runner, broker, mode, levels, seconds)
            if batched:
                results["pulsar"]["produce"] = runner.perf_produce(broker, seconds)
        finally:
            runner.stop(broker.proc)
    with txnkeeper_pods(runner.work) as (broker, admins):
        for batched in (False, True):
            mode = "batching_on" if batched else "batching_off"
            set_txnkeeper_batching(admins, batched)
            results["txnkeeper"][mode] = same_tool_levels(runner, broker, mode, levels, seconds)
        results["txnkeeper"]["produce"] = runner.perf_produce(broker, seconds)
    return results


def same_tool_levels(
    runner: Runner, broker: Broker, mode: str, levels: list[int], seconds: float
) -> list[dict[str, Any]]:
    out = []
    for threads in levels:
        prefill = int((seconds + 10) * (300 if threads == 1 else 2500))
        result = runner.perf_level(broker, mode, threads, seconds, prefill)
        print(json.dumps({"system": broker.system, "mode": mode, **result}), file=sys.stderr)
        out.append(result)
    return out


def run_pulsar(runner: Runner, levels: list[int], seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for batched in (False, True):
        mode = "batching_on" if batched else "batching_off"
        broker = runner.start_broker(batched)
        try:
            results[mode] = []
            for threads in levels:
                # Enough input that the consumers never starve: warm-up plus window at a rate well
                # above what one broker on this machine sustains.
                prefill = int((seconds + 10) * (300 if threads == 1 else 2500))
                result = runner.perf_level(broker, mode, threads, seconds, prefill)
                print(json.dumps({"system": "pulsar", "mode": mode, **result}), file=sys.stderr)
                if result.get("input_left") == 0:
                    raise PeerError(f"{mode} at {threads}: the input ran out; raise the prefill")
                results[mode].append(result)
        finally:
            runner.stop(broker.proc)
    return results


def run_txnkeeper(levels: list[int], seconds: float, rounds: int) -> dict[str, Any]:
    python = REPO / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python if python.exists() else sys.executable), str(REPO / "bench" / "txn_e2e.py"),
         "--levels", ",".join(map(str, levels)), "--seconds", str(seconds), "--rounds", str(rounds)],
        cwd=REPO, stdout=subprocess.PIPE, check=False, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise PeerError(f"bench/txn_e2e.py exited with {done.returncode} (its stderr is above)")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def ratios(pulsar: dict[str, Any], txnkeeper: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """txnkeeper txn/s over Pulsar txn/s per mode and level (> 1: txnkeeper is faster)."""
    out: dict[str, dict[str, float | None]] = {}
    for mode in ("batching_off", "batching_on"):
        theirs = {r["concurrency"]: r["txn_per_s"] for r in pulsar.get(mode, [])}
        ours = {r["concurrency"]: r["txn_per_s"] for r in txnkeeper.get(mode, [])}
        out[mode] = {
            str(c): (round(ours[c] / theirs[c], 2) if theirs[c] else None) for c in theirs if c in ours
        }
    return out


def median_ratios(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """Each ratio's median over the rounds (the same keys as one round's ratios)."""
    out: dict[str, Any] = {}
    for key in per_round[0]:
        values = [r.get(key) for r in per_round]
        nested = [v for v in values if isinstance(v, dict)]
        if nested and len(nested) == len(values):
            out[key] = median_ratios(nested)
        else:
            numbers = [v for v in values if isinstance(v, int | float)]
            out[key] = round(statistics.median(numbers), 2) if numbers else None
    return out


@contextlib.contextmanager
def interrupts_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks stop the JVMs either way."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lib", type=Path, required=True, help="the jars `make bench-pulsar` copied from Maven Central"
    )
    parser.add_argument("--levels", default="1,16,256")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per level")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="txn_e2e.py rounds per level and mode; with --same-tool: whole rounds, each Pulsar then"
        " txnkeeper, reported with the median of each ratio (one run of either varies by 30 %% here)",
    )
    parser.add_argument("--skip-txnkeeper", action="store_true", help="only the Pulsar half")
    parser.add_argument("--skip-pulsar", action="store_true", help="with --same-tool: only txnkeeper")
    parser.add_argument(
        "--same-tool",
        action="store_true",
        help="run pulsar-perf (transaction and produce) against both servers (module docstring)",
    )
    parser.add_argument(
        "--perf-arg",
        action="append",
        default=[],
        help="extra `pulsar-perf transaction` flag (repeat), e.g. -q",
    )
    ns = parser.parse_args()
    if not any(ns.lib.glob("pulsar-broker-*.jar")):
        parser.error(f"--lib {ns.lib}: no pulsar-broker jar there; run `make bench-pulsar` to fetch the jars")
    if shutil.which("java") is None:
        parser.error("no `java` on PATH: Pulsar needs Java 17")
    try:
        levels = [int(x) for x in ns.levels.split(",")]
    except ValueError:
        parser.error(f"--levels {ns.levels!r}: give comma-separated transaction counts, e.g. 1,16,256")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pulsar-peer-") as tmp, interrupts_as_exit():
        runner = Runner(ns.lib.resolve(), Path(tmp))
        runner.perf_args = list(ns.perf_arg)
        try:
            if ns.same_tool:
                rounds = []
                for number in range(max(1, ns.rounds)):
                    rounds.append(run_same_tool(runner, levels, ns.seconds, ns.skip_pulsar))
                    print(json.dumps({"round": number + 1, "done": True}), file=sys.stderr)
            else:
                pulsar = run_pulsar(runner, levels, ns.seconds)
                txnkeeper = {} if ns.skip_txnkeeper else run_txnkeeper(levels, ns.seconds, ns.rounds)
        except (PeerError, OSError) as exc:  # OSError: an admin call failed (urllib errors are OSErrors)
            # The logs are in the temporary directory: keep the one named before it is removed.
            traceback.print_exc()  # which step: an admin call's "timed out" alone does not say
            print(f"pulsar_peer: {exc}", file=sys.stderr)
            logs = [*Path(tmp).glob("*.log"), *Path(tmp).glob("standalone-*/broker.log")]
            if ns.same_tool:
                logs = [log for log in logs if log.stat().st_mtime > time.time() - 600]
            for log in logs:
                print(f"--- last lines of {log.name} ---", file=sys.stderr)
                print("\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
            return 1
        finally:
            runner.stop_all()
    if ns.same_tool:
        reports = [same_tool_report(ns, same, load) for same in rounds]
        if len(reports) == 1:
            print(json.dumps(reports[0], indent=2))
            return 0
        summary = {
            key: value
            for key, value in reports[-1].items()
            if key not in ("pulsar", "txnkeeper", "ratio_txnkeeper_over_pulsar")
        }
        summary["rounds"] = [
            {k: r[k] for k in ("pulsar", "txnkeeper", "ratio_txnkeeper_over_pulsar")} for r in reports
        ]
        summary["median_ratio_txnkeeper_over_pulsar"] = median_ratios(
            [r["ratio_txnkeeper_over_pulsar"] for r in reports]
        )
        print(json.dumps(summary, indent=2))
        return 0
    print(
        json.dumps(
            {
                "benchmark": "pulsar_peer",
                "operation": "begin + produce 1 + ack 1 + commit",
                "pulsar": {
                    "version": next(ns.lib.glob("pulsar-broker-*.jar")).stem.removeprefix("pulsar-broker-"),
                    "setup": "standalone (broker + 1 bookie, journalSyncData=true), pulsar-perf transaction",
                    "concurrency_means": "perf threads (each waits for begin and receive, not for commit)",
                    "perf_extra_args": ns.perf_arg,
                    **pulsar,
                },
                "txnkeeper": txnkeeper,
                "ratio_txnkeeper_over_pulsar": ratios(pulsar, txnkeeper) if txnkeeper else None,
                "loadavg_before": [round(x, 2) for x in load],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )
    return 0


def same_tool_report(ns: argparse.Namespace, same: dict[str, Any], load: tuple[float, ...]) -> dict[str, Any]:
    pulsar, ours = same["pulsar"], same["txnkeeper"]
    return {
        "benchmark": "pulsar_peer --same-tool",
        "tool": "pulsar-perf (org.apache.pulsar:pulsar-testclient) against both servers, unchanged",
        "transaction": "begin + consume 1 + ack 1 + produce 1 + commit; concurrency = perf threads",
        "pulsar_version": next(ns.lib.glob("pulsar-broker-*.jar")).stem.removeprefix("pulsar-broker-"),
        "pulsar_setup": "standalone (broker + 1 bookie, journalSyncData=true)",
        "txnkeeper_setup": "1 coordinator pod + 1 store pod (txnkeeper serve, fsync on), one machine",
        "pulsar": pulsar,
        "txnkeeper": ours,
        "ratio_txnkeeper_over_pulsar": {
            **ratios(pulsar, ours),
            "produce": round(ours["produce"]["msg_per_s"] / pulsar["produce"]["msg_per_s"], 2)
            if pulsar.get("produce", {}).get("msg_per_s")
            else None,
        },
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    sys.exit(main())
