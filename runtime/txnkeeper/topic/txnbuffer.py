"""The transaction buffer of one partition: which transactions' messages may be dispatched.

Rules (Pulsar's): a message of an open transaction is never dispatched, and neither is anything after
it in the partition until that transaction resolves (per-partition order); committed transactions'
messages are dispatched at their original positions; aborted ones never. Pure state, no I/O: the
partition feeds it what it writes and replays.

Why the ended transactions are kept as packed rows (``ENDED_ROW``, 41 bytes each, in marker order)
rather than one object per transaction: a snapshot copies every outcome kept, and a topic without
subscriptions never trims any. Building and JSON-encoding a row per transaction for each capture cost
a store pod 6-8 % of its CPU at 256 transactions in flight (on a thread holding the GIL, so its event
loop waited too) and grew without bound; copying one ``bytes`` object costs a memcpy. The rows are
also a third of the memory the objects took.

Open transactions are kept with the wall-clock time of their first message here: the oldest one's age
is how long the topic's later messages have been held back (``oldest_open_age_s``, the gauge an
operator alerts on before aborting it; issue 25).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator
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
    timeout deadline (0: unknown). The readable form of one ``ENDED_ROW``."""

    txn_id: TxnID
    committed: bool
    marker: Position
    deadline_ms: int


# One ended transaction, little-endian: txn most and least (u64: a block's most is 2**64 - 1),
# committed (0 or 1), marker ledger id and entry id, deadline ms (all >= 0).
ENDED_ROW = struct.Struct("<QQBqqq")
_ROW_SIZE = ENDED_ROW.size
# Byte offsets in a row of the committed flag and of the last (sign) byte of each signed field.
_COMMITTED_AT = 16
_SIGN_BYTES_AT = (24, 32, 40)
# Forgotten rows are cut from the front of the buffer's bytearray once they are this many bytes and
# at least half of it (a memmove amortised over the rows forgotten since).
_COMPACT_BYTES = 64 * 1024


def pack_ended(rows: Iterable[EndedTxn]) -> bytes:
    """``ENDED_ROW`` rows of ``rows``, in their order."""
    pack = ENDED_ROW.pack
    return b"".join(
        pack(txn.most, txn.least, 1 if committed else 0, marker.ledger_id, marker.entry_id, deadline_ms)
        for txn, committed, marker, deadline_ms in rows
    )


def unpack_ended(rows: bytes) -> Iterator[EndedTxn]:
    """The ended transactions packed in ``rows`` (as ``check_ended_rows`` accepts them)."""
    for most, least, committed, ledger_id, entry_id, deadline_ms in ENDED_ROW.iter_unpack(rows):
        yield EndedTxn(TxnID(most, least), committed == 1, Position(ledger_id, entry_id), deadline_ms)


def check_ended_rows(rows: bytes) -> str | None:
    """What is wrong with ``rows`` as ``ENDED_ROW`` rows (None: nothing), checked at C speed: whole
    rows, committed 0 or 1, no negative position or deadline."""
    if len(rows) % _ROW_SIZE:
        return f"{len(rows)} bytes are not whole {_ROW_SIZE}-byte rows"
    if not set(rows[_COMMITTED_AT::_ROW_SIZE]) <= {0, 1}:
        return "a committed flag is neither 0 nor 1"
    for at in _SIGN_BYTES_AT:
        if max(rows[at::_ROW_SIZE], default=0) >= 0x80:
            return "a marker position or deadline is negative"
    return None


