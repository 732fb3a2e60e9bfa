"""Small helpers shared by the store tests: records of both logs and condition waits with deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pb import TransactionPendingAck_pb2 as pa

Op = tm.TransactionMetadataEntry.TransactionMetadataOp


def new_txn(
    coordinator: int, seq: int, timeout_ms: int = 60_000, owner: str = ""
) -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=Op.NEW,
        txnid_most_bits=coordinator,
        txnid_least_bits=seq,
        timeout_ms=timeout_ms,
        start_time=1_700_000_000_000 + seq,
        last_modification_time=1_700_000_000_000 + seq,
        max_local_txn_id=seq,
        owner=owner,
    )


def add_partition(coordinator: int, seq: int, *partitions: str) -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=Op.ADD_PARTITION, txnid_most_bits=coordinator, txnid_least_bits=seq, partitions=partitions
    )


def add_subscription(coordinator: int, seq: int, topic: str, sub: str) -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=Op.ADD_SUBSCRIPTION,
        txnid_most_bits=coordinator,
        txnid_least_bits=seq,
        subscriptions=[tm.Subscription(topic=topic, subscription=sub)],
    )


def update(
    coordinator: int, seq: int, expected: tm.TxnStatus.ValueType, new: tm.TxnStatus.ValueType
) -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=Op.UPDATE,
        txnid_most_bits=coordinator,
        txnid_least_bits=seq,
        expected_status=expected,
        new_status=new,
        last_modification_time=1_800_000_000_000 + seq,
    )


def ack(seq: int, ledger_id: int, entry_id: int, most: int = 0) -> pa.PendingAckMetadataEntry:
    return pa.PendingAckMetadataEntry(
        pending_ack_op=pa.ACK,
        ack_type=pa.CommandAck.Individual,
        txnid_most_bits=most,
        txnid_least_bits=seq,
        pending_ack_metadata=[pa.PendingAckMetadata(ledgerId=ledger_id, entryId=entry_id)],
    )


def end_marker(seq: int, commit: bool, most: int = 0) -> pa.PendingAckMetadataEntry:
    return pa.PendingAckMetadataEntry(
        pending_ack_op=pa.COMMIT if commit else pa.ABORT, txnid_most_bits=most, txnid_least_bits=seq
    )


async def wait_until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Wait for ``predicate`` with a deadline (polling, never a blind sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.001)
