"""Recovery benchmark: how long a restarted store pod takes to be ready, against its retained topic data.

For each size it writes that much topic data (messages of --payload bytes, one transaction in ten
aborted, a marker every --txn-size messages) through the store's own TopicService into a fresh data
directory laid out as ``txnkeeper serve --role store`` expects, then starts real ``txnkeeper serve``
processes on it and measures the time from spawning the process to ``/ready`` answering 200:

- ``full_replay_s``: without a transaction buffer snapshot (deleted first): every live entry is replayed;
- ``snapshot_s``: with the snapshot the previous (gracefully stopped) pod wrote: only what it does not
  cover is replayed;
- ``empty_s``: an empty data directory, the process's own start-up cost.

Then, for each of --records, it writes that many live transaction-log records (open transactions) for
coordinator 0 and measures a ``txnkeeper serve --role coordinator`` pod's time to ``/ready`` twice
(``coordinator``): ``full_replay_s`` with no transaction log snapshot (the whole log is replayed), and
``snapshot_s`` after that pod's graceful stop wrote one (docs/contracts.md, "Transaction log
snapshot"). ``--only store|coordinator`` runs one half.

Prints one JSON document with the sizes, times and the growth ratio of the largest to the smallest size
(``growth``; data grows by ``data_ratio``). Figures depend on the machine and its load.

    .venv/bin/python bench/recovery.py [--sizes-mib 64,256,1024] [--payload 8192] [--dir /path]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.topic.pending_ack_log import PendingAckLogAdapter
from txnkeeper.topic.service import SNAPSHOT_DIR, TopicLedger, TopicService
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import TransactionLogStore

TOPIC = "persistent://bench/ns/recovery"
READY_TIMEOUT = 600.0


async def write_data(data_dir: Path, size: int, payload_size: int, txn_size: int) -> int:
    """Write ``size`` bytes of messages the way a store pod would; returns the number of entries."""
    factory = ManagedLedgerFactory(data_dir / "ledgers")

    async def open_ledger(topic: str) -> TopicLedger:
        return await factory.open(topic)

    async def open_pending_ack(topic: str, subscription: str) -> PendingAckLogAdapter:
        return PendingAckLogAdapter(await PendingAckStore.open(factory, topic, subscription))

    service = TopicService(data_dir / "store" / "subscriptions.json", open_ledger, open_pending_ack)
    await service.recover()
    await service.subscription(TOPIC, "bench")  # registered: the pod opens the topic before ready
    payload = b"x" * payload_size
    messages = max(1, size // payload_size)
    entries = 0
    for txn_number, start in enumerate(range(0, messages, txn_size), 1):
        txn = TxnID(7, txn_number)
        count = min(txn_size, messages - start)
        await asyncio.gather(*(service.publish(TOPIC, payload, "", txn) for _ in range(count)))
        await service.end_txn_on_partition(TOPIC, txn, commit=txn_number % 10 != 0)
        entries += count + 1
    await service.close()
    await factory.close()
    return entries


async def write_txn_log(data_dir: Path, records: int) -> None:
    """``records`` live records of coordinator 0: open transactions (NEW, ADD_PARTITION,
    ADD_SUBSCRIPTION each) with an hour's timeout, so the restarted coordinator only loads them."""
    factory = ManagedLedgerFactory(data_dir / "ledgers")
    batching = BatchedWriteConfig(enabled=True, max_records=512, max_size_bytes=4 << 20, max_delay_millis=1)
    store = await TransactionLogStore.open(factory, 0, batching)
    now = int(time.time() * 1000)
    pending: list[Any] = []
    op = tm.TransactionMetadataEntry.TransactionMetadataOp
    for seq in range(1, records // 3 + 1):
        for record in (
            tm.TransactionMetadataEntry(
                metadata_op=op.NEW, timeout_ms=3_600_000, start_time=now, last_modification_time=now,
                max_local_txn_id=seq, owner="bench",
            ),
            tm.TransactionMetadataEntry(
                metadata_op=op.ADD_PARTITION, partitions=[f"persistent://bench/ns/t-{seq % 16}"],
                last_modification_time=now,
            ),
            tm.TransactionMetadataEntry(
                metadata_op=op.ADD_SUBSCRIPTION, last_modification_time=now,
                subscriptions=[tm.Subscription(topic="persistent://bench/ns/t", subscription="s")],
            ),
        ):  # fmt: skip
            record.txnid_most_bits = 0
            record.txnid_least_bits = seq
            pending.append(store.append(record))
        if len(pending) >= 6000:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    await store.close()
    await factory.close()


def time_to_ready(data_dir: Path, workdir: Path, role: str = "store") -> float:
    """Seconds from spawning ``txnkeeper serve --role store`` on ``data_dir`` to /ready; stops it
    gracefully afterwards (which writes a fresh snapshot)."""
    token = workdir / "token"
    token.write_text("bench")
    token.chmod(0o600)
    ports = workdir / "ports.json"
    ports.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "txnkeeper.cli", "serve", "--role", role, "--data-dir", str(data_dir),
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pod-name", f"{role}-0",
        "--ports-file", str(ports), "--admin-token-file", str(token), "--log-level", "WARNING",
    ]  # fmt: skip
    with open(workdir / "serve.log", "ab") as log:
        began = time.monotonic()
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        while time.monotonic() - began < READY_TIMEOUT:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited with {process.returncode}; see {workdir / 'serve.log'}")
            if ports.exists():
                admin = json.loads(ports.read_text())["admin"]
                try:
                    with urllib.request.urlopen(f"http://{admin}/ready", timeout=5) as response:
                        if response.status == 200:
                            return time.monotonic() - began
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.01)
        raise TimeoutError(f"not ready within {READY_TIMEOUT}s")
    finally:
        process.terminate()
        process.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="64,256,1024")
    parser.add_argument("--payload", type=int, default=8192)
    parser.add_argument("--records", default="100000,300000,1000000", help="live txn-log records")
    parser.add_argument("--txn-size", type=int, default=100, help="messages per transaction")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the data (default: a temp dir)"
    )
    parser.add_argument("--only", choices=("store", "coordinator"), default=None)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")] if args.only != "coordinator" else []
    root = Path(tempfile.mkdtemp(prefix="recovery-bench-", dir=args.dir))
    results: list[dict[str, Any]] = []
    try:
        empty = root / "empty"
        empty.mkdir()
        empty_s = time_to_ready(
            empty / "data", empty, "store" if args.only != "coordinator" else "coordinator"
        )
        for mib in sizes:
            workdir = root / f"{mib}MiB"
            workdir.mkdir()
            data_dir = workdir / "data"
            began = time.monotonic()
            entries = asyncio.run(write_data(data_dir, mib * 1024 * 1024, args.payload, args.txn_size))
            write_s = time.monotonic() - began
            shutil.rmtree(data_dir / "store" / SNAPSHOT_DIR, ignore_errors=True)
            full = time_to_ready(data_dir, workdir)
            snapshot = time_to_ready(data_dir, workdir)
            results.append(
                {"topic_data_mib": mib, "entries": entries, "write_s": round(write_s, 2),
                 "full_replay_s": round(full, 3), "snapshot_s": round(snapshot, 3)}
            )  # fmt: skip
            shutil.rmtree(workdir)
        coordinator: list[dict[str, Any]] = []
        for records in (int(r) for r in args.records.split(",") if args.only != "store"):
            workdir = root / f"{records}records"
            workdir.mkdir()
            began = time.monotonic()
            asyncio.run(write_txn_log(workdir / "data", records))
            write_s = time.monotonic() - began
            full = time_to_ready(workdir / "data", workdir, "coordinator")  # its stop writes a snapshot
            snapshot = time_to_ready(workdir / "data", workdir, "coordinator")
            coordinator.append(
                {"live_records": records, "write_s": round(write_s, 2),
                 "full_replay_s": round(full, 3), "snapshot_s": round(snapshot, 3)}
            )  # fmt: skip
            shutil.rmtree(workdir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report: dict[str, Any] = {"empty_s": round(empty_s, 3)}
    if results:
        first, last = results[0], results[-1]
        report.update(
            payload_bytes=args.payload,
            sizes=results,
            data_ratio=round(last["topic_data_mib"] / first["topic_data_mib"], 2),
            growth_full_replay=round(last["full_replay_s"] / first["full_replay_s"], 2),
            growth=round(last["snapshot_s"] / first["snapshot_s"], 2),
        )
    if coordinator:
        first, last = coordinator[0], coordinator[-1]
        report.update(
            coordinator=coordinator,
            coordinator_records_ratio=round(last["live_records"] / first["live_records"], 2),
            coordinator_growth_full_replay=round(last["full_replay_s"] / first["full_replay_s"], 2),
            coordinator_growth=round(last["snapshot_s"] / first["snapshot_s"], 2),
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
