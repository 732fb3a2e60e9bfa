"""Shard move benchmark (issue 27): how long moving one shard takes, and what its clients feel.

Starts real processes: one coordinator and two store pods with placement (``--replicas 2``), fills one
shard of pod 0 with --sizes MiB of messages through the client, then moves that shard to pod 1 with
``txnkeeper.admin.move.move_shard`` (the §12 steps the operator and ``txnkeeper admin shards move``
take: pre-copy of the closed ledgers while the source serves, fence, copy of the rest with checksums,
switch, release) while two clients keep working on other topics of the same shard: a plain producer
and a transactional one (send + commit). For each size and tier it reports the move's time, the pause
(fence -> switch) as the driver saw it and as each client felt it (the longest gap between two of its
successful operations around the move), the bytes copied during the pre-copy and during the pause,
and each client's throughput during the move against the 10 seconds before it (and over the 10 seconds
from the move's start, or the move if longer: a sub-second move is mostly its pause).

Tiers: ``none`` (every byte is copied pod to pod) and ``filesystem`` (both pods offload to the same
directory, as pods of one resource share their tier: threshold 0, deletion lag 0, and the move starts
once every closed ledger of the filled topic is offloaded and its local file deleted, so only the
metadata and the data not yet offloaded move). ``--deletion-lag-ms N`` > 0: the local files stay (their
segments complete in the tier), and a target sharing the tier takes them from it instead of copying.

    .venv/bin/python bench/rebalance.py [--sizes 10,100,1024] [--tiers none,filesystem] [--no-precopy]
        [--precopy-mib-per-s N] [--deletion-lag-ms N] [--payload 65536] [--dir /path]
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

from txnkeeper.admin.move import move_shard, unload
from txnkeeper.client.client import Client
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.placement import DEFAULT_PRECOPY_MIB_PER_S, Member
from txnkeeper.ledger.names import encode_name

SHARDS = 32  # Placement.initial("store-shards", 2): 16 per replica
READY_TIMEOUT = 120.0
OFFLOAD_TIMEOUT = 600.0
# Long enough that the clients' own variation (fsync latency on a shared disk) does not decide the
# ratio; the same length after the move shows how much the rate wanders without one.
BEFORE_S = 10.0
AFTER_S = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.done if start <= t <= end) / max(end - start, 1e-3)

    def figures(self, start: float, end: float, precopied: float) -> dict[str, Any]:
        """``precopied``: when the pre-copy ended (the fence began)."""
        window = [t for t in self.done if start - BEFORE_S <= t <= end + AFTER_S]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        before = self.rate(start - BEFORE_S, start)
        during = self.rate(start, end)
        after = self.rate(end, end + AFTER_S)
        # A move shorter than the windows is mostly its pause (a 0.2 s gap in a 0.3 s move): the same
        # length as the baseline, from the move's start, says what the clients' throughput lost.
        ten_s = self.rate(start, max(end, start + BEFORE_S))
        precopy = self.rate(start, precopied) if precopied - start > 0.05 else None
        return {
            "longest_pause_s": round(max(gaps, default=0.0), 3),
            "ops_per_s_before": round(before, 1),
            "ops_per_s_during": round(during, 1),
            "ops_per_s_after": round(after, 1),
            "window_vs_before": round(ten_s / before, 2) if before else None,
            "during_vs_before": round(during / before, 2) if before else None,
            # The copy's share of the move: what the data costs the clients, apart from the pause.
            "during_precopy_vs_before": round(precopy / before, 2)
            if before and precopy is not None
            else None,
            "errors": self.errors,
            "last_error": self.last_error[:300],
        }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuShares:
    """Cores each process used between marks: where the two cores went before and during a move."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._marks: list[tuple[float, dict[str, float]]] = []

    def mark(self) -> None:
        self._marks.append((time.monotonic(), {n: cpu_seconds(p) for n, p in self._pids.items()}))

    def between(self, first: int, second: int) -> dict[str, float]:
        (t0, a), (t1, b) = self._marks[first], self._marks[second]
        return {n: round((b[n] - a[n]) / max(t1 - t0, 1e-3), 2) for n in self._pids}


def tier_config(root: Path, lag_ms: int = 0) -> list[str]:
    """Both store pods offload to one directory (a shared tier), everything at once, local copies
    deleted as soon as their segments are complete."""
    (root / "tier").mkdir()
    config = root / "store-config.json"
    offload = {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(root / "tier"),
        "managedLedgerOffloadThresholdInBytes": 0,
        "managedLedgerOffloadDeletionLagMs": lag_ms,
    }
    config.write_text(json.dumps({"offload": offload}))
    return ["--config", str(config), "--release", "3.0.0"]  # offload segments: format level 3


def local_ledgers(pod: Pod, topic: str) -> list[Path]:
    return sorted((pod.dir / "data" / "ledgers" / encode_name(topic) / "ledgers").glob("*.ledger"))


