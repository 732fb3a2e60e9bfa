"""The transaction buffer of one partition: which transactions' messages may be dispatched.

Rules (Pulsar's): a message of an open transaction is never dispatched, and neither is anything after
it in the partition until that transaction resolves (per-partition order); committed transactions'
messages are dispatched at their original positions; aborted ones never. Pure state, no I/O: the
partition feeds it what it writes and replays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from enum import Enum
from typing import NamedTuple

from txnkeeper.ledger.position import Position
from txnkeeper.txnid import TxnID


class TxnOutcome(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


class EndedTxn(NamedTuple):
    """How a transaction ended on this partition: committed or not, its marker's position and its
    timeout deadline (0: unknown).

    Kept as is in the buffer and handed as is to its snapshots: a snapshot of a partition whose
    outcomes are never trimmed (a topic without subscriptions) copies every one of them, and building
    a row per transaction for each capture was most of a snapshot's cost.
    """

    txn_id: TxnID
    committed: bool
    marker: Position
    deadline_ms: int


class TransactionBuffer:
    """Outcome of every transaction that wrote to this partition (bounded memory of ended ones)."""

    def __init__(self) -> None:
        self._open: set[TxnID] = set()
        # txn -> how it ended, in marker order
        self._ended: OrderedDict[TxnID, EndedTxn] = OrderedDict()
        self._ending: set[TxnID] = set()

    def outcome(self, txn_id: TxnID) -> TxnOutcome:
        ended = self._ended.get(txn_id)
        if ended is None:
            return TxnOutcome.OPEN
        return TxnOutcome.COMMITTED if ended.committed else TxnOutcome.ABORTED

    def accepts_message(self, txn_id: TxnID) -> bool:
        """A transaction that ended (or is ending) here takes no more messages (zombie producers)."""
        return txn_id not in self._ended and txn_id not in self._ending

    def message_written(self, txn_id: TxnID) -> None:
        if txn_id not in self._ended:
            self._open.add(txn_id)

    def is_ended(self, txn_id: TxnID) -> bool:
        return txn_id in self._ended

    def begin_end(self, txn_id: TxnID) -> None:
        self._ending.add(txn_id)

    def cancel_end(self, txn_id: TxnID) -> None:
        self._ending.discard(txn_id)

    def ended(self, txn_id: TxnID, committed: bool, marker: Position, deadline_ms: int = 0) -> None:
        self._ending.discard(txn_id)
        self._open.discard(txn_id)
        self._ended[txn_id] = EndedTxn(txn_id, committed, marker, deadline_ms)
        self._ended.move_to_end(txn_id)

    def forget_before(self, position: Position) -> list[tuple[TxnID, int]]:
        """Forget outcomes whose marker is at or before ``position`` (the caller makes sure no reader
        can reach those entries any more: a transaction's messages all precede its marker); returns
        the forgotten transactions with their deadlines (the caller keeps refusing late messages of
        those whose deadline has not passed)."""
        forgotten: list[tuple[TxnID, int]] = []
        ended = self._ended
        while ended:
            oldest = next(iter(ended.values()))
            if oldest.marker > position:
                break
            del ended[oldest.txn_id]
            forgotten.append((oldest.txn_id, oldest.deadline_ms))
        return forgotten

    def export(self) -> tuple[list[EndedTxn], list[TxnID]]:
        """The ended transactions (in marker order) and the open ones, for a snapshot (copies of the
        lists, made without building anything per transaction)."""
        return list(self._ended.values()), list(self._open)

    def restore(self, ended: Iterable[tuple[TxnID, bool, Position, int]], opened: Iterable[TxnID]) -> None:
        """Start from a snapshot's state (before replaying the entries after it)."""
        for txn_id, committed, marker, deadline_ms in ended:
            self.ended(txn_id, committed, marker, deadline_ms)
        for txn_id in opened:
            self.message_written(txn_id)

    @property
    def ongoing(self) -> int:
        return len(self._open)

    @property
    def ended_count(self) -> int:
        return len(self._ended)
