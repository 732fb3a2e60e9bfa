"""Which messages of a subscription are acknowledged inside still-open transactions (conflict rules).

Pulsar's pending-ack rules: a message pending in one transaction cannot be acknowledged by another
transaction, nor by a plain ack (that ack fails with a conflict, and the caller's transaction must
abort); a transactional cumulative ack conflicts with any other transaction's pending ack at or
below it. Pure state, no I/O: the subscription reserves here before it logs, releases on end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from txnkeeper.errors import TxnConflictError
from txnkeeper.ledger.position import Position
from txnkeeper.txnid import TxnID


@dataclass(slots=True)
class TxnAcks:
    """What one transaction acknowledged on this subscription."""

    individual: set[Position] = field(default_factory=set)
    cumulative: Position | None = None


class PendingAcks:
    """Pending (uncommitted) transactional acks of one subscription."""

    def __init__(self) -> None:
        self._owner: dict[Position, TxnID] = {}
        self._by_txn: dict[TxnID, TxnAcks] = {}
        # Transactions holding a cumulative ack: usually none, so the common checks stay O(1).
        self._cumulative: dict[TxnID, Position] = {}

    def txn_acks(self, txn_id: TxnID) -> TxnAcks | None:
        return self._by_txn.get(txn_id)

    def is_pending(self, position: Position) -> bool:
        if position in self._owner:
            return True
        return any(position <= c for c in self._cumulative.values())

    def reserve(self, txn_id: TxnID, positions: list[Position], cumulative: bool) -> list[Position]:
        """Record the acks of ``txn_id``; raise ``TxnConflictError`` (recording nothing) on a conflict.

        Returns the positions that are new for this transaction (only those need logging).
        """
        owners = self._owner
        for position in positions:
            owner = owners.get(position)
            if owner is not None and owner != txn_id:
                raise TxnConflictError(f"message {position} is already acknowledged in transaction {owner}")
            # Only transactions holding a cumulative ack can cover a position: scanning every pending
            # transaction here made each ack O(transactions in flight).
            for other, covered_to in self._cumulative.items():
                if other != txn_id and position <= covered_to:
                    raise TxnConflictError(
                        f"message {position} is covered by a cumulative ack of transaction {other}"
                    )
        acks = self._by_txn.get(txn_id)
        if cumulative:
            (position,) = positions
            conflicting = [p for p, owner in self._owner.items() if owner != txn_id and p <= position]
            if conflicting:
                owner = self._owner[conflicting[0]]
                raise TxnConflictError(
                    f"cumulative ack to {position} covers {conflicting[0]}, pending in transaction {owner}"
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

    def unreserve(self, txn_id: TxnID, positions: list[Position], cumulative: bool) -> None:
        """Undo a ``reserve`` whose logging failed."""
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
        if not acks.individual and acks.cumulative is None:
            del self._by_txn[txn_id]

    def release(self, txn_id: TxnID) -> TxnAcks:
        """Forget the transaction's pending acks (it ended); return them."""
        acks = self._by_txn.pop(txn_id, None) or TxnAcks()
        self._cumulative.pop(txn_id, None)
        for position in acks.individual:
            if self._owner.get(position) == txn_id:
                del self._owner[position]
        return acks

    def conflict_for_plain(self, positions: list[Position], cumulative: bool) -> str | None:
        """Why a plain ack of ``positions`` must be refused (a pending transactional ack), if it must."""
        for position in positions:
            if cumulative:
                below = [p for p in self._owner if p <= position]
                if below:
                    return f"message {below[0]} is pending in transaction {self._owner[below[0]]}"
            elif self.is_pending(position):
                return f"message {position} is pending in a transaction"
        return None

    @property
    def txn_count(self) -> int:
        return len(self._by_txn)

    @property
    def position_count(self) -> int:
        return len(self._owner)
