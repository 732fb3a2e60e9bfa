"""What one offloader counts, for Pulsar's brk_ledgeroffloader_* metrics and txnkeeper's lag gauges.

Plain numbers, no Prometheus here: layer 1 stays free of the metrics library, and the pod's collector
turns these into metric families at scrape time (Pulsar's LedgerOffloaderStatsImpl names, with the
rates computed over the interval between two scrapes instead of a fixed timer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class LatencySummary:
    """count and sum (microseconds, as Pulsar records them) of one latency."""

    count: int = 0
    sum_us: float = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum_us += seconds * 1e6


@dataclass
class OffloaderStats:
    offload_error: int = 0  # a segment upload that failed (the segment went Failed)
    write_storage_error: int = 0  # a blob-store write (part, index, delete) that failed
    read_offload_error: int = 0  # a read from the tier that failed (store down or corruption)
    delete_offload_ops: int = 0  # segments whose objects were deleted
    offload_bytes: int = 0  # payload bytes written to the tier (total)
    read_offload_bytes: int = 0  # payload bytes read from the tier (total)
    read_ledger_latency: LatencySummary = field(default_factory=LatencySummary)
    read_offload_index_latency: LatencySummary = field(default_factory=LatencySummary)
    read_offload_data_latency: LatencySummary = field(default_factory=LatencySummary)
    _rate_mark: tuple[float, int, int] = field(default_factory=lambda: (time.monotonic(), 0, 0))

    def rates(self) -> tuple[float, float]:
        """(offload, read-offload) bytes per second since the previous call (Pulsar's *_rate gauges)."""
        now = time.monotonic()
        then, offloaded, read = self._rate_mark
        self._rate_mark = (now, self.offload_bytes, self.read_offload_bytes)
        elapsed = now - then
        if elapsed <= 0:
            return 0.0, 0.0
        return (self.offload_bytes - offloaded) / elapsed, (self.read_offload_bytes - read) / elapsed