class TransactionBuffer:
    """Outcome of every transaction that wrote to this partition (bounded memory of ended ones)."""

    __slots__ = ("_ended", "_ending", "_head", "_next_row", "_open", "_rows")

    def __init__(self) -> None:
        self._open: dict[TxnID, float] = {}  # -> when its first message here was written (epoch s)
        # txn -> (its latest row's number << 1) | committed; the row holds the rest
        self._ended: dict[TxnID, int] = {}
        self._ending: set[TxnID] = set()
        # ENDED_ROW rows in marker order; _rows[_head:] are the live ones, the first numbered
        # _next_row - (len(_rows) - _head) // _ROW_SIZE. A txn ended twice has two rows; only the
        # one its _ended value names counts.
        self._rows = bytearray()
        self._head = 0
        self._next_row = 0

    def outcome(self, txn_id: TxnID) -> TxnOutcome:
        ended = self._ended.get(txn_id)
        if ended is None:
            return TxnOutcome.OPEN
        return TxnOutcome.COMMITTED if ended & 1 else TxnOutcome.ABORTED

    def accepts_message(self, txn_id: TxnID) -> bool:
        """A transaction that ended (or is ending) here takes no more messages (zombie producers)."""
        return txn_id not in self._ended and txn_id not in self._ending

    def message_written(self, txn_id: TxnID, at: float | None = None) -> None:
        """A message of ``txn_id`` was written (``at``: when, in seconds since the epoch; now when
        not given). Only the first message of an open transaction counts."""
        opened = self._open
        if txn_id not in opened and txn_id not in self._ended:
            opened[txn_id] = time.time() if at is None else at

    def is_open(self, txn_id: TxnID) -> bool:
        return txn_id in self._open

    def is_ended(self, txn_id: TxnID) -> bool:
        return txn_id in self._ended

    def begin_end(self, txn_id: TxnID) -> None:
        self._ending.add(txn_id)

    def cancel_end(self, txn_id: TxnID) -> None:
        self._ending.discard(txn_id)

    def ended(self, txn_id: TxnID, committed: bool, marker: Position, deadline_ms: int = 0) -> None:
        self._ending.discard(txn_id)
        self._open.pop(txn_id, None)
        flag = 1 if committed else 0
        self._rows += ENDED_ROW.pack(
            txn_id.most, txn_id.least, flag, marker.ledger_id, marker.entry_id, deadline_ms
        )
        self._ended[txn_id] = self._next_row << 1 | flag
        self._next_row += 1

    def forget_before(self, position: Position) -> list[tuple[TxnID, int]]:
        """Forget outcomes whose marker is at or before ``position`` (the caller makes sure no reader
        can reach those entries any more: a transaction's messages all precede its marker); returns
        the forgotten transactions with their deadlines (the caller keeps refusing late messages of
        those whose deadline has not passed)."""
        forgotten: list[tuple[TxnID, int]] = []
        rows, ended = self._rows, self._ended
        head, end = self._head, len(rows)
        number = self._next_row - (end - head) // _ROW_SIZE
        limit = (position.ledger_id, position.entry_id)
        while head < end:
            most, least, _, ledger_id, entry_id, deadline_ms = ENDED_ROW.unpack_from(rows, head)
            if (ledger_id, entry_id) > limit:
                break
            txn_id = TxnID(most, least)
            if ended.get(txn_id, -1) >> 1 == number:  # not ended again since
                del ended[txn_id]
                forgotten.append((txn_id, deadline_ms))
            head += _ROW_SIZE
            number += 1
        if head >= _COMPACT_BYTES and head * 2 >= end:
            del rows[:head]
            head = 0
        self._head = head
        return forgotten

    def export(self) -> tuple[bytes, list[TxnID]]:
        """The ended transactions (``ENDED_ROW`` rows in marker order) and the open ones, for a
        snapshot: copies made without building anything per ended transaction."""
        return bytes(self._rows[self._head :]), list(self._open)

    def ended_ids(self) -> Iterable[TxnID]:
        """The ended transactions (a view: do not end or forget any while iterating)."""
        return self._ended.keys()

    def restore(self, ended: bytes, opened: Iterable[TxnID]) -> None:
        """Start from a snapshot's state (``ENDED_ROW`` rows, as ``check_ended_rows`` accepts them)
        before replaying the entries after it."""
        table, number = self._ended, self._next_row
        for most, least, committed, *_ in ENDED_ROW.iter_unpack(ended):
            txn_id = TxnID(most, least)
            self._open.pop(txn_id, None)
            self._ending.discard(txn_id)
            table[txn_id] = number << 1 | committed
            number += 1
        self._rows += ended
        self._next_row = number
        for txn_id in opened:
            self.message_written(txn_id)

    @property
    def ongoing(self) -> int:
        return len(self._open)

    def oldest_open_age_s(self, now: float | None = None) -> float:
        """Seconds since the first message of the oldest open transaction here (0: none open). After a
        restart, a transaction restored from a snapshot counts from the restart, one replayed from
        the ledger from its first message's publish time."""
        if not self._open:
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - min(self._open.values()))

    @property
    def ended_count(self) -> int:
        return len(self._ended)
