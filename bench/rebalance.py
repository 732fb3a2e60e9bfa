"""Shard move benchmark (issue 27): how long moving one shard takes, and what its clients feel.

Starts real processes: one coordinator and two store pods with placement (``--replicas 2``), fills one
shard of pod 0 with --sizes-mib of messages through the client, then moves that shard to pod 1 with
``txnkeeper.admin.move.move_shard`` (the §12 steps the operator and ``txnkeeper admin shards move``
take: fence, copy pod to pod with checksums, switch, release) while two clients keep working on other
topics of the same shard: a plain producer and a transactional one (send + commit). For each size it
reports the move's time and bytes, the longest gap each client saw between two successful operations
around the move (its pause), and their throughput during the move against the seconds before it.

Offloaded shards are not measured: the store side always copies pod to pod (offloaded segments stay in
the tier and are not copied, so a shard whose ledgers are offloaded moves only its local tail).

    .venv/bin/python bench/rebalance.py [--sizes-mib 10,100] [--payload 65536] [--dir /path]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from txnkeeper.admin.move import move_shard
from txnkeeper.client.client import Client
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.placement import Member

SHARDS = 32  # Placement.initial("store-shards", 2): 16 per replica
READY_TIMEOUT = 120.0
BEFORE_S = 3.0
AFTER_S = 2.0


class Pod:
    def __init__(self, root: Path, name: str, role: str, extra: list[str]) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        token = root / "token"
        secret = root / "cluster-secret"
        ports = self.dir / "ports.json"
        cmd = [
            sys.executable, "-m", "txnkeeper.cli", "serve", "--role", role,
            "--data-dir", str(self.dir / "data"),
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pod-name", name,
            "--ports-file", str(ports), "--admin-token-file", str(token), "--log-level", "WARNING",
            "--cluster-secret-file", str(secret), *extra,
        ]  # fmt: skip
        with open(self.dir / "serve.log", "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        began = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited {self.process.returncode}: see {self.dir / 'serve.log'}")
            if ports.exists() and self._ready(json.loads(ports.read_text())["admin"]):
                doc = json.loads(ports.read_text())
                self.listen, self.admin = doc["listen"], f"http://{doc['admin']}"
                return
            if time.monotonic() - began > READY_TIMEOUT:
                raise TimeoutError(f"{name} not ready in {READY_TIMEOUT}s")
            time.sleep(0.05)

    @staticmethod
    def _ready(admin: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{admin}/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def topics_in_shard(shard: int, count: int, prefix: str) -> list[str]:
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"persistent://bench/rebalance/{prefix}-{i}"
        if zlib.crc32(name.encode()) % SHARDS == shard:
            found.append(name)
        i += 1
    return found


async def give_members(stores: list[Pod], token: str) -> None:
    """What the operator does first: a record naming every pod's address, so redirects can be followed."""
    async with aiohttp.ClientSession() as http:
        admin = AdminClient(http, timeout_seconds=30, token=token)
        record = await admin.get_placement(stores[0].admin)
        members = {i: Member(s.listen, f"pulsar://{s.listen}", s.admin) for i, s in enumerate(stores)}
        record = replace(record, epoch=record.epoch + 1, members=members)
        for store in stores:
            await admin.put_placement(store.admin, record, token)


class Worker:
    """One client loop: the monotonic times of its successful operations."""

    def __init__(self, name: str, operation: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.operation = operation
        self.done: list[float] = []
        self.errors = 0
        self.last_error = ""
        self.stop = asyncio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                await self.operation()
            except Exception as exc:  # a refused or lost operation: the pause goes on until one succeeds
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.01)
                continue
            self.done.append(time.monotonic())

    def figures(self, start: float, end: float) -> dict[str, Any]:
        window = [t for t in self.done if start - BEFORE_S <= t <= end + AFTER_S]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        before = sum(1 for t in self.done if start - BEFORE_S <= t < start) / BEFORE_S
        during = sum(1 for t in self.done if start <= t <= end) / max(end - start, 1e-3)
        return {
            "longest_pause_s": round(max(gaps, default=0.0), 3),
            "ops_per_s_before": round(before, 1),
            "ops_per_s_during": round(during, 1),
            "during_vs_before": round(during / before, 2) if before else None,
            "errors": self.errors,
            "last_error": self.last_error[:300],
        }


async def one_size(root: Path, mib: int, payload_size: int) -> dict[str, Any]:
    token = (root / "token").read_text()
    tc = Pod(root, "tc-0", "coordinator", ["--coordinators", "1"])
    stores = [Pod(root, f"pas-{i}", "store", ["--replicas", "2"]) for i in range(2)]
    try:
        shard = 0  # owned by pas-0 in the first record (shard mod 2)
        await give_members(stores, token)
        filled, plain_topic, txn_topic = topics_in_shard(shard, 3, f"t{mib}")
        async with Client(coordinators=[tc.listen], stores=[s.listen for s in stores]) as client:
            producer = await client.create_producer(filled)
            payload = os.urandom(payload_size)
            began = time.monotonic()
            sends = max(1, mib * 1024 * 1024 // payload_size)
            for first in range(0, sends, 64):
                await asyncio.gather(*(producer.send(payload) for _ in range(min(64, sends - first))))
            fill_s = time.monotonic() - began
            plain = await client.create_producer(plain_topic)
            txn_producer = await client.create_producer(txn_topic)

            async def send() -> None:
                await plain.send(b"p" * 256)

            async def transact() -> None:
                txn = await client.new_transaction(timeout_ms=30_000)
                await txn_producer.send(b"t" * 256, txn=txn)
                await txn.commit()

            workers = [Worker("producer", send), Worker("transactions", transact)]
            tasks = [asyncio.create_task(w.run()) for w in workers]
            await asyncio.sleep(BEFORE_S)
            start = time.monotonic()
            report = await move_shard(shard, stores[0].admin, stores[1].admin, token=token)
            end = time.monotonic()
            await asyncio.sleep(AFTER_S)
            for worker in workers:
                worker.stop.set()
            await asyncio.gather(*tasks)
        return {
            "shard_mib": mib,
            "fill_s": round(fill_s, 2),
            "move_s": round(end - start, 3),
            "moved_bytes": report.bytes,
            "moved_files": report.files,
            "moved_mib_per_s": round(report.bytes / (1024 * 1024) / max(end - start, 1e-3), 1),
            "clients": {w.name: w.figures(start, end) for w in workers},
        }
    finally:
        for pod in (*stores, tc):
            pod.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="10,100", help="shard sizes (1024 for the 1 GiB case)")
    parser.add_argument("--payload", type=int, default=65536)
    parser.add_argument("--dir", type=Path, default=None, help="where the pods' data goes (default: temp)")
    args = parser.parse_args()
    results = []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        root = Path(tempfile.mkdtemp(prefix="rebalance-bench-", dir=args.dir))
        try:
            (root / "token").write_text("bench-token")
            (root / "token").chmod(0o600)
            (root / "cluster-secret").write_bytes(os.urandom(32))
            (root / "cluster-secret").chmod(0o600)
            results.append(asyncio.run(one_size(root, mib, args.payload)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "benchmark": "rebalance",
                "load_average_1m": round(load[0], 2),
                "offload_tier": "not measured (the store side copies pod to pod)",
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
