"""The transaction buffer of one partition: which transactions' messages may be dispatched.

Rules (Pulsar's): a message of an open transaction is never dispatched, and neither is anything after
it in the partition until that transaction resolves (per-partition order); committed transactions'
messages are dispatched at their original positions; aborted ones never. Pure state, no I/O: the
partition feeds it what it writes and replays.

What it keeps, and why that is bounded (docs/contracts.md §6, "Kept outcomes"): the open transactions
(with their first durable message, the max read position and the trim bound); the aborted ones until
the ledger holding their marker is trimmed (their messages precede the marker, so they go first); the
committed ones only until their deadline plus the fence grace, as fences against a zombie's late
message. A transaction that wrote here and is neither open nor kept as aborted is committed: every
message puts its transaction in the open set before it is written, only a marker takes it out, and an
aborted outcome is kept as long as any of its messages can be read. So the memory is the open
transactions, the commits of the last timeout window, and the aborted transactions whose data the
topic still retains, never one row per transaction for ever.

Why the ended transactions are kept as packed rows (``ENDED_ROW``, 41 bytes each) rather than one
object per transaction: a snapshot copies every outcome kept; building and JSON-encoding a row per
transaction for each capture cost a store pod 6-8 % of its CPU at 256 transactions in flight, while
copying ``bytes`` costs a memcpy. The rows are also a third of the memory the objects took.

Open transactions are also kept with the wall-clock time of their first message here: the oldest
one's age is how long the topic's later messages have been held back (``oldest_open_age_s``, the
gauge an operator alerts on before aborting it; issue 25).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import NamedTuple

from txnkeeper.ledger.position import Position
from txnkeeper.topic.txnfence import FENCE_GRACE_MS, now_ms
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


# An open transaction whose first message's position is unknown, restored from a snapshot of a release
# that did not record it: somewhere before the snapshot's position, so it keeps every ledger.
UNKNOWN_FIRST = Position(0, -1)
# Committed rows are grouped by when they may be forgotten, in buckets of this many ms: expiry drops a
# whole bucket at a time (a committed outcome may be kept up to one bucket longer than needed).
_BUCKET_MS = 10_000


class TransactionBuffer:
    """Outcome of every transaction that wrote to this partition (bounded memory of ended ones)."""

    __slots__ = (
        "_aborted",
        "_buckets",
        "_clock",
        "_committed",
        "_ending",
        "_head",
        "_next_row",
        "_open",
        "_open_since",
        "_rows",
    )

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        # open txn -> its first durable message (None: its first write has not settled yet: that
        # message lands at the end of the ledger, so it bounds nothing)
        self._open: dict[TxnID, Position | None] = {}
        # open txn -> when its first message here was written (epoch s): the held-back age
        self._open_since: dict[TxnID, float] = {}
        self._ending: set[TxnID] = set()
        # aborted txn -> the number of its latest row; ENDED_ROW rows in marker order, _rows[_head:]
        # live, the first numbered _next_row - (len(_rows) - _head) // _ROW_SIZE. A txn ended twice
        # has two rows; only the one its _aborted value names counts.
        self._aborted: dict[TxnID, int] = {}
        self._rows = bytearray()
        self._head = 0
        self._next_row = 0
        # committed txn -> until when (ms) it is kept; its row sits in the bucket of that time
        self._committed: dict[TxnID, int] = {}
        self._buckets: dict[int, bytearray] = {}
        self._clock = clock

    def outcome(self, txn_id: TxnID) -> TxnOutcome:
        """OPEN while it may still write; ABORTED while kept; otherwise COMMITTED (a committed
        transaction whose outcome is no longer kept: see the module docstring)."""
        if txn_id in self._open:
            return TxnOutcome.OPEN
        if txn_id in self._aborted:
            return TxnOutcome.ABORTED
        return TxnOutcome.COMMITTED

    def accepts_message(self, txn_id: TxnID) -> bool:
        """A transaction that ended (or is ending) here takes no more messages (zombie producers)."""
        return txn_id not in self._committed and txn_id not in self._aborted and txn_id not in self._ending

    def message_written(self, txn_id: TxnID, at: float | None = None) -> None:
        """A message of ``txn_id`` is about to be written (before the write: it is never readable while
        its transaction is unknown here); ``at``: when, in seconds since the epoch (now when not
        given). Only the first message of an open transaction counts."""
        opened = self._open
        if txn_id not in opened and txn_id not in self._aborted and txn_id not in self._committed:
            opened[txn_id] = None
            self._open_since[txn_id] = time.time() if at is None else at

    def is_open(self, txn_id: TxnID) -> bool:
        return txn_id in self._open

    def message_durable(self, txn_id: TxnID, position: Position) -> None:
        """A message of open ``txn_id`` is durable at ``position`` (the first one bounds trimming)."""
        if txn_id in self._open and self._open[txn_id] is None:
            self._open[txn_id] = position

    def is_ended(self, txn_id: TxnID) -> bool:
        """Whether its outcome is kept (an end of it again is answered from that, not written)."""
        return txn_id in self._committed or txn_id in self._aborted

    def begin_end(self, txn_id: TxnID) -> None:
        self._ending.add(txn_id)

    def cancel_end(self, txn_id: TxnID) -> None:
        self._ending.discard(txn_id)

    def ended(self, txn_id: TxnID, committed: bool, marker: Position, deadline_ms: int = 0) -> None:
        self._ending.discard(txn_id)
        self._open.pop(txn_id, None)
        self._open_since.pop(txn_id, None)
        row = ENDED_ROW.pack(
            txn_id.most, txn_id.least, 1 if committed else 0, marker.ledger_id, marker.entry_id, deadline_ms
        )
        if committed:
            self._aborted.pop(txn_id, None)
            self._keep_committed(txn_id, deadline_ms, row)
            return
        self._committed.pop(txn_id, None)
        self._rows += row
        self._aborted[txn_id] = self._next_row
        self._next_row += 1

    def _keep_committed(self, txn_id: TxnID, deadline_ms: int, row: bytes) -> None:
        """Kept while a ticket of it may still be valid (a zombie's message must be refused, not
        taken for a new transaction's); not at all without a deadline (a store-local block's, or an
        end that did not say: nobody holds a ticket the partition could check it against)."""
        if not deadline_ms:
            return
        until = deadline_ms + FENCE_GRACE_MS
        if until <= self._clock():
            return
        self._committed[txn_id] = until
        bucket = self._buckets.get(until // _BUCKET_MS)
        if bucket is None:
            bucket = self._buckets[until // _BUCKET_MS] = bytearray()
        bucket += row

    def expire(self) -> int:
        """Forget the committed outcomes kept past their deadline plus the grace; how many."""
        now = self._clock()
        due = [key for key in self._buckets if (key + 1) * _BUCKET_MS <= now]
        forgotten = 0
        committed = self._committed
        for key in sorted(due):
            for most, least, _, _, _, deadline_ms in ENDED_ROW.iter_unpack(self._buckets.pop(key)):
                txn_id = TxnID(most, least)
                if committed.get(txn_id) == deadline_ms + FENCE_GRACE_MS:  # not ended again since
                    del committed[txn_id]
                    forgotten += 1
        return forgotten

    def forget_before(self, position: Position) -> list[tuple[TxnID, int]]:
        """Forget aborted outcomes whose marker is at or before ``position`` (the caller makes sure no
        reader can reach those entries any more: a transaction's messages all precede its marker);
        returns them with their deadlines (the caller keeps refusing late messages of those whose
        deadline has not passed). Committed outcomes are kept until ``expire`` drops them."""
        forgotten: list[tuple[TxnID, int]] = []
        rows, aborted = self._rows, self._aborted
        head, end = self._head, len(rows)
        number = self._next_row - (end - head) // _ROW_SIZE
        limit = (position.ledger_id, position.entry_id)
        while head < end:
            most, least, _, ledger_id, entry_id, deadline_ms = ENDED_ROW.unpack_from(rows, head)
            if (ledger_id, entry_id) > limit:
                break
            txn_id = TxnID(most, least)
            if aborted.get(txn_id, -1) == number:  # not ended again since
                del aborted[txn_id]
                forgotten.append((txn_id, deadline_ms))
            head += _ROW_SIZE
            number += 1
        if head >= _COMPACT_BYTES and head * 2 >= end:
            del rows[:head]
            head = 0
        self._head = head
        return forgotten

    def first_open_position(self) -> Position | None:
        """The first durable message of any open transaction (Pulsar's max read position is just
        before it): nothing from its ledger on may be trimmed, and no cursor is moved past it."""
        return min((p for p in self._open.values() if p is not None), default=None)

    def export(self) -> tuple[bytes, list[tuple[TxnID, Position | None]]]:
        """The kept outcomes (``ENDED_ROW`` rows: the committed ones, then the aborted ones in marker
        order) and the open transactions with their first positions, for a snapshot: copies made
        without building anything per ended transaction."""
        committed = b"".join(self._buckets[key] for key in sorted(self._buckets))
        return committed + bytes(self._rows[self._head :]), list(self._open.items())

    def restore(self, ended: bytes, opened: Iterable[tuple[TxnID, Position | None]]) -> None:
        """Start from a snapshot's state (``ENDED_ROW`` rows, as ``check_ended_rows`` accepts them;
        a later row of a transaction counts) before replaying the entries after it."""
        for most, least, committed, ledger_id, entry_id, deadline_ms in ENDED_ROW.iter_unpack(ended):
            txn_id = TxnID(most, least)
            self._ending.discard(txn_id)
            self.ended(txn_id, committed == 1, Position(ledger_id, entry_id), deadline_ms)
        restarted = time.time()  # a snapshot does not hold when they began: count from now
        for txn_id, first in opened:
            if txn_id not in self._aborted and txn_id not in self._committed:
                self._open[txn_id] = first
                self._open_since.setdefault(txn_id, restarted)

    def aborted_ids(self) -> list[TxnID]:
        """The aborted transactions whose outcomes are kept (every one whose messages can be read)."""
        return list(self._aborted)

    def open_ids(self) -> list[TxnID]:
        """The transactions still open here (their messages are not readable yet)."""
        return list(self._open)

    def ended_ids(self) -> list[TxnID]:
        """The ended transactions whose outcomes are kept."""
        return [*self._aborted, *self._committed]

    @property
    def ongoing(self) -> int:
        return len(self._open)

    def oldest_open_age_s(self, now: float | None = None) -> float:
        """Seconds since the first message of the oldest open transaction here (0: none open). After a
        restart, a transaction restored from a snapshot counts from the restart, one replayed from
        the ledger from its first message's publish time."""
        if not self._open_since:
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - min(self._open_since.values()))

    @property
    def ended_count(self) -> int:
        """Outcomes kept (the gauge txnkeeper_topic_kept_txn_outcomes)."""
        return len(self._aborted) + len(self._committed)
