"""The buffered writer's PIP-160 semantics against the ``add_entry`` seam (pure logic, in memory).

These are the Pulsar-parity tests, so they run in the "delay" flush mode (Pulsar's); the adaptive
mode has its own tests in test_adaptive_flush.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter import (
    BATCH_HEADER,
    TXN_LOG_CODEC,
    BatchedWriteConfig,
    BufferedWriter,
    BufferedWriterClosedError,
    BufferedWriterMetrics,
    WritePosition,
    WriterState,
)
from txnkeeper.bufferedwriter.codec import DecodedEntry
from txnkeeper.bufferedwriter.writer import FAILED, pack_position, unpack_position
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm

from .memlog import MemLog

NEVER_MS = 60_000.0  # a delay long enough that the timer cannot be what flushes


def rec(n: int, owner: str = "") -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=tm.TransactionMetadataEntry.NEW, txnid_least_bits=n, owner=owner
    )


def parity_config(**cfg: object) -> BatchedWriteConfig:
    """A config in Pulsar's pure-delay flush mode (what every test here checks parity against)."""
    return BatchedWriteConfig(**{"flush_mode": "delay", **cfg})  # type: ignore[arg-type]


def writer(log: MemLog, **cfg: object) -> BufferedWriter[tm.TransactionMetadataEntry]:
    return BufferedWriter(log, TXN_LOG_CODEC, parity_config(**cfg))


def records_of(log: MemLog) -> list[tuple[bool, list[int]]]:
    out = []
    for data in log.entries:
        d = TXN_LOG_CODEC.decode_entry(data)
        out.append((d.batched, [r.txnid_least_bits for r in d.records]))
    return out


async def wait_until(predicate: object, what: str, within: float = 5.0) -> None:
    assert callable(predicate)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.0005)


async def test_max_records_flushes_a_full_batch_and_reports_positions_in_order() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=4, max_delay_millis=NEVER_MS)
    positions = await asyncio.gather(*(w.write(rec(i)) for i in range(8)))
    assert positions == [WritePosition(1, i // 4, 4, i % 4) for i in range(8)]
    assert records_of(log) == [(True, [0, 1, 2, 3]), (True, [4, 5, 6, 7])]
    assert all(e.startswith(BATCH_HEADER) for e in log.entries)


async def test_max_records_is_checked_before_max_size() -> None:
    registry = CollectorRegistry()
    log = MemLog()
    metrics = BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "0"}, registry)
    size = len(rec(0, "x" * 20).SerializeToString())
    w = BufferedWriter(
        log,
        TXN_LOG_CODEC,
        parity_config(enabled=True, max_records=2, max_size_bytes=2 * size, max_delay_millis=NEVER_MS),
        metrics,
    )
    await asyncio.gather(w.write(rec(0, "x" * 20)), w.write(rec(1, "x" * 20)))
    trig = "pulsar_txn_tc_bufferedwriter_flush_trigger_{}_total"
    labels = {"coordinator_id": "0"}
    assert registry.get_sample_value(trig.format("max_records"), labels) == 1
    assert registry.get_sample_value(trig.format("max_size"), labels) == 0


async def test_max_size_flushes_when_queued_bytes_reach_it() -> None:
    log = MemLog()
    size = len(rec(0, "y" * 30).SerializeToString())
    w = writer(log, enabled=True, max_records=100, max_size_bytes=3 * size, max_delay_millis=NEVER_MS)
    futs = [w.submit(rec(i, "y" * 30)) for i in range(2)]
    await asyncio.sleep(0)
    assert log.appends_started == 0, "two records are below maxSize: nothing may be flushed yet"
    futs.append(w.submit(rec(2, "y" * 30)))
    positions = await asyncio.gather(*futs)
    assert [p.batch_size for p in positions] == [3, 3, 3]
    assert records_of(log) == [(True, [0, 1, 2])]


