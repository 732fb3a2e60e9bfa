"""Benchmark: transaction-log records/s with PIP-160 batching vs without, on the durable managed ledger.

For each writer count (1, 16, 256, 1024 by default), N coroutines each append transaction-log records
(NEW, ADD_PARTITION, ADD_SUBSCRIPTION, UPDATE, UPDATE: a transaction's life; with --with-deletes also
delete_txn in the background as the coordinator does) to a TransactionLogStore on a fresh data
directory, as fast as their own acknowledgements allow, for a fixed time. "batched" is the default
adaptive flush mode, "batched-delay" Pulsar's pure-delay mode; the summary gives each writer count's
ratio and p99 against "unbatched" and whether issue 12's goal is met. The same run
measures two unbatched baselines (batching disabled with the ledger's group commit still on, and with
one fsync per entry) so the ratios are fair on a noisy machine. fsyncs are counted through the ledger's
FileIO seam. Every record's latency is taken from its append call to its acknowledgement, in every mode.

Fairness on a shared machine: each mode's ``--seconds`` are split into ``--rounds`` rounds, and the
rounds of all modes are interleaved (round r runs the modes in an order rotated by r), each on a fresh
data directory; a mode's figures pool all its rounds (records, entries, fsyncs, every latency). The p99
at 16 writers is the tail of the disk's fsync times (every record waits for exactly one ledger write in
both modes), so a burst of other I/O during one mode's single 3 s run used to decide the p99 ratio on
its own; interleaved rounds spread such bursts over all modes. ``perRound`` keeps each round's rate and
p99 so the spread stays visible (with ``--components``, also where each round's latency went: ledger
fsyncs waited per record, fsync times, the loop's time between fsyncs, what slow records overlapped).
Before anything is measured, every mode runs once unmeasured: the first
run of a process is slower, and it used to be the batched mode's at 1 writer in every run.

Prints one JSON document. Figures depend on the machine and its load; compare ratios, not absolutes.
The process runs as ``txnkeeper serve`` does, in every mode: the runtime's garbage-collector policy
(``txnkeeper.gcpolicy``; ``--gc-threshold default`` shows CPython's, whose full collections dominate
the p99 with many writers) on uvloop when installed (``--event-loop asyncio`` for the standard loop),
with the runtime's 0.5 ms GIL switch interval (``txnkeeper.eventloop``).

    .venv/bin/python bench/txnlog_batching.py [--writers 1,16,256,1024] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnkeeper import gcpolicy, process_settings
from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.ledger import FileIO, ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.watermark import WATERMARK_FILE
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.process_settings import ProcessSettings
from txnkeeper.txnlog import TransactionLogStore, TxnID

Op = tm.TransactionMetadataEntry.TransactionMetadataOp
COORDINATOR = 0


class CountingIO(FileIO):
    """The real file layer, counting the syncs the ledger issues (and timing them for --components)."""

    def __init__(self, *, timed: bool = False) -> None:
        self.syncs = 0
        # (start, end) of every fdatasync of a ledger data file (not the watermark's), when timed.
        self.data_syncs: list[tuple[float, float]] | None = [] if timed else None

    def sync_data(self, fd: int) -> None:
        self.syncs += 1
        timed = self.data_syncs
        if timed is None:
            super().sync_data(fd)
            return
        start = time.perf_counter()
        super().sync_data(fd)
        end = time.perf_counter()
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) != WATERMARK_FILE:
            timed.append((start, end))

    def sync(self, fd: int) -> None:
        self.syncs += 1
        super().sync(fd)


def txn_life(seq: int) -> list[tm.TransactionMetadataEntry]:
    """The five records of one transaction, as a coordinator writes them."""
    now = 1_700_000_000_000 + seq
    records = [
        tm.TransactionMetadataEntry(
            metadata_op=Op.NEW,
            timeout_ms=60_000,
            start_time=now,
            last_modification_time=now,
            max_local_txn_id=seq,
            owner="bench-client",
        ),
        tm.TransactionMetadataEntry(
            metadata_op=Op.ADD_PARTITION,
            partitions=[f"persistent://public/default/orders-partition-{seq % 16}"],
            last_modification_time=now + 1,
        ),
        tm.TransactionMetadataEntry(
            metadata_op=Op.ADD_SUBSCRIPTION,
            subscriptions=[
                tm.Subscription(topic="persistent://public/default/orders", subscription="billing")
            ],
            last_modification_time=now + 2,
        ),
        tm.TransactionMetadataEntry(
            metadata_op=Op.UPDATE,
            expected_status=tm.OPEN,
            new_status=tm.COMMITTING,
            last_modification_time=now + 3,
        ),
        tm.TransactionMetadataEntry(
            metadata_op=Op.UPDATE,
            expected_status=tm.COMMITTING,
            new_status=tm.COMMITTED,
            last_modification_time=now + 4,
        ),
    ]
    for record in records:
        record.txnid_most_bits = COORDINATOR
        record.txnid_least_bits = seq
    return records


@dataclass
class Result:
    mode: str
    writers: int
    records: int
    seconds: float
    entries: int
    fsyncs: int
    latencies: list[float]
    cpu_seconds: float
    loadavg: float
    components: dict[str, Any] | None = field(default=None)

    @classmethod
    def pooled(cls, rounds: list[Result]) -> Result:
        """One mode's rounds as one result: counts and times add up, latencies are pooled."""
        return cls(
            rounds[0].mode,
            rounds[0].writers,
            sum(r.records for r in rounds),
            sum(r.seconds for r in rounds),
            sum(r.entries for r in rounds),
            sum(r.fsyncs for r in rounds),
            [x for r in rounds for x in r.latencies],
            sum(r.cpu_seconds for r in rounds),
            statistics.fmean(r.loadavg for r in rounds),
        )

    def round_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recordsPerSecond": round(self.records / self.seconds), "p99Ms": self.p99_ms()}
        if self.components is not None:
            out["components"] = self.components
        return out

    def p99_ms(self) -> float:
        lat = sorted(self.latencies)
        return round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 3) if lat else 0.0

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else 0.0

        return {
            "mode": self.mode,
            "writers": self.writers,
            "records": self.records,
            "recordsPerSecond": round(self.records / self.seconds),
            "entriesWritten": self.entries,
            "recordsPerEntry": round(self.records / self.entries, 1) if self.entries else 0.0,
            "fsyncs": self.fsyncs,
            "recordsPerFsync": round(self.records / self.fsyncs, 1) if self.fsyncs else 0.0,
            "latencyMs": {"p50": pct(0.50), "p99": pct(0.99), "mean": round(statistics.fmean(lat) * 1000, 3)},
            # CPU this process spent per record (all threads): less sensitive to other load than rates.
            "cpuMicrosPerRecord": round(self.cpu_seconds / self.records * 1e6, 2) if self.records else 0.0,
            "loadavg1m": round(self.loadavg, 2),
        }


