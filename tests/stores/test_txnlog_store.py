"""Transaction log store on the real managed ledger: replay of mixed formats, batch-index deletes,
trimming past the last batched ledger, format levels, census, stats and metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter import BATCH_HEADER, BatchedWriteConfig, WritePosition
from txnkeeper.bufferedwriter.codec import RecordEncodeError
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.txnlog import (
    BatchedWriteNotAllowedError,
    FormatLevelError,
    StoreAlreadyOpenError,
    StoreClosedError,
    TransactionLogStore,
    TxnID,
    transaction_log_name,
)

from .helpers import add_partition, add_subscription, new_txn, update

BATCH = BatchedWriteConfig(enabled=True, max_records=8, max_delay_millis=1)
PLAIN = BatchedWriteConfig(enabled=False)


async def run_txn(
    store: TransactionLogStore, seq: int, end: tm.TxnStatus.ValueType | None = None
) -> list[WritePosition]:
    c = store.coordinator_id
    out = [
        await store.append(new_txn(c, seq, owner=f"client-{seq}")),
        await store.append(add_partition(c, seq, f"persistent://t/ns/p{seq}", "persistent://t/ns/shared")),
        await store.append(add_subscription(c, seq, "persistent://t/ns/shared", f"sub{seq}")),
    ]
    if end is not None:
        mid = tm.COMMITTING if end == tm.COMMITTED else tm.ABORTING
        out.append(await store.append(update(c, seq, tm.OPEN, mid)))
        out.append(await store.append(update(c, seq, mid, end)))
    return out


async def test_replay_of_mixed_batched_unbatched_and_oversized_entries(factory: ManagedLedgerFactory) -> None:
    store = await TransactionLogStore.open(factory, 3, BATCH)
    await asyncio.gather(*(run_txn(store, seq) for seq in range(10)))  # batched
    await store.configure(PLAIN)
    await run_txn(store, 10)  # plain entries
    big_owner = "o" * 600
    await store.configure(
        BatchedWriteConfig(enabled=True, max_records=8, max_size_bytes=512, max_delay_millis=1)
    )
    oversized, small = await asyncio.gather(
        store.append(new_txn(3, 11, owner=big_owner)), store.append(new_txn(3, 12))
    )
    assert oversized.batch_size == 0, "a record >= maxSize must be written alone, unbatched"
    await store.append(update(3, 0, tm.OPEN, tm.COMMITTING))
    formats = await store.live_entry_formats()
    assert formats.batched > 0 and formats.unbatched > 0
    await store.close()

    reopened = await TransactionLogStore.open(factory, 3, PLAIN)
    state = await reopened.replay()
    assert sorted(state) == [TxnID(3, s) for s in range(13)]
    t0 = state[TxnID(3, 0)]
    assert t0.status == tm.COMMITTING and t0.status_name == "COMMITTING"
    assert t0.partitions == ["persistent://t/ns/p0", "persistent://t/ns/shared"]
    assert t0.subscriptions == [("persistent://t/ns/shared", "sub0")]
    assert t0.owner == "client-0" and t0.timeout_ms == 60_000 and t0.complete
    assert t0.last_modification_time == 1_800_000_000_000
    assert state[TxnID(3, 11)].owner == big_owner
    assert state[TxnID(3, 10)].positions == reopened.txn_positions(TxnID(3, 10))
    assert all(p.batch_size == 0 for p in state[TxnID(3, 10)].positions)
    assert any(p.batch_size > 0 for p in state[TxnID(3, 5)].positions)
    assert small in state[TxnID(3, 12)].positions
    await reopened.close()


async def test_delete_txn_deletes_at_batch_index_level_and_replay_skips(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(
        factory, 0, BatchedWriteConfig(enabled=True, max_records=4, flush_mode="delay")
    )
    positions = await asyncio.gather(*(store.append(new_txn(0, s)) for s in range(4)))
    assert {p.entry_id for p in positions} == {positions[0].entry_id}, "four NEW records fill one batch"
    await store.delete_txn(TxnID(0, 1))
    await store.delete_txn(TxnID(0, 1))  # idempotent
    await store.close()

    store = await TransactionLogStore.open(factory, 0)
    assert sorted(await store.replay()) == [TxnID(0, 0), TxnID(0, 2), TxnID(0, 3)]
    census = await store.live_entry_formats()
    assert census.batched == 1
    for s in (0, 2, 3):
        await store.delete_txn(TxnID(0, s))
    assert (await store.live_entry_formats()).batched == 0, "an entry with no batch index left is deleted"
    await store.close()
    store = await TransactionLogStore.open(factory, 0)
    assert await store.replay() == {}
    await store.close()


async def test_delete_txns_deletes_many_transactions_in_one_call_including_in_flight_records(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(factory, 0, BatchedWriteConfig(enabled=True, max_records=16))
    await asyncio.gather(*(run_txn(store, s) for s in range(6)))
    # Records of transaction 6 are still buffered when the deletion starts: it waits for them.
    in_flight = [store.append(new_txn(0, 6)), store.append(update(0, 6, tm.OPEN, tm.ABORTING))]
    await store.delete_txns([TxnID(0, s) for s in (0, 2, 4, 6)] + [TxnID(0, 99)])  # 99: never written
    assert all(f.done() for f in in_flight)
    for s in (0, 2, 4, 6):
        assert store.txn_positions(TxnID(0, s)) == []
    assert store.txn_count() == 3
    await store.delete_txns([TxnID(0, 0)])  # idempotent
    await store.close()
    store = await TransactionLogStore.open(factory, 0)
    assert sorted(await store.replay()) == [TxnID(0, 1), TxnID(0, 3), TxnID(0, 5)]
    await store.close()


async def test_after_all_txns_end_and_a_rollover_oldest_ledger_passes_last_batched(
    factory: ManagedLedgerFactory,
) -> None:
    cfg = ManagedLedgerConfig(max_entries_per_ledger=5)
    store = await TransactionLogStore.open(factory, 1, BATCH, ledger_config=cfg)
    await asyncio.gather(*(run_txn(store, s, end=tm.COMMITTED) for s in range(30)))
    ledgers_with_batches = store.ledger_ids()
    assert len(ledgers_with_batches) > 1, "entries spread over several ledgers"
    # The downgrade procedure: disable, roll over, remember LastBatchedLedger, end everything.
    await store.configure(PLAIN)
    last_batched = await store.rollover()
    assert last_batched == max(ledgers_with_batches)
    assert (await store.live_entry_formats()).batched > 0
    for s in range(30):
        await store.delete_txn(TxnID(1, s))
    await store.trim()
    oldest = store.oldest_live_ledger()
    assert oldest is not None and oldest > last_batched
    census = await store.live_entry_formats()
    assert (census.batched, census.unbatched, census.batched_positions) == (0, 0, [])
    await store.close()


async def test_trim_happens_by_itself_as_transactions_end(factory: ManagedLedgerFactory) -> None:
    cfg = ManagedLedgerConfig(max_entries_per_ledger=3)
    store = await TransactionLogStore.open(factory, 2, PLAIN, ledger_config=cfg)
    for s in range(6):
        await store.append(new_txn(2, s))
    first = store.ledger_ids()[0]
    for s in range(6):
        await store.delete_txn(TxnID(2, s))
    from .helpers import wait_until

    await wait_until(lambda: store.ledger_ids()[0] > first, "the fully deleted ledgers to be trimmed")
    await store.close()


async def test_level_1_refuses_a_live_batched_entry_naming_store_ledger_and_entry(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(factory, 4, PLAIN)
    await store.append(new_txn(4, 0))
    await store.configure(BATCH)
    pos = await store.append(new_txn(4, 1))
    await store.close()
    with pytest.raises(FormatLevelError) as info:
        await TransactionLogStore.open(factory, 4, format_level=1)
    err = info.value
    assert (err.store, err.ledger_id, err.entry_id) == (transaction_log_name(4), pos.ledger_id, pos.entry_id)
    assert f"ledger {pos.ledger_id} entry {pos.entry_id}" in str(err) and "__transaction_log_4" in str(err)

    # Once the batched record is deleted, a level-1 runtime may open the store.
    store = await TransactionLogStore.open(factory, 4)
    await store.delete_txn(TxnID(4, 1))
    await store.close()
    old = await TransactionLogStore.open(factory, 4, format_level=1)
    assert sorted(await old.replay()) == [TxnID(4, 0)]
    with pytest.raises(BatchedWriteNotAllowedError, match="format level 1"):
        await old.configure(BATCH)
    await old.close()


async def test_level_1_cannot_be_opened_with_batching(factory: ManagedLedgerFactory) -> None:
    with pytest.raises(BatchedWriteNotAllowedError, match="cannot enable batched writes"):
        await TransactionLogStore.open(factory, 5, BATCH, format_level=1)


async def test_one_store_per_log_per_process(factory: ManagedLedgerFactory) -> None:
    registry = CollectorRegistry()
    store = await TransactionLogStore.open(factory, 12, registry=registry)
    with pytest.raises(StoreAlreadyOpenError, match="'__transaction_log_12' is already open"):
        await TransactionLogStore.open(factory, 12, registry=registry)
    assert (
        registry.get_sample_value(
            "pulsar_txn_tc_bufferedwriter_records_written_total", {"coordinator_id": "12"}
        )
        == 0
    ), "the refused open must not take the open store's metrics away"
    await store.close()
    again = await TransactionLogStore.open(factory, 12, registry=registry)
    await again.close()


async def test_refused_open_leaves_no_metrics_behind(factory: ManagedLedgerFactory) -> None:
    registry = CollectorRegistry()
    with pytest.raises(BatchedWriteNotAllowedError):
        await TransactionLogStore.open(factory, 13, BATCH, format_level=1, registry=registry)
    assert (
        registry.get_sample_value(
            "pulsar_txn_tc_bufferedwriter_records_written_total", {"coordinator_id": "13"}
        )
        is None
    )


async def test_bad_records_and_closed_store_are_clear_errors(factory: ManagedLedgerFactory) -> None:
    store = await TransactionLogStore.open(factory, 6)
    with pytest.raises(ValueError, match="does not belong to coordinator 6"):
        await store.append(new_txn(7, 0))
    with pytest.raises(TypeError, match="TransactionMetadataEntry"):
        await store.append("NEW")  # type: ignore[arg-type]
    await store.close()
    with pytest.raises(StoreClosedError, match="closed"):
        await store.append(new_txn(6, 0))
    with pytest.raises(ValueError, match="coordinator id"):
        await TransactionLogStore.open(factory, -1)


async def test_stats_census_and_metrics(factory: ManagedLedgerFactory) -> None:
    registry = CollectorRegistry()
    store = await TransactionLogStore.open(factory, 9, BATCH, registry=registry)
    other = await TransactionLogStore.open(factory, 10, PLAIN, registry=registry)
    await asyncio.gather(*(store.append(new_txn(9, s)) for s in range(20)))
    await other.append(new_txn(10, 0))
    assert store.batched_write_stat() == {
        "batchEnabled": True,
        "batchedWriteMaxRecords": 8,
        "batchedWriteMaxSize": 4194304,
        "batchedWriteMaxDelayInMillis": 1,
        "batchedWriteFlushMode": "adaptive",
    }
    stats = store.internal_stats()
    assert stats["managedLedgerName"] == "__transaction_log_9"
    assert stats["managedLedgerInternalStats"]["numberOfEntries"] >= 3
    census = await store.live_entry_formats()
    assert census.batched >= 3 and census.unbatched == 0
    assert all(p.count(":") == 1 for p in census.batched_positions)
    assert census.to_json()["liveEntries"] == {"batched": census.batched, "unbatched": 0}
    p = "pulsar_txn_tc_bufferedwriter"
    assert registry.get_sample_value(f"{p}_records_written_total", {"coordinator_id": "9"}) == 20
    assert (
        registry.get_sample_value(
            f"{p}_entries_written_total", {"coordinator_id": "10", "format": "unbatched"}
        )
        == 1
    )
    assert registry.get_sample_value(f"{p}_batch_records_count", {"coordinator_id": "9"}) == census.batched
    await store.close()
    await other.close()


async def test_entries_on_disk_carry_pulsars_header(factory: ManagedLedgerFactory, data_dir: Path) -> None:
    store = await TransactionLogStore.open(factory, 11, BATCH)
    pos = await store.append(new_txn(11, 0))
    plain_store_pos = None
    await store.configure(PLAIN)
    plain_store_pos = await store.append(new_txn(11, 1))
    await store.close()
    ledger = await factory.open(transaction_log_name(11))
    assert (await ledger.read_entry(Position(pos.ledger_id, pos.entry_id))).startswith(BATCH_HEADER)
    raw = await ledger.read_entry(Position(plain_store_pos.ledger_id, plain_store_pos.entry_id))
    assert tm.TransactionMetadataEntry.FromString(raw) == new_txn(11, 1)
    await ledger.close()


async def test_append_all_writes_one_txns_records_in_order_and_refuses_a_mix_before_writing(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(factory, 3, BATCH, snapshots=True)
    begin = [
        new_txn(3, 1),
        add_partition(3, 1, "persistent://t/ns/p"),
        add_subscription(3, 1, "persistent://t/ns/p", "sub"),
    ]
    positions = await asyncio.gather(*store.append_all(begin))
    assert positions == sorted(positions) and store.txn_positions(TxnID(3, 1)) == positions
    with pytest.raises(ValueError, match="one transaction"):
        store.append_all([update(3, 2, tm.OPEN, tm.ABORTING), update(3, 1, tm.OPEN, tm.ABORTING)])
    with pytest.raises(ValueError, match="at least one"):
        store.append_all([])
    assert store.txn_count() == 1  # nothing of the refused call was written
    snapshot = store.capture_snapshot()  # the records were retained for it like append's
    (state,) = [s for t, s, _ in snapshot.txns if t == TxnID(3, 1)]
    assert state.partitions == ["persistent://t/ns/p"] and state.subscriptions == [
        ("persistent://t/ns/p", "sub")
    ]
    await store.delete_txns([TxnID(3, 1)])
    assert store.txn_count() == 0
    await store.close()
    reopened = await TransactionLogStore.open(factory, 3, BATCH)
    assert await reopened.replay() == {}
    await reopened.close()


async def test_a_record_missing_a_required_field_is_refused_saying_so_and_nothing_is_kept(
    factory: ManagedLedgerFactory,
) -> None:
    store = await TransactionLogStore.open(factory, 3, BATCH, snapshots=True)
    broken = add_subscription(3, 1, "persistent://t/ns/p", "sub")
    broken.subscriptions[0].ClearField("subscription")  # a required field of Subscription
    with pytest.raises(RecordEncodeError, match="required"):
        store.append(broken)
    with pytest.raises(RecordEncodeError, match="required"):
        store.append_all([new_txn(3, 1), broken])
    # NEW of the refused append_all was written (records go in order), the broken one was not.
    await store.flush()
    assert len(store.txn_positions(TxnID(3, 1))) == 1
    snapshot = store.capture_snapshot()
    assert [t for t, _, _ in snapshot.txns] == [TxnID(3, 1)]
    await store.close()
