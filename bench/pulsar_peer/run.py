"""Pulsar side by side: the same transaction workload on Apache Pulsar standalone and on txnkeeper.

Why it exists: txnkeeper's figures only mean something next to the system it re-implements. This
driver starts Pulsar standalone (a real JVM from Maven Central jars, ``make bench-pulsar`` fetches
them) on 127.0.0.1 with transactions, fsync'd bookie journal, and PIP-160 batched writes off and
then on; runs Pulsar's own ``pulsar-perf transaction`` (PerformanceTransaction: begin, consume and
ack 1, produce 1, commit) at each concurrency; then runs ``bench/txn_e2e.py`` at the same levels and
prints one JSON with both and the txnkeeper/Pulsar ratios.

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
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
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
    proc: subprocess.Popen[bytes]
    web: str
    service: str
    log: Path


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
        http("PUT", f"{broker.web}/admin/v2/persistent/{path}")
        http("PUT", f"{broker.web}/admin/v2/persistent/{path}/subscription/sub")
        log = self.work / f"prefill-{path.replace('/', '_')}.log"
        proc = self.java(
            [
                "org.apache.pulsar.testclient.PulsarPerfTestTool", str(self.client_conf), "produce",
                "-u", broker.service, "-au", broker.web,
                "-m", str(count), "-r", "1000000", "-s", "16", "-db", "-time", "300", topic,
            ],
            log,
            heap="512m",
        )  # fmt: skip
        try:
            proc.wait(timeout=300)
        finally:
            self.stop(proc)
        written = json.loads(http("GET", f"{broker.web}/admin/v2/persistent/{path}/stats"))["msgInCounter"]
        if written < count:
            raise PeerError(f"prefill of {topic} wrote {written} of {count} messages; see {log}")

    def perf_level(
        self, broker: Broker, mode: str, threads: int, seconds: float, prefill: int
    ) -> dict[str, Any]:
        topic_in = f"persistent://public/default/in-{mode}-{threads}"
        topic_out = f"persistent://public/default/out-{mode}-{threads}"
        self.prefill(broker, topic_in, prefill)
        log = self.work / f"perf-{mode}-{threads}.log"
        proc = self.java(
            [
                "org.apache.pulsar.testclient.PulsarPerfTestTool", str(self.client_conf), "transaction",
                "-u", broker.service, "-au", broker.web,
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
                }
            warmup_until = time.monotonic() + min(3.0, seconds)
            wait_for("the warm-up (JIT)", lambda: time.monotonic() >= warmup_until, seconds + 5, log)
            before = (
                time.monotonic(),
                committed(broker),
                cpu_seconds(broker.proc.pid),
                cpu_seconds(proc.pid),
            )
            window_end = before[0] + seconds
            wait_for("the measurement window", lambda: time.monotonic() >= window_end, seconds + 5, log, 0.05)
            after = (time.monotonic(), committed(broker), cpu_seconds(broker.proc.pid), cpu_seconds(proc.pid))
            if proc.poll() is not None:
                raise PeerError(f"pulsar-perf transaction exited during the window; see {log}")
        finally:
            self.stop(proc)
        done = after[1] - before[1]
        backlog = json.loads(
            http("GET", f"{broker.web}/admin/v2/persistent/{topic_in.removeprefix('persistent://')}/stats")
        )
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
            "input_left": backlog["subscriptions"]["sub"]["msgBacklog"],
        }
        if not done:
            result["stalled"] = f"commits began, then none in the window: {perf_summary(log)}"
        return result


def perf_summary(log: Path) -> str:
    """The perf tool's last interval report (it prints one every 10 s), for a stalled level."""
    lines = [
        line for line in log.read_text(errors="replace").splitlines() if "Throughput transaction:" in line
    ]
    return lines[-1].split(" - ", 2)[-1][:160] if lines else "the perf tool reported no interval yet"


def committed(broker: Broker) -> int:
    text = http("GET", f"{broker.web}/metrics/", timeout=30)
    return int(sum(float(v) for v in COMMITTED.findall(text)))


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
    parser.add_argument("--rounds", type=int, default=1, help="txn_e2e.py rounds per level and mode")
    parser.add_argument("--skip-txnkeeper", action="store_true", help="only the Pulsar half")
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
            pulsar = run_pulsar(runner, levels, ns.seconds)
            txnkeeper = {} if ns.skip_txnkeeper else run_txnkeeper(levels, ns.seconds, ns.rounds)
        except (PeerError, OSError) as exc:  # OSError: an admin call failed (urllib errors are OSErrors)
            # The logs are in the temporary directory: keep the one named before it is removed.
            print(f"pulsar_peer: {exc}", file=sys.stderr)
            logs = [*Path(tmp).glob("*.log"), *Path(tmp).glob("standalone-*/broker.log")]
            for log in logs:
                print(f"--- last lines of {log.name} ---", file=sys.stderr)
                print("\n".join(log.read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
            return 1
        finally:
            runner.stop_all()
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


if __name__ == "__main__":
    sys.exit(main())
