"""Process-wide timings and counts of the ledgers' writes, for the pod's /metrics.

Why: the ledgers dashboard and the operators reading it need the append latency producers see (from a
group's first append to its acknowledgement), the fsync time under it, and whether the watermark
(watermark.py) keeps up; a pod holds one process, so one set of counters per process is one set per
pod. Observed once per group commit (its appends counted together), so the cost does not grow with
the append rate; a lock per observation, since groups are written on the loop's thread or the pool's.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter

# Upper bounds (seconds) of the histograms' buckets: an fsync on a fast disk takes ~0.1-2 ms.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LatencyHistogram:
    """Counts per bucket (the last one: above every bound) and the sum, Prometheus style."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self._lock = threading.Lock()
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def observe(self, seconds: float, count: int = 1) -> None:
        """``count`` observations of ``seconds`` each (a group's appends share one latency)."""
        index = bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[index] += count
            self._sum += seconds * count

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) pairs ending with +Inf, and the sum."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip((*self._bounds, None), counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound is None else str(bound), cumulative))
        return buckets, total


class WatermarkCounts:
    """Confirmed-watermark writes and failed watermark updates, by kind (mark / confirm)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.writes = 0
        self.errors: Counter[str] = Counter()

    def wrote(self) -> None:
        with self._lock:
            self.writes += 1

    def failed(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1


APPEND = LatencyHistogram()
FSYNC = LatencyHistogram()
WATERMARK = WatermarkCounts()
