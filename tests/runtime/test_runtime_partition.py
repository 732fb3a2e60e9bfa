"""A partition on a real managed ledger: transaction markers, replay after reopening, housekeeping, and
the fences that outlive forgotten outcomes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from txnkeeper.errors import ConsumerBusyError, InvalidTxnStatusError, TxnConflictError
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar_api
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.topic import subscription as subscription_module
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.pending_ack_log import PendingAckLogAdapter
from txnkeeper.topic.ports import IndexAck
from txnkeeper.topic.service import TopicLedger, TopicService
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.txnbuffer import TxnOutcome
from txnkeeper.topic.txnfence import now_ms
from txnkeeper.txnid import TxnID


def cursor_only(cursor: Any) -> Any:
    """A subscription as a partition's housekeeping sees it (its cursor only; no dispatch)."""
    return SimpleNamespace(
        mark_delete_position=cursor.mark_delete_position, is_acknowledged=cursor.is_deleted
    )


async def test_replay_and_housekeeping_on_real_ledgers(tmp_path: Path) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/p", config)
    partition = Partition("persistent://t/ns/p", ledger)
    await partition.recover()
    old, new, dropped = TxnID(0, 1), TxnID(0, 2), TxnID(0, 3)
    await partition.publish(b"a", "", old)
    await partition.end_txn(old, commit=True, deadline_ms=now_ms() + 600_000)
    await partition.end_txn(old, commit=True)  # idempotent: no second marker
    await partition.publish(b"d", "", dropped)
    await partition.end_txn(dropped, commit=False)
    for i in range(6):
        await partition.publish(f"p{i}".encode(), "", None)
    await partition.publish(b"b", "", new)
    assert ledger.ledger_ids()[0] != ledger.current_ledger_id()  # rolled over at least once
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/p", config)
    partition = Partition("persistent://t/ns/p", ledger)
    await partition.recover()  # the outcome comes back from the marker; `new` is still open
    assert partition.buffer.outcome(old) is TxnOutcome.COMMITTED
    assert partition.buffer.outcome(dropped) is TxnOutcome.ABORTED
    assert partition.buffer.outcome(new) is TxnOutcome.OPEN
    assert partition.buffer.ended_ids() == [dropped, old]  # the commit is kept until its deadline
    cursor = await ledger.open_cursor("sub")
    first = ledger.ledger_ids()[0]
    partition.subscriptions["sub"] = cast(Subscription, cursor_only(cursor))
    await cursor.mark_delete(cast(Any, ledger.last_confirmed_entry()))
    await partition.housekeeping()
    assert ledger.ledger_ids()[0] > first  # consumed ledgers were deleted
    # The abort is forgotten with its marker's ledger (its messages went first); the commit stays a
    # fence until its deadline; the open txn keeps its first message's ledger.
    assert partition.buffer.ended_ids() == [old]
    assert partition.buffer.outcome(new) is TxnOutcome.OPEN
    assert ledger.ledger_ids()[0] <= cast(Any, partition.buffer.first_open_position()).ledger_id
    await factory.close()


async def test_a_forgotten_txn_stays_fenced_until_its_deadline(tmp_path: Path) -> None:
    """A zombie holding a still-valid ticket cannot write into a txn whose outcome the partition already
    forgot (its marker's ledger was trimmed): the deadline travels in the marker, also through a replay."""
    config = ManagedLedgerConfig(max_entries_per_ledger=2)
    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/f", config)
    partition = Partition("persistent://t/ns/f", ledger)
    await partition.recover()
    future_deadline = now_ms() + 3_600_000
    alive, expired, unknown = TxnID(0, 1), TxnID(0, 2), TxnID(0, 3)
    await partition.publish(b"a", "", alive)
    await partition.end_txn(alive, commit=False, deadline_ms=future_deadline)
    await partition.end_txn(expired, commit=False, deadline_ms=1)  # long past
    await partition.end_txn(unknown, commit=False)  # a coordinator that did not say
    for i in range(4):
        await partition.publish(f"p{i}".encode(), "", None)
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/f", config)
    partition = Partition("persistent://t/ns/f", ledger)
    await partition.recover()
    cursor = await ledger.open_cursor("sub")
    partition.subscriptions["sub"] = cast(Subscription, cursor_only(cursor))
    await cursor.mark_delete(cast(Any, ledger.last_confirmed_entry()))
    await partition.housekeeping()
    assert alive not in partition.buffer.ended_ids()  # forgotten...
    with pytest.raises(InvalidTxnStatusError, match="already ended"):
        await partition.publish(b"zombie", "", alive)  # ...but still fenced
    assert len(partition.late_fence) == 1  # the expired and the deadline-less ones are not kept
    await partition.publish(b"other txn", "", TxnID(0, 4))
    await factory.close()