async def test_max_delay_flushes_a_partial_batch_at_the_next_tick() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=100, max_delay_millis=2)
    loop = asyncio.get_running_loop()
    # The queue time lies between these two readings (a loaded machine may pause between them).
    before = loop.time()
    fut = w.submit(rec(7))
    after = loop.time()
    deadline = w.flush_deadline
    assert deadline is not None and before < deadline <= after + 0.002, "waits at most maxDelay"
    await asyncio.sleep(0)
    assert log.appends_started == 0, "nothing but the timer may flush a single record"
    assert await asyncio.wait_for(fut, timeout=5) == WritePosition(1, 0, 1, 0)
    assert records_of(log) == [(True, [7])]
    assert w.flush_deadline is None, "an idle writer keeps no timer"


async def test_ticks_follow_one_grid_like_pulsars_periodic_timer() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=100, max_delay_millis=20)
    await w.write(rec(1))
    first = w.flush_deadline
    assert first is None
    fut = w.submit(rec(2))
    tick = w.flush_deadline
    assert tick is not None
    # The new tick lies on the grid started by the first record: a whole number of delays later.
    assert w._epoch is not None
    periods = (tick - w._epoch) / 0.020
    assert abs(periods - round(periods)) < 1e-6 and round(periods) >= 1
    await fut


async def test_timer_never_piles_up() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=3, max_delay_millis=50)
    loop = asyncio.get_running_loop()
    # Many batches flushed by maxRecords, each starting a new deadline: at most one timer may exist.
    for round_ in range(50):
        futs = [w.submit(rec(round_ * 3 + i)) for i in range(3)]
        w.submit(rec(10_000 + round_))  # leaves one record pending: a deadline is needed
        scheduled = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        mine = [h for h in scheduled if getattr(h._callback, "__self__", None) is w]
        assert len(mine) <= 1
        await asyncio.gather(*futs)
    await w.flush()
    assert w.pending_records == 0


async def test_large_record_flushes_pending_then_goes_alone_unbatched() -> None:
    log = MemLog()
    small = rec(1)
    big = rec(2, "z" * 200)
    w = writer(
        log,
        enabled=True,
        max_records=100,
        max_size_bytes=len(big.SerializeToString()),
        max_delay_millis=NEVER_MS,
    )
    f1, f2 = w.submit(small), w.submit(rec(3))
    f_big = w.submit(big)
    f4 = w.submit(rec(4))
    await asyncio.gather(f1, f2, f_big)
    assert f_big.result() == WritePosition(1, 1, 0, 0)
    assert records_of(log)[:2] == [(True, [1, 3]), (False, [2])]
    assert not log.entries[1].startswith(b"\x0e\x01")
    await w.flush()
    assert f4.result() == WritePosition(1, 2, 1, 0)


@pytest.mark.parametrize("cfg", [{"enabled": False}, {"enabled": True, "max_records": 1}])
async def test_disabled_or_single_record_batches_write_plain_entries(cfg: dict[str, object]) -> None:
    log = MemLog()
    w = writer(log, **cfg)
    positions = await asyncio.gather(*(w.write(rec(i)) for i in range(5)))
    assert positions == [WritePosition(1, i, 0, 0) for i in range(5)]
    assert records_of(log) == [(False, [i]) for i in range(5)]


async def test_ledger_failure_fails_the_whole_batch_with_the_same_error() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=3, max_delay_millis=NEVER_MS)
    boom = OSError(28, "No space left on device")
    log.fail_next.append(boom)
    results = await asyncio.gather(*(w.write(rec(i)) for i in range(6)), return_exceptions=True)
    assert results[:3] == [boom, boom, boom]
    assert all(r is boom for r in results[:3])
    assert results[3:] == [WritePosition(1, 0, 3, i) for i in range(3)]