async def offload_now(pod: Pod, topic: str, token: str) -> None:
    """Pulsar's ``topics offload``: the streaming segment closes, so the closed ledgers it holds are
    complete in the tier (a streaming segment otherwise stays open up to its rollover time)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{pod.admin}/admin/v1/topics/offload",
            params={"topic": topic},
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        if response.status != 200:
            raise RuntimeError(f"offload of {topic}: HTTP {response.status}: {await response.text()}")


async def wait_offloaded(pod: Pod, topic: str) -> float:
    """Until only the open ledger of ``topic`` is still a local file (the rest offloaded, deleted)."""
    began = time.monotonic()
    while len(local_ledgers(pod, topic)) > 1:
        if time.monotonic() - began > OFFLOAD_TIMEOUT:
            raise TimeoutError(f"{topic} not offloaded in {OFFLOAD_TIMEOUT}s: see {pod.dir / 'serve.log'}")
        await asyncio.sleep(0.2)
    return time.monotonic() - began


async def one_size(
    root: Path, mib: int, payload_size: int, tier: str, *, precopy: bool, rate: int | None, lag_ms: int = 0
) -> dict[str, Any]:
    token = (root / "token").read_text()
    tc = Pod(root, "tc-0", "coordinator", ["--coordinators", "1"])
    extra = ["--replicas", "2", *(tier_config(root, lag_ms) if tier == "filesystem" else [])]
    stores = [Pod(root, f"pas-{i}", "store", extra) for i in range(2)]
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
            offload_wait_s = 0.0
            if tier == "filesystem":
                # Already offloaded when the move starts: the open ledger is closed (an unload), the
                # topic reopened by one more message, and every closed ledger offloaded and deleted.
                began = time.monotonic()
                await unload(stores[0].admin, filled, token=token)
                await producer.send(payload)
                await offload_now(stores[0], filled, token)
                if lag_ms == 0:  # else the local files stay: the segments are complete (tier-held)
                    await wait_offloaded(stores[0], filled)
                offload_wait_s = time.monotonic() - began
            local_bytes = sum(p.stat().st_size for p in local_ledgers(stores[0], filled))
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
            cpu = CpuShares({"clients": os.getpid(), **{p.dir.name: p.process.pid for p in (tc, *stores)}})
            cpu.mark()
            await asyncio.sleep(BEFORE_S)
            cpu.mark()
            start = time.monotonic()
            report = await move_shard(
                shard,
                stores[0].admin,
                stores[1].admin,
                token=token,
                precopy=precopy,
                precopy_bytes_per_second=rate,
            )
            end = time.monotonic()
            cpu.mark()
            await asyncio.sleep(AFTER_S)
            for worker in workers:
                worker.stop.set()
            await asyncio.gather(*tasks)
        return {
            "shard_mib": mib,
            "tier": tier,
            "deletion_lag_ms": lag_ms if tier == "filesystem" else None,
            "precopy": precopy,
            "precopy_mib_per_s_bound": round(rate / 1024 / 1024, 1) if rate else None,
            "fill_s": round(fill_s, 2),
            "offload_wait_s": round(offload_wait_s, 2),
            "local_ledger_bytes_before_move": local_bytes,
            "move_s": round(end - start, 3),
            "pause_s": report.pause_s,  # the driver's fence call -> the target's new record
            "precopy_bytes": report.precopy_bytes,
            "pause_copied_bytes": report.pulled_bytes,
            "manifest_bytes": report.bytes,
            "manifest_files": report.files,
            "precopy_s": round(report.precopy_s, 3),
            "clients": {w.name: w.figures(start, end, start + report.precopy_s) for w in workers},
            "cpu_cores_before": cpu.between(0, 1),
            "cpu_cores_during": cpu.between(1, 2),
        }
    finally:
        for pod in (*stores, tc):
            pod.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", "--sizes-mib", default="10,100", help="shard sizes in MiB (1024: 1 GiB)")
    parser.add_argument("--tiers", default="none,filesystem", help="none and/or filesystem (a shared tier)")
    parser.add_argument("--no-precopy", action="store_true", help="copy everything inside the pause")
    parser.add_argument(
        "--precopy-mib-per-s",
        type=float,
        default=float(DEFAULT_PRECOPY_MIB_PER_S),
        help="bound the pre-copy (default: the operator's default; 0: unbounded)",
    )
    parser.add_argument(
        "--deletion-lag-ms", type=int, default=0, help="the tier's deletion lag (> 0: local copies stay)"
    )
    parser.add_argument("--payload", type=int, default=65536)
    parser.add_argument("--dir", type=Path, default=None, help="where the pods' data goes (default: temp)")
    args = parser.parse_args()
    results = []
    load_before = os.getloadavg()
    for tier in args.tiers.split(","):
        if tier not in ("none", "filesystem"):
            parser.error(f"--tiers: {tier!r} is neither none nor filesystem")
        for mib in (int(s) for s in args.sizes.split(",")):
            root = Path(tempfile.mkdtemp(prefix="rebalance-bench-", dir=args.dir))
            try:
                (root / "token").write_text("bench-token")
                (root / "token").chmod(0o600)
                (root / "cluster-secret").write_bytes(os.urandom(32))
                (root / "cluster-secret").chmod(0o600)
                rate = int(args.precopy_mib_per_s * 1024 * 1024) if args.precopy_mib_per_s else None
                run = one_size(
                    root,
                    mib,
                    args.payload,
                    tier,
                    precopy=not args.no_precopy,
                    rate=rate,
                    lag_ms=args.deletion_lag_ms,
                )
                results.append(asyncio.run(run))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "benchmark": "rebalance",
                "load_average_1m_before": round(load_before[0], 2),
                "load_average_1m": round(load[0], 2),
                "cpus": os.cpu_count(),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
