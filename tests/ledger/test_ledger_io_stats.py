"""The ledgers' write metrics (ledger/io_stats.py, exported as txnkeeper_ledger_* by the pods): real
appends on real fsync'd files move the append and fsync histograms and the watermark's write count;
a watermark file that cannot be written counts as an error without failing an append."""

from __future__ import annotations

import errno
from pathlib import Path

from txnkeeper.ledger import ManagedLedgerFactory, io_stats

from .conftest import FileKindIO, wait_for


def _count(histogram: io_stats.LatencyHistogram) -> float:
    buckets, _ = histogram.snapshot()
    return buckets[-1][1]


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    histogram = io_stats.LatencyHistogram((0.001, 0.01))
    histogram.observe(0.001)  # on a bound: counted in that bucket (Prometheus' le)
    histogram.observe(0.005, count=3)
    histogram.observe(7.0)
    buckets, total = histogram.snapshot()
    assert buckets == [("0.001", 1), ("0.01", 4), ("+Inf", 5)]
    assert total == 0.001 + 3 * 0.005 + 7.0


async def test_appends_move_the_append_and_fsync_histograms_and_the_watermark(tmp_path: Path) -> None:
    appends, fsyncs, marks = _count(io_stats.APPEND), _count(io_stats.FSYNC), io_stats.WATERMARK.writes
    factory = ManagedLedgerFactory(tmp_path)
    try:
        ml = await factory.open("log")
        for i in range(5):
            await ml.add_entry(b"e%d" % i)
        assert _count(io_stats.APPEND) - appends == 5  # every acknowledged append, once
        assert _count(io_stats.FSYNC) - fsyncs >= 1  # at least one group commit fsynced them
        await wait_for(lambda: io_stats.WATERMARK.writes > marks, what="a confirmed watermark write")
    finally:
        await factory.close()


class BrokenWatermarkIO(FileKindIO):
    """Real file I/O whose watermark file refuses every write (EIO): ledger data is unaffected."""

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if fd in self.watermark_fds:
            raise OSError(errno.EIO, "Input/output error")
        return super().pwrite(fd, data, offset)


async def test_failed_watermark_updates_are_counted_and_appends_still_succeed(tmp_path: Path) -> None:
    before = dict(io_stats.WATERMARK.errors)
    factory = ManagedLedgerFactory(tmp_path, io=BrokenWatermarkIO())
    try:
        ml = await factory.open("log")
        for i in range(3):
            await ml.add_entry(b"e%d" % i)
        assert io_stats.WATERMARK.errors["mark"] - before.get("mark", 0) == 3
        await wait_for(
            lambda: io_stats.WATERMARK.errors["confirm"] > before.get("confirm", 0),
            what="a failed confirmed watermark write",
        )
    finally:
        await factory.close()