async def test_close_fails_buffered_records_and_completes_flushed_ones() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=2, max_delay_millis=NEVER_MS)
    log.hold()
    flushed = [w.submit(rec(0)), w.submit(rec(1))]  # handed to the ledger, fsync "in flight"
    buffered = w.submit(rec(2))
    await wait_until(lambda: log.appends_started == 1, "the batch to reach the ledger")
    closing = asyncio.ensure_future(w.close())
    await wait_until(lambda: w.state is WriterState.CLOSING, "CLOSING")
    with pytest.raises(BufferedWriterClosedError, match="buffered writer closed"):
        await buffered
    assert not closing.done(), "close must wait for the in-flight entry"
    with pytest.raises(BufferedWriterClosedError, match="buffered writer closed"):
        w.submit(rec(3))
    log.release()
    await closing
    assert w.state is WriterState.CLOSED
    assert [f.result() for f in flushed] == [WritePosition(1, 0, 2, 0), WritePosition(1, 0, 2, 1)]
    with pytest.raises(BufferedWriterClosedError):
        await w.write(rec(4))
    assert records_of(log) == [(True, [0, 1])]


async def test_disable_flushes_pending_first_and_keeps_order() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=100, max_delay_millis=NEVER_MS)
    futs = [w.submit(rec(i)) for i in range(3)]
    await w.configure(parity_config(enabled=False))
    futs += [w.submit(rec(i)) for i in range(3, 5)]
    await asyncio.gather(*futs)
    assert records_of(log) == [(True, [0, 1, 2]), (False, [3]), (False, [4])]


async def test_lowering_limits_flushes_an_overfull_pending_batch() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=100, max_delay_millis=NEVER_MS)
    futs = [w.submit(rec(i)) for i in range(5)]
    await w.configure(parity_config(enabled=True, max_records=4, max_delay_millis=NEVER_MS))
    await asyncio.gather(*futs)
    assert records_of(log) == [(True, [0, 1, 2, 3, 4])]


async def test_shortening_the_delay_applies_to_the_pending_batch() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=100, max_delay_millis=NEVER_MS)
    fut = w.submit(rec(1))
    await w.configure(parity_config(enabled=True, max_records=100, max_delay_millis=1))
    assert (await asyncio.wait_for(fut, timeout=5)).batch_size == 1


async def check_order_while_toggling(
    log: MemLog,
    w: BufferedWriter[tm.TransactionMetadataEntry],
    rnd: random.Random,
    config_at: Callable[[int], BatchedWriteConfig],
) -> list[DecodedEntry[tm.TransactionMetadataEntry]]:
    """25 writers race 40 reconfigurations (``config_at(i)``): log order = write order, every position true.

    Returns the log's decoded entries for the caller's own checks.
    """
    submitted: list[int] = []
    counter = iter(range(1_000_000))

    async def producer() -> list[tuple[int, WritePosition]]:
        got = []
        for _ in range(60):
            n = next(counter)
            submitted.append(n)
            got.append((n, await w.write(rec(n, "p" * rnd.choice([0, 10, 150, 500])))))
        return got

    async def toggler() -> None:
        for i in range(40):
            await w.configure(config_at(i))
            await asyncio.sleep(0)

    results = await asyncio.gather(*(producer() for _ in range(25)), toggler())
    written: list[int] = [n for _, ids in records_of(log) for n in ids]
    assert written == submitted, "records reached the log in a different order than they were written"
    by_record = {n: pos for res in results[:-1] for n, pos in res}  # type: ignore[union-attr]
    assert len(by_record) == len(submitted)
    entries = [TXN_LOG_CODEC.decode_entry(e) for e in log.entries]
    for n, pos in by_record.items():
        entry = entries[pos.entry_id]
        assert entry.batch_size == pos.batch_size
        assert entry.records[pos.batch_index].txnid_least_bits == n
    return entries


async def test_ordering_under_concurrency_and_toggling_under_load() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=7, max_size_bytes=400, max_delay_millis=0.5)
    rnd = random.Random(3)
    entries = await check_order_while_toggling(
        log,
        w,
        rnd,
        lambda i: parity_config(
            enabled=i % 2 == 0,
            max_records=rnd.randint(1, 9),
            max_size_bytes=400,
            max_delay_millis=rnd.choice([0, 0.5, 2]),
        ),
    )
    assert any(d.batched for d in entries) and any(not d.batched for d in entries)


