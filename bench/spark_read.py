"""Reading committed topic data with the Spark data source, against consuming it with the client.

Starts a coordinator and a store pod (release 3.0.0, filesystem tier on the same disk), writes
``--mib`` MiB of committed messages (``--message-bytes`` each; pipelined plain sends, which are
committed as written, and every 100th message in a committed transaction plus one aborted transaction
per 100, so the transaction filter runs), half of it into a ledger that is then offloaded and whose
local file is deleted, half into a ledger the pod keeps. Then reads the whole topic:

- with Spark ``local[1]`` and ``local[2]`` (``spark.read.format("txnkeeper")``, summing the payload
  lengths: every row materialised on an executor), after one untimed warm-up read per session;
- with the client: one subscription, every message received and acknowledged;
- for reference, the same parts read by this one process without Spark (``python_read_no_spark``).

Prints JSON: rows, payload MiB, seconds, rows/s and MiB/s of each, the ratios the issue asks about
(Spark 1 executor / client, 2 executors / 1) and the machine's load averages before and after.
Figures depend on what else runs (this machine has 2 cores); compare within one run.

    .venv/bin/python bench/spark_read.py [--mib 64] [--message-bytes 1024] [--rounds 2]
    .venv/bin/python bench/spark_read.py --mib 1024    # the issue's 1 GiB (disk: ~2.5x that)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
TOPIC = "persistent://public/default/bench-spark-read"
TOKEN = "bench-token"


class Pod:
    def __init__(self, workdir: Path, name: str, role: str, config: dict[str, Any] | None = None) -> None:
        self.dir = workdir / name
        self.dir.mkdir(exist_ok=True)
        self.name, self.role, self.config = name, role, config
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None
        self.listen = self.admin = ""

    def start(self) -> Pod:
        ports = self.dir / "ports.json"
        ports.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "txnkeeper.cli", "serve", "--role", self.role,
            "--data-dir", str(self.dir / "data"), "--release", "3.0.0",
            "--listen", self.listen or "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--pod-name", self.name, "--ports-file", str(ports),
            "--admin-token-file", str(self.workdir / "token"),
            "--cluster-secret-file", str(self.workdir / "cluster-secret"),
        ]  # fmt: skip
        if self.config is not None:
            (self.dir / "config.json").write_text(json.dumps(self.config))
            command += ["--config", str(self.dir / "config.json")]
        with open(self.dir / "serve.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {(self.dir / 'serve.log').read_text()[-3000:]}")
            if ports.exists():
                found = json.loads(ports.read_text())
                self.listen, self.admin = found["listen"], found["admin"]
                try:
                    with urllib.request.urlopen(f"http://{self.admin}/ready", timeout=2):
                        return self
                except OSError:
                    pass
            time.sleep(0.1)  # poll interval of a condition with a deadline
        raise TimeoutError(f"{self.name} not ready")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)

    def post(self, verb: str) -> Any:
        url = f"http://{self.admin}/admin/v1/topics/{verb}?" + urllib.parse.urlencode({"topic": TOPIC})
        request = urllib.request.Request(url, data=b"{}", method="POST")
        request.add_header("Authorization", f"Bearer {TOKEN}")
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.admin}{path}", timeout=60) as response:
            return json.loads(response.read())


async def produce(tc: Pod, store: Pod, count: int, size: int, first: int) -> int:
    """``count`` committed messages; returns how many aborted ones were written besides."""
    from txnkeeper.client import Client

    aborted = 0
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(TOPIC)
        sent = 0
        while sent < count:
            window = min(256, count - sent)
            payloads = [f"{first + sent + i:010d}".encode().ljust(size, b"x") for i in range(window)]
            await asyncio.gather(*(producer.send(p, key=f"k{i % 16}") for i, p in enumerate(payloads)))
            sent += window
            if sent % 25_600 < 256 and sent < count:  # now and then a committed and an aborted txn
                for commit in (True, False):
                    txn = await client.new_transaction(timeout_ms=60_000)
                    await producer.send(b"t".ljust(size, b"t"), txn=txn)
                    if commit:
                        await txn.commit()
                        sent += 1
                    else:
                        await txn.abort()
                        aborted += 1
    return aborted


def spark_read(master: str, options: dict[str, str], rounds: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from txnkeeper.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-spark-read")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:

        def query() -> Any:
            # A new DataFrame each time: Spark keeps a Python data source's rows with the DataFrame,
            # so collecting the same one again would not read the topic again.
            frame = spark.read.format("txnkeeper").options(**options).load()
            return frame, frame.select(F.count("*").alias("rows"), F.sum(F.length("payload")).alias("bytes"))

        frame, first = query()
        started = time.perf_counter()
        first.collect()  # warm-up: JVM, Python workers
        warm_up = time.perf_counter() - started
        best: dict[str, Any] | None = None
        for _ in range(rounds):
            started = time.perf_counter()
            (row,) = query()[1].collect()
            took = time.perf_counter() - started
            if best is None or took < best["seconds"]:
                best = {"seconds": took, "rows": row.rows, "bytes": row.bytes}
        assert best is not None
        return {**best, "partitions": frame.rdd.getNumPartitions(), "first_read_seconds": round(warm_up, 3)}
    finally:
        spark.stop()


def python_read(options: dict[str, str]) -> dict[str, Any]:
    """The same parts read in this one process without Spark (what one executor core does)."""
    from txnkeeper.spark.driver import plan
    from txnkeeper.spark.plan import parse_options
    from txnkeeper.spark.read import read_part

    parsed = parse_options(options)
    started = time.perf_counter()
    rows = size = 0
    for part in plan(parsed):
        for row in read_part(part, parsed):
            rows += 1
            size += len(row[9])  # type: ignore[arg-type]
    return {"seconds": time.perf_counter() - started, "rows": rows, "bytes": size}


async def client_consume(tc: Pod, store: Pod, expected: int) -> dict[str, Any]:
    from txnkeeper.client import Client

    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, f"bench-{time.monotonic_ns()}")
        started = time.perf_counter()
        rows = size = 0
        while rows < expected:
            message = await consumer.receive(timeout=120)
            consumer.acknowledge(message)
            rows += 1
            size += len(message.data)
        return {"seconds": time.perf_counter() - started, "rows": rows, "bytes": size}


def rates(result: dict[str, Any]) -> dict[str, Any]:
    seconds = result["seconds"]
    return {
        **result,
        "seconds": round(seconds, 3),
        "rows_per_s": round(result["rows"] / seconds),
        "mib_per_s": round(result["bytes"] / MIB / seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64, help="committed payload MiB (half offloaded)")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2, help="timed Spark reads per master (best kept)")
    parser.add_argument("--dir", help="where the pods and the tier live (default: a temporary directory)")
    ns = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-spark-read-", dir=ns.dir) as tmp:
        workdir = Path(tmp)
        (workdir / "token").write_text(TOKEN)
        (workdir / "token").chmod(0o600)
        (workdir / "cluster-secret").write_text(secrets.token_urlsafe(32))
        (workdir / "cluster-secret").chmod(0o600)
        tier = workdir / "tier"
        tier.mkdir()
        offload = {
            "managedLedgerOffloadDriver": "filesystem",
            "fileSystemURI": str(tier),
            "managedLedgerOffloadThresholdInBytes": -1,
            "managedLedgerOffloadDeletionLagMs": 0,
        }
        tc = Pod(workdir, "tc-0", "coordinator").start()
        store = Pod(workdir, "pas-0", "store", {"offload": offload}).start()
        try:
            total = ns.mib * MIB // ns.message_bytes
            half = total // 2
            started = time.perf_counter()
            aborted = asyncio.run(produce(tc, store, half, ns.message_bytes, 0))
            store.post("offload")
            store.stop()  # closes the ledger: the next offload deletes its local file
            store.start()
            store.post("offload")
            aborted += asyncio.run(produce(tc, store, total - half, ns.message_bytes, half))
            produced_s = time.perf_counter() - started
            state = store.get("/admin/v1/topics/read-state?" + urllib.parse.urlencode({"topic": TOPIC}))
            options = {"topic": TOPIC, "adminUrl": f"http://{store.admin}", "offload": json.dumps(offload)}
            plain = rates(python_read(options))
            one = rates(spark_read("local[1]", options, ns.rounds))
            two = rates(spark_read("local[2]", options, ns.rounds))
            consumed = rates(asyncio.run(client_consume(tc, store, one["rows"])))
        finally:
            store.stop()
            tc.stop()
    print(
        json.dumps(
            {
                "mib": ns.mib,
                "message_bytes": ns.message_bytes,
                "aborted_messages_skipped": aborted,
                "produce_seconds": round(produced_s, 1),
                "ledgers": [
                    (item["ledgerId"], item["entries"], item["tierOnly"]) for item in state["ledgers"]
                ],
                "python_read_no_spark": plain,
                "spark_local1": one,
                "spark_local2": two,
                "client_consume": consumed,
                "spark1_vs_client": round(one["rows_per_s"] / consumed["rows_per_s"], 2),
                "spark2_vs_spark1": round(two["rows_per_s"] / one["rows_per_s"], 2),
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