async def test_a_subscription_fences_what_its_bounded_memory_forgets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription_module, "ENDED_MEMORY", 1)
    factory = ManagedLedgerFactory(tmp_path / "ledgers")

    async def open_ledger(topic: str) -> TopicLedger:
        return await factory.open(topic)

    async def open_pending_ack(topic: str, subscription: str) -> PendingAckLogAdapter:
        return PendingAckLogAdapter(await PendingAckStore.open(factory, topic, subscription))

    service = TopicService(tmp_path / "subscriptions.json", open_ledger, open_pending_ack)
    await service.recover()
    topic = "persistent://t/ns/s"
    position = await service.publish(topic, b"m", "", None)
    subscription = await service.subscription(topic, "s")
    first, second = TxnID(0, 1), TxnID(0, 2)
    await service.end_txn_on_subscription(topic, "s", first, False, now_ms() + 3_600_000)
    await service.end_txn_on_subscription(topic, "s", second, False, now_ms() + 3_600_000)  # forgets first
    with pytest.raises(InvalidTxnStatusError, match="already ended"):
        await subscription.ack([position], False, first)
    await subscription.ack([position], False, TxnID(0, 3))  # another txn's ack is taken
    await service.close()
    await factory.close()


async def test_batch_index_acks_pending_in_transactions_survive_a_restart(tmp_path: Path) -> None:
    """Transactional acks of single messages of a batched entry (Pulsar's ack sets) are logged in the
    pending-ack store, come back pending after a restart (still conflicting per index), and a commit
    then deletes exactly those indexes from the cursor; an abort gives its indexes back."""
    factory = ManagedLedgerFactory(tmp_path / "ledgers")

    async def open_ledger(topic: str) -> TopicLedger:
        return await factory.open(topic)

    async def open_pending_ack(topic: str, subscription: str) -> PendingAckLogAdapter:
        return PendingAckLogAdapter(await PendingAckStore.open(factory, topic, subscription))

    topic = "persistent://t/ns/batched"
    batch = pulsar_api.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=6
    )
    service = TopicService(tmp_path / "subscriptions.json", open_ledger, open_pending_ack)
    await service.recover()
    partition = await service.partition(topic)
    entry = await partition.publish_future(b"six messages", "", None, batch.SerializeToString())
    subscription = await service.subscription(topic, "s")
    assert await subscription.batch_size(entry) == 6
    kept, dropped = TxnID(0, 1), TxnID(0, 2)
    await subscription.ack([], False, kept, [IndexAck(entry, 0b000011, 6)])
    await subscription.ack([], False, dropped, [IndexAck(entry, 0b000100, 6)])
    await subscription.ack([], False, None, [IndexAck(entry, 0b100000, 6)])  # a plain index ack
    await service.close()
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path / "ledgers")
    service = TopicService(tmp_path / "subscriptions.json", open_ledger, open_pending_ack)
    await service.recover()
    subscription = await service.subscription(topic, "s")
    with pytest.raises(TxnConflictError, match="batch index 1"):
        subscription.ack([], False, TxnID(0, 3), [IndexAck(entry, 0b000010, 6)])
    with pytest.raises(TxnConflictError, match=r"batch index 5 .* already acknowledged"):
        subscription.ack([], False, TxnID(0, 3), [IndexAck(entry, 0b100000, 6)])
    with pytest.raises(ConsumerBusyError, match="before seeking"):
        await subscription.reset(Position(entry.ledger_id, -1))  # a seek while transactions hold acks
    await service.end_txn_on_subscription(topic, "s", kept, True)
    await service.end_txn_on_subscription(topic, "s", dropped, False)
    await service.close()  # drains the deferred cursor update of the commit
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path / "ledgers")
    service = TopicService(tmp_path / "subscriptions.json", open_ledger, open_pending_ack)
    await service.recover()
    subscription = await service.subscription(topic, "s")
    # Indexes 0, 1 (committed) and 5 (plain) are gone; 2 (aborted), 3 and 4 are left.
    assert subscription._cursor.ack_set(entry) == [0b011100]
    await subscription.ack([], False, None, [IndexAck(entry, 0b011100, 6)])
    assert subscription.is_acknowledged(entry)
    await service.close()
    await factory.close()
