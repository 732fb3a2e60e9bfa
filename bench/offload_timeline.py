"""``bench/offload.py --timeline``: where the slowest appends fall relative to what the offloader did.

The produce section's p99 with streaming on is several times the p99 with it off, and the candidates
are each plausible: the tier's fdatasyncs queueing ahead of the ledger's own on one disk, the
second core busy with the read-back worker and block CRCs, or the GIL. This module answers from one
run instead of by experiment: every append's (intended send time, completion) and the offloader's
spans (``txnkeeper.ledger.offload.timeline``: worker calls, block seals and uploads, tier writes and
fdatasyncs, metadata writes, segment closes, plus the ledger's own group commits, traced here) are
lined up, and for each kind of span it prints the share of the slowest 1 % of appends that overlap one,
against the share of all appends that do (the base rate: a kind overlapping 30 % of all appends and
30 % of the slow ones explains nothing). It also takes per-thread CPU from ``/proc/self/task`` (and the
read-back worker's, and the whole machine's from ``/proc/stat``) per mode.

Not part of the goal's measurement: the bench without ``--timeline`` records nothing of this.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from txnkeeper.ledger.ledger_file import LedgerFile
from txnkeeper.ledger.offload import timeline
from txnkeeper.ledger.readback import shared_worker

SLOW_COMMIT_SECONDS = 0.002  # a group commit's write + fdatasync this long is "slow" (p50 ~0.1-0.3 ms)
_TICK = os.sysconf("SC_CLK_TCK")


def trace_ledger_commits() -> Callable[[], None]:
    """Record every group commit's write + fdatasync as a ``ledger_commit`` span; returns the undo."""
    original = LedgerFile.write_and_sync

    @wraps(original)
    def traced(self: LedgerFile, *args: Any, **kwargs: Any) -> None:
        started = timeline.now()
        try:
            original(self, *args, **kwargs)
        finally:
            timeline.span("ledger_commit", started)

    LedgerFile.write_and_sync = traced  # type: ignore[method-assign]

    def undo() -> None:
        LedgerFile.write_and_sync = original  # type: ignore[method-assign]

    return undo


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process (by Python thread name, pool suffixes merged), the
    read-back worker's and the machine's busy seconds (all processes, all cores)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        name = re.sub(r"_\d+$", "", names.get(int(tid), f"native-{tid}"))
        out[name] += (int(rest[11]) + int(rest[12])) / _TICK
    pid = shared_worker().pid
    if pid is not None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            out["readback-worker"] += (int(rest[11]) + int(rest[12])) / _TICK
        except OSError:
            pass
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    out["machine-busy"] = (sum(fields) - fields[3] - fields[4]) / _TICK  # all but idle and iowait
    return out


class ModeTimeline:
    """One mode's appends, spans and CPU over its rounds."""

    def __init__(self) -> None:
        self.intended = array("d")
        self.done = array("d")
        self.spans: list[timeline.Span] = []
        self.cpu: dict[str, float] = defaultdict(float)
        self.seconds = 0.0

    @contextmanager
    def round(self) -> Iterator[None]:
        """Record the offloader's spans and the threads' CPU while one round runs."""
        before = _thread_cpu()
        started = timeline.now()
        timeline.start()
        try:
            yield
        finally:
            self.spans += timeline.stop()
            self.seconds += timeline.now() - started
            after = _thread_cpu()
            for name, value in after.items():
                self.cpu[name] += value - before.get(name, 0.0)

    def report(self) -> dict[str, Any]:
        latencies = [d - i for i, d in zip(self.intended, self.done, strict=True)]
        threshold = statistics.quantiles(latencies, n=100)[98]
        slow = [i for i, lat in enumerate(latencies) if lat >= threshold]
        sample = range(0, len(latencies), max(1, len(latencies) // 20000))
        by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for kind, start, end in self.spans:
            by_kind[kind].append((start, end))
            if kind == "ledger_commit" and end - start >= SLOW_COMMIT_SECONDS:
                by_kind["ledger_commit_slow"].append((start, end))
        overlaps: dict[str, dict[str, float]] = {}
        for kind, spans in sorted(by_kind.items()):
            hits = _overlap_test(spans)
            overlaps[kind] = {
                "slow_share": _share(hits, self.intended, self.done, slow),
                "all_share": _share(hits, self.intended, self.done, sample),
                "count": len(spans),
                "busy_share": round(_union_seconds(spans) / self.seconds, 3) if self.seconds else 0.0,
                "p50_ms": _ms(statistics.median(e - s for s, e in spans)),
                "p99_ms": _ms(_quantile([e - s for s, e in spans], 99)),
                "max_ms": _ms(max(e - s for s, e in spans)),
            }
        report: dict[str, Any] = {
            "slow_threshold_ms": _ms(threshold),
            "slow_appends": len(slow),
            "overlap": overlaps,
            "cpu_s_per_s": {k: round(v / self.seconds, 3) for k, v in sorted(self.cpu.items())},
        }
        commits = by_kind.get("ledger_commit", [])
        if commits and by_kind.get("tier_sync"):
            tier = _overlap_test(by_kind["tier_sync"])
            slow_commits = [c for c in commits if c[1] - c[0] >= SLOW_COMMIT_SECONDS]
            report["ledger_commits_overlapping_tier_sync"] = {
                "slow": _fraction(sum(tier(s, e) for s, e in slow_commits), len(slow_commits)),
                "all": _fraction(sum(tier(s, e) for s, e in commits), len(commits)),
            }
        return report


def _overlap_test(spans: list[tuple[float, float]]) -> Callable[[float, float], bool]:
    """A test of whether [a, b] overlaps any of ``spans`` (which may overlap each other)."""
    spans = sorted(spans)
    starts = [s for s, _ in spans]
    reach = array("d")
    furthest = float("-inf")
    for _, end in spans:
        furthest = max(furthest, end)
        reach.append(furthest)

    def hits(a: float, b: float) -> bool:
        n = bisect_right(starts, b)
        return n > 0 and reach[n - 1] >= a

    return hits


def _share(
    hits: Callable[[float, float], bool], intended: array[float], done: array[float], which: Any
) -> float:
    indexes = list(which)
    return _fraction(sum(hits(intended[i], done[i]) for i in indexes), len(indexes))


def _union_seconds(spans: list[tuple[float, float]]) -> float:
    total = 0.0
    end_so_far = float("-inf")
    for start, end in sorted(spans):
        if end <= end_so_far:
            continue
        total += end - max(start, end_so_far)
        end_so_far = end
    return total


def _quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def _fraction(part: int, whole: int) -> float:
    return round(part / whole, 3) if whole else 0.0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)
