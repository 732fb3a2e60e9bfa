"""Per-customer totals of committed orders, read from a txnkeeper topic with Spark, written to Parquet.

Each message of the orders topic is a JSON order ``{"customer": str, "amountCents": int}`` whose key is
the customer. Orders of aborted transactions, and of transactions still open, are not in the totals:
the ``txnkeeper`` data source returns the committed messages only, whether they live on the store pod's
ledgers or in the offload tier.

Against a running store pod (its admin API; ``--offload-json`` with the pods' ``offload`` section when
the topic has ledgers only the tier holds)::

    .venv/bin/python examples/spark_order_totals.py --admin-url http://127.0.0.1:8081 \\
        --topic persistent://public/default/orders --output /tmp/order-totals

Self-contained (starts a coordinator and a store pod on this machine, writes committed and aborted
orders, runs the pipeline, stops the pods)::

    .venv/bin/python examples/spark_order_totals.py --self-contained --output /tmp/order-totals
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
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ORDER_SCHEMA = "customer STRING, amountCents BIGINT"


def order_totals(spark: Any, options: dict[str, str], output: str) -> list[tuple[str, int, int]]:
    """The pipeline: committed orders -> per-customer (orders, total cents) -> Parquet at ``output``."""
    from pyspark.sql import functions as F

    orders = (
        spark.read.format("txnkeeper")
        .options(**options)
        .load()
        .select(F.from_json(F.col("payload").cast("string"), ORDER_SCHEMA).alias("order"))
        .select("order.*")
    )
    totals = orders.groupBy("customer").agg(
        F.count("*").alias("orders"), F.sum("amountCents").alias("totalCents")
    )
    totals.write.mode("overwrite").parquet(output)
    return sorted((r.customer, r.orders, r.totalCents) for r in spark.read.parquet(output).collect())


# ---- --self-contained: two real pods on this machine and some orders ---------------------------------


def _serve(workdir: Path, name: str, role: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    pod_dir = workdir / name
    pod_dir.mkdir()
    ports = pod_dir / "ports.json"
    command = [
        sys.executable, "-m", "txnkeeper.cli", "serve", "--role", role, "--data-dir", str(pod_dir / "data"),
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pod-name", name,
        "--ports-file", str(ports), "--cluster-secret-file", str(workdir / "cluster-secret"),
    ]  # fmt: skip
    log = open(pod_dir / "serve.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {(pod_dir / 'serve.log').read_text()[-2000:]}")
        if ports.exists():
            addresses: dict[str, str] = json.loads(ports.read_text())
            try:
                with urllib.request.urlopen(f"http://{addresses['admin']}/ready", timeout=2):
                    return process, addresses
            except OSError:
                pass
        time.sleep(0.1)  # poll interval of a condition with a deadline
    raise TimeoutError(f"{name} not ready within 60 s")


@contextmanager
def local_pods() -> Iterator[tuple[str, str, str]]:
    """(coordinator address, store address, store admin URL) of two pods started here."""
    with tempfile.TemporaryDirectory(prefix="txnkeeper-example-") as tmp:
        workdir = Path(tmp)
        secret = workdir / "cluster-secret"
        secret.write_text(secrets.token_urlsafe(32))
        secret.chmod(0o600)
        started = []
        try:
            tc, tc_ports = _serve(workdir, "tc-0", "coordinator")
            started.append(tc)
            store, store_ports = _serve(workdir, "pas-0", "store")
            started.append(store)
            yield tc_ports["listen"], store_ports["listen"], f"http://{store_ports['admin']}"
        finally:
            for process in started:
                process.send_signal(signal.SIGTERM)
                process.wait(30)


async def write_orders(coordinator: str, store: str, topic: str) -> dict[str, tuple[int, int]]:
    """Committed and aborted orders; returns the committed ones' (orders, total cents) per customer."""
    from txnkeeper.client import Client

    expected: dict[str, tuple[int, int]] = {}
    async with Client(coordinators=[coordinator], stores=[store]) as client:
        producer = await client.create_producer(topic)
        for n in range(30):
            customer, amount = f"customer-{n % 4}", 100 + n
            txn = await client.new_transaction(timeout_ms=30_000)
            order = json.dumps({"customer": customer, "amountCents": amount}).encode()
            await producer.send(order, key=customer, txn=txn)
            if n % 5 == 4:  # every fifth order is cancelled: its transaction aborts
                await txn.abort()
                continue
            await txn.commit()
            count, total = expected.get(customer, (0, 0))
            expected[customer] = (count + 1, total + amount)
    return expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--admin-url", help="a store pod's admin API (comma-separated for several)")
    parser.add_argument("--topic", default="persistent://public/default/orders")
    parser.add_argument("--offload-json", help="the pods' offload section, when ledgers are tier-only")
    parser.add_argument("--output", required=True, help="Parquet directory for the totals")
    parser.add_argument("--master", default="local[2]", help="Spark master URL")
    parser.add_argument("--self-contained", action="store_true", help="start two pods here and write orders")
    ns = parser.parse_args(argv)
    if not ns.self_contained and not ns.admin_url:
        parser.error("give --admin-url of a running store pod, or --self-contained")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need txnkeeper installed
    from pyspark.sql import SparkSession

    from txnkeeper.spark import register

    spark = SparkSession.builder.master(ns.master).appName("order-totals").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        options = {"topic": ns.topic}
        if ns.offload_json:
            options["offload"] = ns.offload_json
        if not ns.self_contained:
            totals = order_totals(spark, {**options, "adminUrl": ns.admin_url}, ns.output)
            print(json.dumps({"totals": totals}))
            return 0
        with local_pods() as (coordinator, store, admin_url):
            expected = asyncio.run(write_orders(coordinator, store, ns.topic))
            totals = order_totals(spark, {**options, "adminUrl": admin_url}, ns.output)
        want = sorted((c, n, t) for c, (n, t) in expected.items())
        print(json.dumps({"totals": totals, "expected": want, "match": totals == want}))
        return 0 if totals == want else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
