"""What a subscription needs from the layer below (its pending-ack log) and from the edge (consumers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from txnkeeper.ledger.position import Position
from txnkeeper.topic.records import DecodedRecord
from txnkeeper.txnid import TxnID


class IndexAck(NamedTuple):
    """Batch indexes of one batched entry acknowledged together: bit i of ``acked`` set = batch index
    i acknowledged (the complement of Pulsar's ack set, whose set bits are the indexes left)."""

    position: Position
    acked: int
    batch_size: int


class Consumer(Protocol):
    """A connected consumer of a subscription; ``deliver`` pushes one message to it, ``read_failed``
    tells it why nothing more comes."""

    @property
    def consumer_id(self) -> int: ...

    @property
    def ready(self) -> bool:
        """Whether it can take a message now: connected, and its connection not backed up with
        messages its peer has not read (the pod calls the subscription's ``notify`` once it can
        again)."""
        ...

    def deliver(
        self,
        position: Position,
        record: DecodedRecord,
        redelivery_count: int,
        ack_set: list[int] | None = None,
    ) -> None:
        """Push the message ``record`` (a data record: payload, key, and Pulsar metadata if any);
        ``ack_set``: of a batched entry some of whose indexes are acknowledged or pending in a
        transaction, the indexes still to deliver as Pulsar's ack-set words (the client skips the
        others)."""
        ...

    # The subscription cannot read the entries after ``after`` (None: from the first): say why.
    def read_failed(self, after: Position | None, message: str) -> None: ...

    def detach(self) -> bool:
        """The subscription was reset (a seek): True if the consumer leaves it (a Pulsar consumer is
        closed and its client subscribes again, as Pulsar's broker does), False if it stays attached
        and receives from the new position on."""
        ...


class Cursor(Protocol):
    """The managed-ledger cursor operations a subscription uses (contracts §1 ``ManagedCursor``)."""

    def mark_delete_position(self) -> Position | None: ...

    def is_deleted(self, position: Position) -> bool: ...

    def holds(self, position: Position) -> bool: ...  # a durable entry of a live ledger

    async def mark_delete(self, position: Position) -> None: ...

    async def delete(self, positions: Iterable[Position]) -> None: ...

    async def reset(self, position: Position) -> None: ...  # everything after ``position`` undeleted

    # Remaining batch indexes as ack-set words: None if none was deleted, [] if the entry is.
    def ack_set(self, position: Position) -> list[int] | None: ...

    async def delete_round(
        self, positions: Iterable[Position], batch_indexes: Iterable[tuple[Position, int, Iterable[int]]]
    ) -> None: ...


class PartitionReader(Protocol):
    """What a subscription reads from its partition (implemented by ``Partition``)."""

    async def read_after(
        self, position: Position | None, max_entries: int
    ) -> list[tuple[Position, bytes]]: ...


class PendingAckLog(Protocol):
    """The subscription's pending-ack store (PendingAckMetadataEntry records)."""

    # Both queue their record at the call (call order is log order) and return a future resolved
    # once it is durable; refusals (a closed store) raise at the call.
    def log_ack(
        self,
        txn_id: TxnID,
        positions: list[Position],
        cumulative: bool,
        index_acks: list[IndexAck] | None = None,
    ) -> asyncio.Future[Any]: ...

    def log_end(self, txn_id: TxnID, commit: bool) -> asyncio.Future[Any]: ...

    async def delete_txn(self, txn_id: TxnID) -> None: ...

    async def delete_txns(self, txn_ids: list[TxnID]) -> None: ...


@dataclass(slots=True)
class RecoveredPendingAck:
    """A transaction's acks as the pending-ack replay left them; ``ended``: None, True=commit, False=abort."""

    txn_id: TxnID
    individual: list[Position] = field(default_factory=list)
    cumulative: Position | None = None
    ended: bool | None = None
    index_acks: list[IndexAck] = field(default_factory=list)