@dataclass(frozen=True)
class Mode:
    writer: BatchedWriteConfig
    ledger: ManagedLedgerConfig


async def run_one(
    mode: str,
    setup: Mode,
    writers: int,
    seconds: float,
    warmup: float,
    *,
    delete: bool,
    components: bool = False,
) -> Result:
    with tempfile.TemporaryDirectory(prefix="txnlog-bench-") as tmp:
        io = CountingIO(timed=components)
        factory = ManagedLedgerFactory(Path(tmp), io=io)
        store = await TransactionLogStore.open(factory, COORDINATOR, setup.writer, ledger_config=setup.ledger)
        lives = [txn_life(seq) for seq in range(writers)]
        measuring = False
        stop = False
        latencies: list[float] = []
        # (submit, acknowledgement) of every measured record, for --components
        spans: list[tuple[float, float]] | None = [] if components else None
        counted = 0
        clock = time.perf_counter

        seqs = iter(range(writers, 1 << 62))
        deletes: set[asyncio.Task[None]] = set()

        async def writer(records: list[tm.TransactionMetadataEntry]) -> None:
            # One transaction after another; when it ends its records are deleted in the background,
            # as the coordinator does after answering the client.
            nonlocal counted
            append = store.append
            seq = records[0].txnid_least_bits
            while not stop:
                for record in records:
                    record.txnid_least_bits = seq  # serialized at append, so reuse is safe
                    t0 = clock()
                    await append(record)
                    if measuring:
                        t1 = clock()
                        latencies.append(t1 - t0)
                        counted += 1
                        if spans is not None:
                            spans.append((t0, t1))
                if delete:
                    task = asyncio.create_task(store.delete_txn(TxnID(COORDINATOR, seq)))
                    deletes.add(task)
                    task.add_done_callback(deletes.discard)
                seq = next(seqs)

        tasks = [asyncio.create_task(writer(life)) for life in lives]
        await asyncio.sleep(warmup)
        entries0 = store.internal_stats()["managedLedgerInternalStats"]["entriesAddedCounter"]
        syncs0 = io.syncs
        pauses: list[tuple[float, float]] = []
        gc_started = [0.0]

        def on_gc(phase: str, _info: dict[str, Any]) -> None:
            if phase == "start":
                gc_started[0] = clock()
            else:
                pauses.append((gc_started[0], clock()))

        if components:
            gc.callbacks.append(on_gc)
        measuring = True
        started, cpu_started = clock(), time.process_time()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed, cpu = clock() - started, time.process_time() - cpu_started
        if components:
            gc.callbacks.remove(on_gc)
        entries = store.internal_stats()["managedLedgerInternalStats"]["entriesAddedCounter"] - entries0
        syncs = io.syncs - syncs0
        stop = True
        await asyncio.gather(*tasks)
        await asyncio.gather(*deletes)
        await store.close()
        await factory.close()
        found = None
        if spans is not None and io.data_syncs is not None:
            found = latency_components(spans, io.data_syncs, pauses)
        return Result(
            mode, writers, counted, elapsed, entries, syncs, latencies, cpu, os.getloadavg()[0], found
        )


