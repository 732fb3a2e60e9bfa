"""Managed-ledger append benchmark: group commit vs one fsync per append, in the same run.

Prints JSON: appends/s, fsyncs/s and p50/p99 append latency for 100-byte entries at 1, 16 and 256
concurrent appenders, for both modes, plus the group-commit speed-up at the highest concurrency.
Figures depend on the disk and on whatever else runs; compare modes within one run, not across runs.

    .venv/bin/python bench/ledger_append.py [--seconds 4] [--dir /path/on/the/disk/to/test]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from txnkeeper.ledger import FileIO, ManagedLedgerConfig, ManagedLedgerFactory

ENTRY = b"x" * 100
CONCURRENCY = (1, 16, 256)
MODES = {"group_commit": True, "fsync_per_append": False}


class CountingIO(FileIO):
    """The real file layer, counting data fsyncs of ledger files (entries) and of everything else.

    The acknowledged-entry watermark is fsynced beside the group commits but never in front of an
    acknowledgement, so "entries per fsync" counts only the ledger files' syncs; the others are reported
    apart as ``other_fsyncs_per_s``.
    """

    def __init__(self) -> None:
        self.syncs = 0
        self.other_syncs = 0
        self._ledger_fds: set[int] = set()
        self._lock = threading.Lock()

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        with self._lock:
            if path.suffix == ".ledger":
                self._ledger_fds.add(fd)
            else:
                self._ledger_fds.discard(fd)
        return fd

    def sync_data(self, fd: int) -> None:
        super().sync_data(fd)
        with self._lock:
            if fd in self._ledger_fds:
                self.syncs += 1
            else:
                self.other_syncs += 1


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def run_case(root: Path, mode: str, appenders: int, seconds: float) -> dict[str, Any]:
    io = CountingIO()
    factory = ManagedLedgerFactory(root / f"{mode}-{appenders}", io=io)
    config = ManagedLedgerConfig(group_commit=MODES[mode], max_ledger_age_seconds=None)
    ml = await factory.open("bench", config)
    latencies: list[float] = []
    stop_at = 0.0

    async def appender() -> None:
        clock = time.perf_counter
        add = ml.add_entry
        record = latencies.append
        while True:
            start = clock()
            if start >= stop_at:
                return
            await add(ENTRY)
            record(clock() - start)

    await asyncio.gather(*(ml.add_entry(ENTRY) for _ in range(appenders)))  # warm up
    io.syncs = io.other_syncs = 0
    began = time.perf_counter()
    stop_at = began + seconds
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.perf_counter() - began
    syncs, other_syncs = io.syncs, io.other_syncs
    await factory.close()
    latencies.sort()
    return {
        "mode": mode,
        "appenders": appenders,
        "appends": len(latencies),
        "appends_per_s": round(len(latencies) / elapsed),
        "fsyncs_per_s": round(syncs / elapsed),
        "entries_per_fsync": round(len(latencies) / max(syncs, 1), 1),
        "other_fsyncs_per_s": round(other_syncs / elapsed),
        "p50_latency_us": round(percentile(latencies, 0.50) * 1e6, 1),
        "p99_latency_us": round(percentile(latencies, 0.99) * 1e6, 1),
        "mean_latency_us": round(statistics.fmean(latencies) * 1e6, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per case (default 4)")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ledger-bench-") as tmp:
        results = []
        for appenders in CONCURRENCY:
            for mode in MODES:  # interleaved, so drifting background load hits both modes alike
                results.append(await run_case(Path(tmp), mode, appenders, args.seconds))
    by = {(r["mode"], r["appenders"]): r for r in results}
    top = max(CONCURRENCY)
    grouped = by[("group_commit", top)]["appends_per_s"]
    baseline = by[("fsync_per_append", top)]["appends_per_s"]
    speedup = round(grouped / max(baseline, 1), 2)
    print(
        json.dumps(
            {
                "benchmark": "ledger_append",
                "entry_bytes": len(ENTRY),
                "seconds_per_case": args.seconds,
                "cpus": os.cpu_count(),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "python": sys.version.split()[0],
                "results": results,
                f"group_commit_speedup_at_{top}": speedup,
                "targets": {
                    f"group_commit_appends_per_s_at_{top}>=50000": grouped >= 50_000,
                    f"speedup_at_{top}>=4": speedup >= 4,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
