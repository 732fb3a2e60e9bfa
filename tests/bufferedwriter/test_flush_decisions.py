"""Every flush decision of both flush modes, as one table (pure logic against the in-memory ledger).

A row sets up a writer in one state (flush mode; ledger idle, or one batch entry of this writer held in
flight), writes some records in one loop turn, and says what must have left for the ledger at the call,
what after the end of that turn, whether maxDelay's timer bounds what still waits, and the entries the
ledger finally holds. The adaptive rows are the contract of docs/contracts.md's batched-writer section
("never hold a batch while the ledger is idle, accumulate while a batch is in flight"); the delay rows
are Pulsar's behaviour, which the adaptive mode must leave unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import pytest

from txnkeeper.bufferedwriter import TXN_LOG_CODEC, BatchedWriteConfig, BufferedWriter

from .memlog import MemLog
from .test_writer_logic import NEVER_MS, rec, records_of, wait_until

BUSY = 99  # the record of the batch entry held in flight in the "busy" rows
RECORD_BYTES = 6  # rec(1..127) serializes to six bytes (checked by every row)
BIG = 1 << 20


@dataclass(frozen=True)
class Row:
    mode: str
    busy: bool  # one batch entry of this writer is in flight (held by the ledger)
    records: int  # records 1..n, written in one loop turn
    max_records: int
    max_size_records: int  # maxSizeBytes in records of RECORD_BYTES
    pending_at_call: int  # still buffered right after the calls
    pending_after_turn: int  # still buffered once that loop turn ended
    deadline: bool | None  # maxDelay's timer bounds what still waits (None: nothing waits)
    entries: list[list[int]]  # every entry's records, in ledger order


ROWS = {
    # adaptive, ledger idle: the turn's records leave together at its end, never on the timer
    "adaptive idle, one record": Row("adaptive", False, 1, 100, BIG, 1, 0, None, [[1]]),
    "adaptive idle, one turn's records share the entry": Row(
        "adaptive", False, 3, 100, BIG, 3, 0, None, [[1, 2, 3]]
    ),
    "adaptive idle, maxRecords reached at the call": Row(
        "adaptive", False, 3, 3, BIG, 0, 0, None, [[1, 2, 3]]
    ),
    "adaptive idle, maxRecords then the rest waits for that entry": Row(
        "adaptive", False, 5, 3, BIG, 2, 2, True, [[1, 2, 3], [4, 5]]
    ),
    "adaptive idle, maxSize then the rest waits for that entry": Row(
        "adaptive", False, 4, 100, 3, 1, 1, True, [[1, 2, 3], [4]]
    ),
    # adaptive, a batch in flight: accumulate (bounded by maxDelay) and leave when it settles
    "adaptive busy, accumulate behind the in-flight entry": Row(
        "adaptive", True, 2, 100, BIG, 2, 2, True, [[BUSY], [1, 2]]
    ),
    "adaptive busy, maxRecords still flushes at once": Row(
        "adaptive", True, 3, 3, BIG, 0, 0, None, [[BUSY], [1, 2, 3]]
    ),
    "adaptive busy, maxSize still flushes at once": Row(
        "adaptive", True, 3, 100, 3, 0, 0, None, [[BUSY], [1, 2, 3]]
    ),
    # Pulsar's delay mode: only maxRecords, maxSize and the timer tick, whatever the ledger does
    "delay idle, one record waits for the tick": Row("delay", False, 1, 100, BIG, 1, 1, True, [[1]]),
    "delay idle, maxRecords reached at the call": Row("delay", False, 3, 3, BIG, 0, 0, None, [[1, 2, 3]]),
    "delay idle, maxRecords then the rest waits for the tick": Row(
        "delay", False, 4, 3, BIG, 1, 1, True, [[1, 2, 3], [4]]
    ),
    "delay busy, records wait for the tick": Row("delay", True, 2, 100, BIG, 2, 2, True, [[BUSY], [1, 2]]),
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
async def test_flush_decision(row: Row) -> None:
    assert all(len(rec(n).SerializeToString()) == RECORD_BYTES for n in (1, row.records, BUSY))
    config = BatchedWriteConfig(
        enabled=True,
        flush_mode=row.mode,
        max_records=row.max_records,
        max_size_bytes=min(row.max_size_records * RECORD_BYTES, BIG),
        max_delay_millis=NEVER_MS,  # a timer that fires would hide a wrong decision
    )
    log = MemLog()
    log.hold()
    busy = None
    if row.busy:
        # An adaptive writer sends a lone record at once; then the row's mode applies to what follows.
        w = BufferedWriter(log, TXN_LOG_CODEC, replace(config, flush_mode="adaptive"))
        busy = w.submit(rec(BUSY))
        await wait_until(lambda: log.appends_started == 1, "the busy entry to reach the ledger")
        await w.configure(config)
    else:
        w = BufferedWriter(log, TXN_LOG_CODEC, config)

    futures = [w.submit(rec(n)) for n in range(1, row.records + 1)]
    assert w.pending_records == row.pending_at_call, "buffered right after the calls"
    await asyncio.sleep(0)  # the end of this loop turn (callbacks scheduled during it have run)
    assert w.pending_records == row.pending_after_turn, "buffered once the loop turn ended"
    if row.deadline is not None:
        # (With nothing waiting the timer may still tick once, as Pulsar's periodic timer does.)
        assert (w.flush_deadline is not None) == row.deadline, "maxDelay's timer bounds what waits"

    log.release()
    if row.mode == "adaptive":
        # Nothing may be held once the in-flight entries settled: no flush() or timer needed.
        await wait_until(lambda: w.pending_records == 0, "the accumulated records to leave on their own")
    await w.flush()
    await asyncio.wait_for(asyncio.gather(*futures, *([busy] if busy else [])), 10)
    assert [records for _, records in records_of(log)] == row.entries
    assert all(batched for batched, _ in records_of(log))
    await w.close()