def latency_components(
    spans: list[tuple[float, float]], syncs: list[tuple[float, float]], pauses: list[tuple[float, float]]
) -> dict[str, Any]:
    """Where records' latency went: how many ledger fsyncs each waited for, how long those took, how
    long the loop worked between one fsync's end and the next one's start, and what the slow records
    (over 3x the median latency) overlapped: a fsync longer than the median latency, a GC pause, or
    neither (other load)."""
    syncs = sorted(syncs)
    ends = sorted(end for _, end in syncs)
    starts = [start for start, _ in syncs]
    waited = Counter(bisect.bisect_left(ends, ack) - bisect.bisect_left(ends, t0) for t0, ack in spans)
    first, last = (spans[0][0], max(ack for _, ack in spans)) if spans else (0.0, 0.0)
    measured = [(a, b) for a, b in syncs if first <= a and b <= last]

    def ms(values: list[float], p: float) -> float:
        values = sorted(values)
        return round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 3) if values else 0.0

    fsync_times = [b - a for a, b in measured]
    gaps = [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(measured)]
    median = sorted(b - a for a, b in spans)[len(spans) // 2] if spans else 0.0
    slow: Counter[str] = Counter()
    for t0, ack in spans:
        if ack - t0 <= 3 * median:
            continue
        if any(a < ack and b > t0 for a, b in pauses):
            slow["gcPause"] += 1
            continue
        # Ledger writes are serialized, so the fsyncs overlapping [t0, ack] are one run of indexes.
        overlapping = syncs[bisect.bisect_right(ends, t0) : bisect.bisect_left(starts, ack)]
        if any(b - a > median and a < ack and b > t0 for a, b in overlapping):
            slow["longFsync"] += 1
        else:
            slow["other"] += 1
    return {
        "ledgerFsyncsWaited": {str(k): v for k, v in sorted(waited.items())},
        "fsyncMs": {"p50": ms(fsync_times, 0.5), "p99": ms(fsync_times, 0.99)},
        "betweenFsyncsMs": {"p50": ms(gaps, 0.5), "p99": ms(gaps, 0.99)},
        "slowRecords": {"over3xMedian": sum(slow.values()), **slow},
        "gcPauses": len(pauses),
    }


def batched_mode(delay_ms: float) -> Mode:
    # The default flush mode, adaptive: no batch is held while the ledger is idle.
    return Mode(
        BatchedWriteConfig(enabled=True, max_delay_millis=delay_ms, flush_mode="adaptive"),
        ManagedLedgerConfig(),
    )


def batched_delay_mode(delay_ms: float) -> Mode:
    # Pulsar's pure-delay flush, for comparison with the adaptive mode.
    return Mode(
        BatchedWriteConfig(enabled=True, max_delay_millis=delay_ms, flush_mode="delay"), ManagedLedgerConfig()
    )


def unbatched_mode(_delay_ms: float) -> Mode:
    # Same ledger (group commit merges concurrent entries into one fsync): the fair baseline.
    return Mode(BatchedWriteConfig(enabled=False), ManagedLedgerConfig())


def unbatched_fsync_each_mode(_delay_ms: float) -> Mode:
    # One write + fsync per entry, as a log without group commit would do.
    return Mode(BatchedWriteConfig(enabled=False), ManagedLedgerConfig(group_commit=False))


MODES: dict[str, Callable[[float], Mode]] = {
    "batched": batched_mode,
    "batched-delay": batched_delay_mode,
    "unbatched": unbatched_mode,
    "unbatched-fsync-each": unbatched_fsync_each_mode,
}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    round_seconds = args.seconds / args.rounds
    # Warm the process up (thread pool, allocator, caches) before anything is measured: the first run
    # of a process was slower, and it used to be always the batched mode's at the first writer count.
    for mode in args.modes:
        await run_one(mode, MODES[mode](args.max_delay_ms), args.writers[0], 0.2, 0.2, delete=False)
    for writers in args.writers:
        by_round: dict[str, list[Result]] = {mode: [] for mode in args.modes}
        for index in range(args.rounds):
            shift = index % len(args.modes)
            for mode in args.modes[shift:] + args.modes[:shift]:
                gc.collect()
                setup = MODES[mode](args.max_delay_ms)
                result = await run_one(
                    mode,
                    setup,
                    writers,
                    round_seconds,
                    args.warmup,
                    delete=args.with_deletes,
                    components=args.components,
                )
                by_round[mode].append(result)
                print(json.dumps({"round": index, **result.to_json()}), file=sys.stderr)
        by_mode: dict[str, dict[str, Any]] = {}
        for mode, results in by_round.items():
            by_mode[mode] = Result.pooled(results).to_json()
            by_mode[mode]["perRound"] = [r.round_json() for r in results]
            runs.append(by_mode[mode])
        b = by_mode.get("batched")
        if b is None:
            continue
        row: dict[str, Any] = {
            "writers": writers,
            "batchedRecordsPerSecond": b["recordsPerSecond"],
            "batchedRecordsPerEntry": b["recordsPerEntry"],
            "batchedP99Ms": b["latencyMs"]["p99"],
        }
        if "batched-delay" in by_mode:
            row["batchedDelayRecordsPerSecond"] = by_mode["batched-delay"]["recordsPerSecond"]
            row["batchedDelayP99Ms"] = by_mode["batched-delay"]["latencyMs"]["p99"]
        u = by_mode.get("unbatched")
        if u is not None:
            # Issue 12's goal for the adaptive mode: >= 0.95x unbatched records/s and p99 <= 1.1x
            # unbatched p99 at every writer count, and >= 100k records/s, >= 100 records/entry at 1024.
            ratio = b["recordsPerSecond"] / max(u["recordsPerSecond"], 1)
            p99_ratio = b["latencyMs"]["p99"] / max(u["latencyMs"]["p99"], 1e-9)
            row["unbatchedP99Ms"] = u["latencyMs"]["p99"]
            row["ratioVsUnbatched"] = round(ratio, 2)
            row["p99RatioVsUnbatched"] = round(p99_ratio, 2)
            goal = ratio >= 0.95 and p99_ratio <= 1.1
            if writers == 1024:
                goal = goal and b["recordsPerSecond"] >= 100_000 and b["recordsPerEntry"] >= 100
            row["meetsIssue12Goal"] = goal
        for base in ("unbatched", "unbatched-fsync-each"):
            if base in by_mode:
                rate = by_mode[base]["recordsPerSecond"]
                camel = "".join(w.title() for w in base.split("-"))
                row[f"{camel[0].lower()}{camel[1:]}RecordsPerSecond"] = rate
                row[f"speedupVs{camel}"] = round(b["recordsPerSecond"] / max(rate, 1), 1)
        summary.append(row)
    return {
        "benchmark": "txnlog_batching",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "warmupSeconds": args.warmup,
            "maxDelayMillis": args.max_delay_ms,
            "maxRecords": 512,
            "flushModes": {"batched": "adaptive", "batched-delay": "delay (Pulsar)"},
            "ledger": "fsync; group commit except in unbatched-fsync-each",
            "deleteEndedTxns": args.with_deletes,
            "gcThreshold": list(gc.get_threshold()),
            "eventLoop": args.loop_name,
            "switchIntervalMs": round(sys.getswitchinterval() * 1000, 3),
        },
        "runs": runs,
        "summary": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--writers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 256, 1024]
    )
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["batched", "batched-delay", "unbatched", "unbatched-fsync-each"],
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="split each mode's --seconds into this many rounds, interleaved with the other modes'",
    )
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before each round measures")
    parser.add_argument("--max-delay-ms", type=float, default=1.0)
    parser.add_argument(
        "--with-deletes",
        action="store_true",
        help="also delete each ended transaction's records (cursor load)",
    )
    parser.add_argument(
        "--components",
        action="store_true",
        help="time every ledger fsync and record, and report per round where latency went",
    )
    process_settings.add_arguments(parser)
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds positive")
    for mode in args.modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}: use some of {','.join(MODES)}")
    settings = ProcessSettings.from_args_or_exit(parser, args)
    gcpolicy.freeze_startup_state()
    args.loop_name = settings.event_loop
    print(json.dumps(settings.run(main_async(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
