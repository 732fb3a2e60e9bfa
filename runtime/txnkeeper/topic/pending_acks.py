"""Which messages of a subscription are acknowledged inside still-open transactions (conflict rules).

Pulsar's pending-ack rules: a message pending in one transaction cannot be acknowledged by another
transaction, nor by a plain ack (that ack fails with a conflict, and the caller's transaction must
abort); a transactional cumulative ack conflicts with any other transaction's pending ack at or
below it. Pure state, no I/O: the subscription reserves here before it logs, releases on end.

A batched entry (Pulsar's producer batching: one entry, many messages) can be acknowledged a batch
index at a time (``IndexAck``): the same rules then hold per index. Two transactions may hold
different indexes of one entry; an index pending in one cannot be acknowledged by another, nor by
a plain ack; a whole-entry or cumulative ack over any pending index conflicts with its transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from txnkeeper.errors import TxnConflictError
from txnkeeper.ledger.ackset import lowest_index
from txnkeeper.ledger.position import Position
from txnkeeper.topic.ports import IndexAck
from txnkeeper.txnid import TxnID


@dataclass(slots=True)
class TxnAcks:
    """What one transaction acknowledged on this subscription."""

    individual: set[Position] = field(default_factory=set)
    cumulative: Position | None = None
    # Batched entries acknowledged a batch index at a time: position -> (indexes acked, batch size).
    indexes: dict[Position, tuple[int, int]] = field(default_factory=dict)

    def index_acks(self) -> list[IndexAck]:
        return [IndexAck(p, mask, size) for p, (mask, size) in sorted(self.indexes.items())]

    @property
    def empty(self) -> bool:
        return not self.individual and self.cumulative is None and not self.indexes


class PendingAcks:
    """Pending (uncommitted) transactional acks of one subscription."""

    def __init__(self) -> None:
        self._owner: dict[Position, TxnID] = {}
        self._by_txn: dict[TxnID, TxnAcks] = {}
        # Transactions holding a cumulative ack: usually none, so the common checks stay O(1).
        self._cumulative: dict[TxnID, Position] = {}
        # Batch indexes pending per entry and transaction, and each such entry's batch size.
        self._index_owners: dict[Position, dict[TxnID, int]] = {}
        self._batch_sizes: dict[Position, int] = {}

    def txn_acks(self, txn_id: TxnID) -> TxnAcks | None:
        return self._by_txn.get(txn_id)

    def is_pending(self, position: Position) -> bool:
        """Whether the whole entry is pending (a whole-entry or a covering cumulative ack)."""
        if position in self._owner:
            return True
        return any(position <= c for c in self._cumulative.values())

    def index_mask(self, position: Position) -> int:
        """The batch indexes of ``position`` pending in any transaction (0: none)."""
        owners = self._index_owners.get(position)
        if not owners:
            return 0
        mask = 0
        for indexes in owners.values():
            mask |= indexes
        return mask

    def batch_size(self, position: Position) -> int | None:
        """The batch size of an entry with pending batch indexes (None: it has none)."""
        return self._batch_sizes.get(position)

    def _check_free(self, txn_id: TxnID, position: Position, indexes: int) -> None:
        """Refuse (``TxnConflictError``) if another transaction holds ``indexes`` of ``position``
        (0: the whole entry) or covers it with a cumulative ack."""
        owner = self._owner.get(position)
        if owner is not None and owner != txn_id:
            raise TxnConflictError(f"message {position} is already acknowledged in transaction {owner}")
        # Only transactions holding a cumulative ack can cover a position: scanning every pending
        # transaction here made each ack O(transactions in flight).
        for other, covered_to in self._cumulative.items():
            if other != txn_id and position <= covered_to:
                raise TxnConflictError(
                    f"message {position} is covered by a cumulative ack of transaction {other}"
                )
        owners = self._index_owners.get(position)
        if owners:
            for other, held in owners.items():
                overlap = held if indexes == 0 else held & indexes
                if other != txn_id and overlap:
                    raise TxnConflictError(
                        f"batch index {lowest_index(overlap)} of message {position} is already"
                        f" acknowledged in transaction {other}"
                    )

    def reserve(self, txn_id: TxnID, positions: list[Position], cumulative: bool) -> list[Position]:
        """Record the acks of ``txn_id``; raise ``TxnConflictError`` (recording nothing) on a conflict.

        Returns the positions that are new for this transaction (only those need logging).
        """
        for position in positions:
            self._check_free(txn_id, position, 0)
        acks = self._by_txn.get(txn_id)
        if cumulative:
            (position,) = positions
            conflicting = [p for p, owner in self._owner.items() if owner != txn_id and p <= position]
            if conflicting:
                owner = self._owner[conflicting[0]]
                raise TxnConflictError(
                    f"cumulative ack to {position} covers {conflicting[0]}, pending in transaction {owner}"
                )
            for pending, owners in self._index_owners.items():
                other = next((t for t in owners if t != txn_id), None)
                if other is not None and pending <= position:
                    raise TxnConflictError(
                        f"cumulative ack to {position} covers batch indexes of {pending}, pending in"
                        f" transaction {other}"
                    )
            if acks is None:
                acks = self._by_txn[txn_id] = TxnAcks()
            if acks.cumulative is None or acks.cumulative < position:
                acks.cumulative = position
                self._cumulative[txn_id] = position
                return [position]
            return []
        if acks is None:
            acks = self._by_txn[txn_id] = TxnAcks()
        new = [p for p in dict.fromkeys(positions) if p not in acks.individual]
        for position in new:
            acks.individual.add(position)
            self._owner[position] = txn_id
        return new

    def reserve_indexes(self, txn_id: TxnID, index_acks: list[IndexAck]) -> list[IndexAck]:
        """Record batch-index acks of ``txn_id``; raise ``TxnConflictError`` (recording nothing) on a
        conflict. Returns what is new for this transaction (only that needs logging)."""
        for ack in index_acks:
            self._check_free(txn_id, ack.position, ack.acked)
        acks = self._by_txn.get(txn_id)
        if acks is None:
            acks = self._by_txn[txn_id] = TxnAcks()
        new: list[IndexAck] = []
        for ack in index_acks:
            position = ack.position
            if position in acks.individual:
                continue  # the whole entry is acknowledged in this transaction already
            held, _ = acks.indexes.get(position, (0, ack.batch_size))
            fresh = ack.acked & ~held
            if not fresh:
                continue
            acks.indexes[position] = (held | fresh, ack.batch_size)
            self._index_owners.setdefault(position, {})[txn_id] = held | fresh
            self._batch_sizes[position] = ack.batch_size
            new.append(IndexAck(position, fresh, ack.batch_size))
        if acks.empty:
            del self._by_txn[txn_id]
        return new

    def unreserve(
        self, txn_id: TxnID, positions: list[Position], cumulative: bool, index_acks: Sequence[IndexAck] = ()
    ) -> None:
        """Undo a ``reserve`` (and ``reserve_indexes``) whose logging failed."""
        acks = self._by_txn.get(txn_id)
        if acks is None:
            return
        if cumulative:
            acks.cumulative = None
            self._cumulative.pop(txn_id, None)
        for position in positions:
            acks.individual.discard(position)
            if self._owner.get(position) == txn_id:
                del self._owner[position]
        for ack in index_acks:
            held, size = acks.indexes.get(ack.position, (0, ack.batch_size))
            left = held & ~ack.acked
            if left:
                acks.indexes[ack.position] = (left, size)
            else:
                acks.indexes.pop(ack.position, None)
            self._drop_indexes(txn_id, ack.position, ack.acked)
        if acks.empty:
            del self._by_txn[txn_id]

    def _drop_indexes(self, txn_id: TxnID, position: Position, indexes: int) -> None:
        owners = self._index_owners.get(position)
        if owners is None:
            return
        left = owners.get(txn_id, 0) & ~indexes
        if left:
            owners[txn_id] = left
        else:
            owners.pop(txn_id, None)
        if not owners:
            del self._index_owners[position]
            self._batch_sizes.pop(position, None)

    def release(self, txn_id: TxnID) -> TxnAcks:
        """Forget the transaction's pending acks (it ended); return them."""
        acks = self._by_txn.pop(txn_id, None) or TxnAcks()
        self._cumulative.pop(txn_id, None)
        for position in acks.individual:
            if self._owner.get(position) == txn_id:
                del self._owner[position]
        for position, (mask, _) in acks.indexes.items():
            self._drop_indexes(txn_id, position, mask)
        return acks

    def conflict_for_plain(
        self, positions: list[Position], cumulative: bool, index_acks: Sequence[IndexAck] = ()
    ) -> str | None:
        """Why a plain ack of ``positions`` (and of batch indexes) must be refused (a pending
        transactional ack), if it must."""
        for position in positions:
            if cumulative:
                below = [p for p in self._owner if p <= position]
                below += [p for p in self._index_owners if p <= position]
                if below:
                    return f"message {below[0]} is pending in a transaction"
            elif self.is_pending(position) or position in self._index_owners:
                return f"message {position} is pending in a transaction"
        for ack in index_acks:
            overlap = self.index_mask(ack.position) & ack.acked
            if self.is_pending(ack.position) or overlap:
                index = lowest_index(overlap) if overlap else lowest_index(ack.acked)
                return f"batch index {index} of message {ack.position} is pending in a transaction"
        return None

    @property
    def txn_count(self) -> int:
        return len(self._by_txn)

    @property
    def position_count(self) -> int:
        return len(self._owner) + len(self._index_owners)
