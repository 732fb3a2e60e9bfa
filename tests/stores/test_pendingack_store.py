"""Pending-ack store on the real managed ledger: its own log name, writer and settings; replay of acks
and logged outcomes; deletes when a transaction ends."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.pendingack import FormatLevelError, PendingAckStore, TxnID, pending_ack_log_name
from txnkeeper.txnlog import TransactionLogStore

from .helpers import ack, end_marker, new_txn

TOPIC = "persistent://public/default/orders-partition-0"


def test_log_name_is_pulsars() -> None:
    assert pending_ack_log_name(TOPIC, "billing") == f"{TOPIC}-billing__transaction_pending_ack"


async def test_replay_restores_open_acks_and_logged_outcomes(factory: ManagedLedgerFactory) -> None:
    store = await PendingAckStore.open(
        factory, TOPIC, "billing", BatchedWriteConfig(enabled=True, max_records=16, max_delay_millis=1)
    )
    await asyncio.gather(*(store.append(ack(s, 100 + s, s)) for s in range(6)))
    await store.append(ack(0, 200, 1))
    await store.append(end_marker(1, commit=True))
    await store.append(end_marker(2, commit=False))
    await store.delete_txn(TxnID(0, 3))
    await store.close()

    store = await PendingAckStore.open(factory, TOPIC, "billing")
    state = await store.replay()
    assert sorted(state) == [TxnID(0, s) for s in (0, 1, 2, 4, 5)]
    assert [(m.ledgerId, m.entryId) for a in state[TxnID(0, 0)].acks for m in a.pending_ack_metadata] == [
        (100, 0),
        (200, 1),
    ]
    assert state[TxnID(0, 0)].outcome is None
    assert state[TxnID(0, 1)].committed and not state[TxnID(0, 1)].aborted
    assert state[TxnID(0, 2)].aborted
    assert store.name == pending_ack_log_name(TOPIC, "billing")
    await store.close()


async def test_stores_have_separate_writers_and_settings(factory: ManagedLedgerFactory) -> None:
    registry = CollectorRegistry()
    acks = await PendingAckStore.open(
        factory,
        TOPIC,
        "s1",
        BatchedWriteConfig(enabled=True, max_records=4, flush_mode="delay"),
        registry=registry,
    )
    log = await TransactionLogStore.open(factory, 0, BatchedWriteConfig(enabled=False), registry=registry)
    await asyncio.gather(*(acks.append(ack(s, 1, s)) for s in range(4)), log.append(new_txn(0, 1)))
    assert acks.batched_write_stat()["batchEnabled"] is True
    assert log.batched_write_stat()["batchEnabled"] is False
    labels = {"topic": TOPIC, "subscription": "s1"}
    p = "pulsar_txn_pending_ack_store_bufferedwriter"
    assert registry.get_sample_value(f"{p}_flush_trigger_max_records_total", labels) == 1
    assert registry.get_sample_value(f"{p}_records_written_total", labels) == 4
    await acks.close()
    await log.close()


async def test_level_1_refuses_live_batched_pending_acks(factory: ManagedLedgerFactory) -> None:
    store = await PendingAckStore.open(factory, TOPIC, "s2", BatchedWriteConfig(enabled=True))
    pos = await store.append(ack(7, 5, 5))
    await store.close()
    with pytest.raises(
        FormatLevelError, match=rf"s2__transaction_pending_ack.*ledger {pos.ledger_id} entry 0"
    ):
        await PendingAckStore.open(factory, TOPIC, "s2", format_level=1)


async def test_records_without_txn_or_op_are_refused(factory: ManagedLedgerFactory) -> None:
    store = await PendingAckStore.open(factory, TOPIC, "s3")
    with pytest.raises(ValueError, match="needs pending_ack_op, txnid_most_bits and txnid_least_bits"):
        await store.append(pa.PendingAckMetadataEntry(pending_ack_op=pa.ACK))
    bad = ack(1, 1, 1)
    bad.pending_ack_metadata[0].ClearField("entryId")
    with pytest.raises(ValueError, match="required"):
        await store.append(bad)
    assert await store.replay() == {}
    await store.close()
    with pytest.raises(ValueError, match="subscription must be a non-empty string"):
        await PendingAckStore.open(factory, TOPIC, "")
