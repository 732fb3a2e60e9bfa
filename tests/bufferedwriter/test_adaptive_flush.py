"""The adaptive flush mode against the ``add_entry`` seam (pure logic, in memory).

Adaptive mode must never hold a batch while no batch entry is in flight, must accumulate while one is,
and must keep every PIP-160 rule (maxRecords/maxSize/maxDelay triggers, large records, order,
failure and close semantics) that the "delay" mode tests check against Pulsar.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter import (
    TXN_LOG_CODEC,
    BatchedWriteConfig,
    BufferedWriter,
    BufferedWriterClosedError,
    BufferedWriterMetrics,
    WritePosition,
)
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm

from .memlog import MemLog
from .test_writer_logic import NEVER_MS, check_order_while_toggling, rec, records_of, wait_until

P = "pulsar_txn_tc_bufferedwriter"
LABELS = {"coordinator_id": "0"}


def adaptive(**cfg: object) -> BatchedWriteConfig:
    return BatchedWriteConfig(**{"enabled": True, "flush_mode": "adaptive", **cfg})  # type: ignore[arg-type]


def metered(
    log: MemLog, config: BatchedWriteConfig
) -> tuple[BufferedWriter[tm.TransactionMetadataEntry], CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = BufferedWriterMetrics("pulsar_txn_tc", LABELS, registry)
    return BufferedWriter(log, TXN_LOG_CODEC, config, metrics), registry


def trigger(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(f"{P}_flush_trigger_{name}_total", LABELS)


def test_adaptive_is_the_default_and_delay_is_selectable() -> None:
    assert BatchedWriteConfig().flush_mode == "adaptive"
    assert BatchedWriteConfig(flush_mode="delay").to_stat()["batchedWriteFlushMode"] == "delay"


async def test_records_written_in_one_turn_share_the_idle_flush() -> None:
    """Two records queued back to back while the ledger is idle (a coordinator logs ADD_PARTITION and
    ADD_SUBSCRIPTION of one request so) leave as one entry: sending the first alone made the second
    wait for a whole ledger write."""
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    both = [w.submit(rec(0)), w.submit(rec(1))]
    assert await asyncio.wait_for(asyncio.gather(*both), 10) == [WritePosition(1, 0, 2, i) for i in (0, 1)]
    assert records_of(log) == [(True, [0, 1])]
    assert trigger(registry, "idle") == 1 and trigger(registry, "max_delay") == 0


async def test_a_lone_writer_is_never_held_by_the_delay() -> None:
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    for n in range(5):
        # With a 60 s delay, only the idle flush can complete these writes.
        assert await asyncio.wait_for(w.write(rec(n)), 10) == WritePosition(1, n, 1, 0)
    assert records_of(log) == [(True, [n]) for n in range(5)]
    assert trigger(registry, "idle") == 5
    assert trigger(registry, "max_delay") == 0
    assert w.flush_deadline is None


async def test_records_accumulate_while_a_batch_is_in_flight_and_leave_when_it_settles() -> None:
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    log.hold()
    first = w.submit(rec(0))
    await wait_until(lambda: log.appends_started == 1, "the first record to go at once")
    rest = [w.submit(rec(n)) for n in range(1, 6)]
    await asyncio.sleep(0)
    assert w.pending_records == 5 and log.appends_started == 1
    log.release()
    assert await first == WritePosition(1, 0, 1, 0)
    assert await asyncio.gather(*rest) == [WritePosition(1, 1, 5, i) for i in range(5)]
    assert records_of(log) == [(True, [0]), (True, [1, 2, 3, 4, 5])]
    assert trigger(registry, "idle") == 2


async def test_the_idle_flush_of_accumulated_records_disarms_their_timer() -> None:
    """Records queued behind an in-flight batch arm maxDelay's timer; when they leave on the idle
    flush the timer is cancelled (its empty tick was a wasted loop wake-up per transaction at one in
    flight), and a record queued behind the next batch arms a fresh one. Delay mode keeps Pulsar's
    ticking timer (test_flush_decisions' delay rows)."""
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    log.hold()
    first = w.submit(rec(0))
    await wait_until(lambda: log.appends_started == 1, "the first record to go at once")
    second = w.submit(rec(1))
    assert w.flush_deadline is not None, "the record behind the in-flight batch has a deadline"
    log.release()
    await asyncio.gather(first, second)
    assert w.flush_deadline is None, "nothing waits, so no timer may stay armed"
    log.hold()
    third = w.submit(rec(2))
    await wait_until(lambda: log.appends_started == 3, "the third record to go at once")
    fourth = w.submit(rec(3))
    assert w.flush_deadline is not None, "a record behind the next batch arms a fresh timer"
    log.release()
    await asyncio.gather(third, fourth)
    assert w.flush_deadline is None
    assert trigger(registry, "idle") == 4 and trigger(registry, "max_delay") == 0


async def test_max_records_and_max_size_still_flush_while_a_batch_is_in_flight() -> None:
    log = MemLog()
    size = len(rec(1).SerializeToString())
    w, registry = metered(log, adaptive(max_records=3, max_size_bytes=2 * size, max_delay_millis=NEVER_MS))
    log.hold()
    futs = [w.submit(rec(0))]
    await wait_until(lambda: log.appends_started == 1, "the idle flush")
    futs += [w.submit(rec(n)) for n in (1, 2)]  # reaches maxSize (2 records) first
    await wait_until(lambda: log.appends_started == 2, "the max_size flush while one entry is in flight")
    log.release()
    await asyncio.gather(*futs)
    assert records_of(log) == [(True, [0]), (True, [1, 2])]
    assert trigger(registry, "max_size") == 1


async def test_max_delay_bounds_the_wait_while_a_batch_is_in_flight() -> None:
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=2))
    log.hold()
    first = w.submit(rec(0))
    await wait_until(lambda: log.appends_started == 1, "the idle flush of the first record")
    second = w.submit(rec(1))
    assert w.flush_deadline is not None, "a record waiting behind an in-flight batch must have a deadline"
    await wait_until(lambda: log.appends_started == 2, "the timer to flush while the first entry is held")
    log.release()
    assert [await first, await second] == [WritePosition(1, 0, 1, 0), WritePosition(1, 1, 1, 0)]
    assert trigger(registry, "max_delay") == 1