async def test_invalid_config_object_is_refused() -> None:
    with pytest.raises(TypeError, match="BatchedWriteConfig"):
        BufferedWriter(MemLog(), TXN_LOG_CODEC, {"enabled": True})  # type: ignore[arg-type]


async def test_metrics_count_records_entries_and_delay() -> None:
    registry = CollectorRegistry()
    log = MemLog()
    metrics = BufferedWriterMetrics(
        "pulsar_txn_pending_ack_store", {"topic": "t", "subscription": "s"}, registry
    )
    w = BufferedWriter(
        log, TXN_LOG_CODEC, parity_config(enabled=True, max_records=10, max_delay_millis=1), metrics
    )
    await asyncio.gather(*(w.write(rec(i)) for i in range(3)))
    await w.configure(parity_config(enabled=False))
    await w.write(rec(9))
    labels = {"topic": "t", "subscription": "s"}
    p = "pulsar_txn_pending_ack_store_bufferedwriter"
    assert registry.get_sample_value(f"{p}_records_written_total", labels) == 4
    assert registry.get_sample_value(f"{p}_entries_written_total", {**labels, "format": "batched"}) == 1
    assert registry.get_sample_value(f"{p}_entries_written_total", {**labels, "format": "unbatched"}) == 1
    assert registry.get_sample_value(f"{p}_flush_trigger_max_delay_total", labels) == 1
    assert registry.get_sample_value(f"{p}_batch_records_bucket", {**labels, "le": "10.0"}) == 1
    delay_le_5ms = registry.get_sample_value(
        f"{p}_batch_oldest_record_delay_seconds_bucket", {**labels, "le": "1.0"}
    )
    assert delay_le_5ms == 1
    metrics.unregister()
    assert registry.get_sample_value(f"{p}_records_written_total", labels) is None


async def test_sinks_receive_every_outcome_even_for_cancelled_callers() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=2, max_delay_millis=NEVER_MS)
    sink: list[int] = []
    first = w.submit(rec(1), sink)
    first.cancel()
    await w.submit(rec(2), sink)
    assert [unpack_position(p) for p in sink] == [WritePosition(1, 0, 2, 0), WritePosition(1, 0, 2, 1)]
    log.fail_next.append(OSError("disk gone"))
    failed = [w.submit(rec(3), sink), w.submit(rec(4), sink)]
    await asyncio.gather(*failed, return_exceptions=True)
    assert sink[2:] == [FAILED, FAILED]
    await w.configure(parity_config(enabled=False))
    await w.submit(rec(5), sink)
    assert unpack_position(sink[4]) == WritePosition(1, 1, 0, 0)
    await w.configure(parity_config(enabled=True, max_records=10, max_delay_millis=NEVER_MS))
    buffered = w.submit(rec(6), sink)
    await w.close()
    with pytest.raises(BufferedWriterClosedError):
        await buffered
    assert sink[5] == FAILED


def test_packed_positions_round_trip() -> None:
    for pos in [
        WritePosition(0, 0, 0, 0),
        WritePosition(2**40, 2**32 - 1, 512, 511),
        WritePosition(7, 3, 0, 0),
    ]:
        assert unpack_position(pack_position(*pos)) == pos
    with pytest.raises(ValueError, match="cannot be packed"):
        pack_position(1, 2**32, 0, 0)


async def test_wait_for_progress_returns_when_an_entry_settles() -> None:
    log = MemLog()
    w = writer(log, enabled=True, max_records=10, max_delay_millis=NEVER_MS)
    await asyncio.wait_for(w.wait_for_progress(), timeout=1)  # nothing pending: at once
    fut = w.submit(rec(1))
    progress = asyncio.ensure_future(w.wait_for_progress())
    await asyncio.sleep(0)
    assert not progress.done()
    await w.flush()
    await asyncio.wait_for(progress, timeout=5)
    assert fut.done()
