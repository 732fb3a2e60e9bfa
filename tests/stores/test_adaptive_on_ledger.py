"""The adaptive flush mode on the real, fsync'd managed ledger: a sequential writer is never held by
maxDelay, and records arriving while an entry is being fsync'd leave together as the next batch."""

from __future__ import annotations

import asyncio

from txnkeeper.bufferedwriter import TXN_LOG_CODEC, BatchedWriteConfig, BufferedWriter, WritePosition
from txnkeeper.ledger import ManagedLedgerFactory, Position

from .helpers import new_txn
from .test_writer_on_ledger import read_all

NEVER_MS = 60_000.0  # only an adaptive (idle) flush can complete a write within the test's deadline


async def test_sequential_writes_complete_without_waiting_for_the_delay(
    factory: ManagedLedgerFactory,
) -> None:
    ledger = await factory.open("adaptive-seq")
    config = BatchedWriteConfig(enabled=True, max_records=512, max_delay_millis=NEVER_MS)
    writer = BufferedWriter(ledger, TXN_LOG_CODEC, config)
    got = [await asyncio.wait_for(writer.write(new_txn(0, n)), 30) for n in range(10)]
    await writer.close()
    entries = await read_all(factory, "adaptive-seq")
    assert [p.entry_id for p in got] == [e.entry_id for e, _ in entries]
    for (_, data), n in zip(entries, range(10), strict=True):
        decoded = TXN_LOG_CODEC.decode_entry(data)
        assert decoded.batched and [r.txnid_least_bits for r in decoded.records] == [n]


async def test_records_submitted_during_an_fsync_form_the_next_batch(factory: ManagedLedgerFactory) -> None:
    ledger = await factory.open("adaptive-burst")
    config = BatchedWriteConfig(enabled=True, max_records=512, max_delay_millis=NEVER_MS)
    writer = BufferedWriter(ledger, TXN_LOG_CODEC, config)
    # The first leaves at the end of its loop turn (the ledger is idle); the others, submitted in the
    # next turn while it is in the ledger (which cannot settle it that fast), accumulate and leave
    # together when it does.
    futs = [writer.submit(new_txn(0, 0))]
    await asyncio.sleep(0)
    assert writer.pending_records == 0, "the idle flush should have handed the first record over"
    futs += [writer.submit(new_txn(0, n)) for n in range(1, 200)]
    got = await asyncio.wait_for(asyncio.gather(*futs), 30)
    await writer.close()
    entries = await read_all(factory, "adaptive-burst")
    assert len(entries) == 2
    first, second = (TXN_LOG_CODEC.decode_entry(data) for _, data in entries)
    assert [r.txnid_least_bits for r in first.records] == [0]
    assert [r.txnid_least_bits for r in second.records] == list(range(1, 200))
    (p0, _), (p1, _) = entries
    assert got == [WritePosition(p0.ledger_id, p0.entry_id, 1, 0)] + [
        WritePosition(p1.ledger_id, p1.entry_id, 199, i) for i in range(199)
    ]
    assert isinstance(p0, Position)