async def test_large_record_while_in_flight_flushes_pending_then_goes_alone() -> None:
    log = MemLog()
    w = BufferedWriter(
        log, TXN_LOG_CODEC, adaptive(max_records=100, max_size_bytes=200, max_delay_millis=NEVER_MS)
    )
    log.hold()
    futs = [w.submit(rec(0))]
    await wait_until(lambda: log.appends_started == 1, "the idle flush of the first record")
    futs += [w.submit(rec(1)), w.submit(rec(2, "x" * 300))]
    await wait_until(lambda: log.appends_started == 3, "pending batch and the large record to go")
    log.release()
    await asyncio.gather(*futs)
    assert records_of(log) == [(True, [0]), (True, [1]), (False, [2])]


async def test_a_failed_in_flight_batch_fails_only_its_records_and_the_next_batch_still_goes() -> None:
    log = MemLog()
    w = BufferedWriter(log, TXN_LOG_CODEC, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    log.hold()
    log.fail_next.append(OSError("disk gone"))
    failed = w.submit(rec(0))
    await wait_until(lambda: log.appends_started == 1, "the first entry")
    waiting = [w.submit(rec(n)) for n in (1, 2)]
    log.release()
    with pytest.raises(OSError, match="disk gone"):
        await failed
    assert await asyncio.gather(*waiting) == [WritePosition(1, 0, 2, 0), WritePosition(1, 0, 2, 1)]


async def test_close_fails_accumulated_records_and_completes_the_in_flight_batch() -> None:
    log = MemLog()
    w = BufferedWriter(log, TXN_LOG_CODEC, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    log.hold()
    flying = w.submit(rec(0))
    await wait_until(lambda: log.appends_started == 1, "the first entry")
    buffered = w.submit(rec(1))
    closing = asyncio.ensure_future(w.close())
    await asyncio.sleep(0)
    log.release()
    await closing
    assert await flying == WritePosition(1, 0, 1, 0)
    with pytest.raises(BufferedWriterClosedError, match="write them again"):
        await buffered
    assert records_of(log) == [(True, [0])]


async def test_switching_to_adaptive_flushes_a_batch_held_by_the_delay_mode() -> None:
    log = MemLog()
    w = BufferedWriter(
        log, TXN_LOG_CODEC, adaptive(flush_mode="delay", max_records=100, max_delay_millis=NEVER_MS)
    )
    futs = [w.submit(rec(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert w.pending_records == 3 and log.appends_started == 0
    await w.configure(adaptive(max_records=100, max_delay_millis=NEVER_MS))
    assert await asyncio.gather(*futs) == [WritePosition(1, 0, 3, i) for i in range(3)]
    assert w.config.to_stat()["batchedWriteFlushMode"] == "adaptive"


async def test_order_holds_under_concurrency_while_toggling_modes_and_limits() -> None:
    log = MemLog()
    w = BufferedWriter(log, TXN_LOG_CODEC, adaptive(max_records=7, max_size_bytes=400))
    rnd = random.Random(5)
    entries = await check_order_while_toggling(
        log,
        w,
        rnd,
        lambda i: BatchedWriteConfig(
            enabled=i % 3 != 2,
            flush_mode=rnd.choice(["adaptive", "delay"]),
            max_records=rnd.randint(1, 9),
            max_size_bytes=400,
            max_delay_millis=rnd.choice([0, 0.5, 2]),
        ),
    )
    assert any(d.batch_size > 1 for d in entries)


async def test_writers_woken_by_one_entry_share_the_next_entry() -> None:
    """A steady set of writers each waiting for its previous record: the records they write when one
    entry wakes them leave together (flushed at the end of that loop turn), not as alternating halves."""
    log = MemLog()
    w, registry = metered(log, adaptive(max_records=100, max_delay_millis=NEVER_MS))
    writers, rounds = 8, 20
    positions: dict[int, list[WritePosition]] = {n: [] for n in range(writers)}

    async def writer(n: int) -> None:
        for r in range(rounds):
            positions[n].append(await w.write(rec(n * 1000 + r)))

    await asyncio.gather(*(writer(n) for n in range(writers)))
    sizes = [len(records) for _, records in records_of(log)]
    assert sum(sizes) == writers * rounds
    # The writers' first records are written in one loop turn with the ledger idle: they leave together
    # at the end of it, and every later entry carries every writer too.
    assert sizes == [writers] * rounds, sizes
    assert trigger(registry, "idle") == len(sizes) and trigger(registry, "max_delay") == 0
    for n in range(writers):  # each writer's records in its own order
        assert positions[n] == sorted(positions[n])
