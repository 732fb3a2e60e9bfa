"""What a single-key writer does with its unacknowledged blocks after a reconnect (PDP-44), as pure
logic so that every case is a table test.

Why a separate module: the decision is the whole exactly-once argument. A writer numbers its events
contiguously; each block (one committed transaction) covers ``[first, last]``. Blocks are applied by
the store atomically and in order, so the store's ``last_event_number`` for the writer id, read by
the ``SetupAppend`` of a new session, splits the writer's in-flight blocks into those already applied
(answered as committed, never re-sent) and those not (re-sent with their original numbers, which the
store de-duplicates anyway). Anything else means the store's record and the writer's disagree, and
guessing would either lose or duplicate a block: the writer raises instead.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from txnkeeper.client.errors import WriterFencedError, WriterStateLostError


@dataclass(frozen=True, slots=True)
class BlockNumbers:
    """The event numbers of one block: ``event_count`` events from ``first_event_number``."""

    first_event_number: int
    event_count: int

    def __post_init__(self) -> None:
        if self.first_event_number < 0 or self.event_count < 1:
            raise ValueError(f"a block numbers at least one event from 0, got {self}")

    @property
    def last_event_number(self) -> int:
        return self.first_event_number + self.event_count - 1


class Outcome(enum.Enum):
    APPLIED = "applied"  # the store holds it: the commit succeeded (never re-send)
    RESEND = "resend"  # the store does not hold it: send it again with the same numbers


def reconcile(
    writer_id: str,
    acknowledged_through: int,
    in_flight: Sequence[BlockNumbers],
    store_last: int,
    *,
    sent: int | None = None,
) -> list[Outcome]:
    """The outcome of each in-flight block (in order) given the store's ``store_last`` event number.

    Event numbers start at 0; ``-1`` means none (contracts §10). ``acknowledged_through`` is the last
    event number the store confirmed to this writer (-1: none);
    ``in_flight`` are the blocks sent or to be sent since, contiguous from ``acknowledged_through + 1``;
    ``sent`` how many of them, from the first, may have reached the store (default: all; the appender
    has one block on the wire at a time, so 1).
    Raises ``WriterStateLostError`` when the store knows less than it already confirmed (its state for
    the writer expired or was trimmed) or reports a number inside a block (blocks are atomic), and
    ``WriterFencedError`` when it holds more than this writer ever sent (another session used the id):
    taking another session's events beyond the blocks this one sent for its own would answer those
    blocks with the other session's message ids and drop their events.
    """
    expected = acknowledged_through + 1
    for block in in_flight:
        if block.first_event_number != expected:
            raise ValueError(
                f"writer {writer_id}: in-flight blocks must be contiguous from event {expected}, "
                f"got {block.first_event_number}"
            )
        expected = block.last_event_number + 1
    may_have_reached = in_flight[:sent] if sent is not None else in_flight
    sent_through = may_have_reached[-1].last_event_number if may_have_reached else acknowledged_through
    if store_last < acknowledged_through:
        raise WriterStateLostError(
            f"writer {writer_id}: the store knows its events only through {store_last} but had "
            f"confirmed them through {acknowledged_through}: its state for this writer expired or was "
            f"lost, so blocks after {acknowledged_through} are not re-sent (they could be applied "
            "twice); read the topic to see what it holds and continue with a new writer"
        )
    if store_last > sent_through:
        raise WriterFencedError(
            f"writer {writer_id}: the store holds events through {store_last} but this writer sent "
            f"only through {sent_through}: another session used the same writer id; stop one of them"
        )
    outcomes: list[Outcome] = []
    for block in in_flight:
        if block.last_event_number <= store_last:
            outcomes.append(Outcome.APPLIED)
        elif block.first_event_number > store_last:
            outcomes.append(Outcome.RESEND)
        else:
            raise WriterStateLostError(
                f"writer {writer_id}: the store reports event {store_last}, inside block "
                f"{block.first_event_number}..{block.last_event_number}, but blocks are applied whole: "
                "its writer state is inconsistent; read the topic and continue with a new writer"
            )
    return outcomes
