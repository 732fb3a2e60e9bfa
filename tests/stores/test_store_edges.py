"""Store edges: ends racing in-flight records, unreadable entries, graceful close, cancelled callers and
failed deletes, all on the real managed ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from txnkeeper.bufferedwriter import BatchedWriteConfig, WritePosition
from txnkeeper.ledger import LedgerWriteError, ManagedLedgerFactory
from txnkeeper.txnlog import ReplayError, TransactionLogStore, TxnID, transaction_log_name

from .conftest import FailingIO
from .helpers import add_partition, new_txn, wait_until

# Pulsar's delay mode: records must stay buffered (adaptive would hand the first one over at once).
SLOW = BatchedWriteConfig(enabled=True, max_records=100, max_delay_millis=60_000, flush_mode="delay")


async def test_delete_txn_waits_for_records_still_in_flight(factory: ManagedLedgerFactory) -> None:
    store = await TransactionLogStore.open(factory, 0, SLOW)
    appends = [asyncio.ensure_future(store.append(r)) for r in (new_txn(0, 1), add_partition(0, 1, "p"))]
    await wait_until(lambda: store._log.writer.pending_records == 2, "both records to be buffered")
    ending = asyncio.ensure_future(store.delete_txn(TxnID(0, 1)))
    await asyncio.sleep(0)
    assert not ending.done(), "the end must wait for the buffered records"
    await store._log.writer.flush()
    await asyncio.gather(*appends, ending)
    assert store.txn_positions(TxnID(0, 1)) == []
    await store.close()
    store = await TransactionLogStore.open(factory, 0)
    assert await store.replay() == {}
    await store.close()


async def test_graceful_close_writes_buffered_records(factory: ManagedLedgerFactory) -> None:
    store = await TransactionLogStore.open(factory, 0, SLOW)
    appends = [asyncio.ensure_future(store.append(new_txn(0, s))) for s in range(3)]
    await asyncio.sleep(0)
    await store.close()
    positions = await asyncio.gather(*appends)
    assert [p.batch_index for p in positions] == [0, 1, 2]
    store = await TransactionLogStore.open(factory, 0)
    assert sorted(await store.replay()) == [TxnID(0, s) for s in range(3)]
    await store.close()


async def test_cancelled_caller_does_not_unwrite_its_record_and_it_is_still_deleted(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(factory, 0, SLOW)
    cancelled = asyncio.ensure_future(store.append(new_txn(0, 1)))
    kept = asyncio.ensure_future(store.append(new_txn(0, 2)))
    await asyncio.sleep(0)
    cancelled.cancel()
    await store._log.writer.flush()
    assert isinstance(await kept, WritePosition)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert len(store.txn_positions(TxnID(0, 1))) == 1, "the store knows where the record landed"
    await store.close()
    store = await TransactionLogStore.open(factory, 0)
    assert sorted(await store.replay()) == [TxnID(0, 1), TxnID(0, 2)], "the record was written all the same"
    await store.close()


async def test_a_cancelled_records_position_is_deleted_with_its_txn(factory: ManagedLedgerFactory) -> None:
    store = await TransactionLogStore.open(factory, 0, BatchedWriteConfig(enabled=True, max_delay_millis=20))
    cancelled = asyncio.ensure_future(store.append(new_txn(0, 1)))
    await asyncio.sleep(0)
    cancelled.cancel()
    await store.delete_txn(TxnID(0, 1))  # waits for the record to settle, then deletes it
    await store.close()
    store = await TransactionLogStore.open(factory, 0)
    assert await store.replay() == {}
    await store.close()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (bytes.fromhex("0e010007") + b"\x0a\x00", r"entry \d+:0 cannot be read: batched entry has version 7"),
        (b"\xff\xfe\xfd", r"entry \d+:0 cannot be read: .*not a valid TransactionMetadataEntry"),
    ],
)
async def test_unreadable_live_entry_refuses_to_open_naming_store_and_position(
    factory: ManagedLedgerFactory, entry: bytes, message: str
) -> None:
    ledger = await factory.open(transaction_log_name(3))
    await ledger.add_entry(entry)
    await ledger.close()
    with pytest.raises(ReplayError, match=rf"store '__transaction_log_3': {message}"):
        await TransactionLogStore.open(factory, 3)


async def test_failed_delete_is_retried_without_losing_positions(data_dir: Path) -> None:
    io = FailingIO()
    factory = ManagedLedgerFactory(data_dir, io=io, io_threads=2)
    try:
        store = await TransactionLogStore.open(factory, 0, BatchedWriteConfig(enabled=True, max_records=2))
        await asyncio.gather(store.append(new_txn(0, 1)), store.append(new_txn(0, 2)))
        io.failing = True
        with pytest.raises(LedgerWriteError):
            await store.delete_txn(TxnID(0, 1))
        io.failing = False
        assert store.txn_positions(TxnID(0, 1)), "positions are kept for the retry"
        await store.delete_txn(TxnID(0, 1))
        await store.close()
        store = await TransactionLogStore.open(factory, 0)
        assert sorted(await store.replay()) == [TxnID(0, 2)]
        await store.close()
    finally:
        await factory.close()
