"""The reconnect decision of a single-key writer (PDP-44), case by case."""

from __future__ import annotations

import pytest

from txnkeeper.client.appendstate import BlockNumbers, Outcome, reconcile
from txnkeeper.client.errors import WriterFencedError, WriterStateLostError

A, R = Outcome.APPLIED, Outcome.RESEND
# Three in-flight blocks after events 1..10 were confirmed: 11..14, 15..15, 16..20.
BLOCKS = [BlockNumbers(11, 4), BlockNumbers(15, 1), BlockNumbers(16, 5)]


@pytest.mark.parametrize(
    ("store_last", "outcomes"),
    [
        (10, [R, R, R]),  # nothing of them reached the store
        (14, [A, R, R]),  # the first was applied, its receipt lost
        (15, [A, A, R]),
        (20, [A, A, A]),  # all applied: nothing is re-sent
    ],
)
def test_applied_blocks_are_never_resent(store_last: int, outcomes: list[Outcome]) -> None:
    assert reconcile("w", 10, BLOCKS, store_last) == outcomes


def test_a_fresh_writer_resends_what_the_store_does_not_hold() -> None:
    # Event numbers start at 0; -1 is "none" on both sides.
    assert reconcile("w", -1, [BlockNumbers(0, 4)], -1) == [R]
    assert reconcile("w", -1, [BlockNumbers(0, 4)], 3) == [A]
    assert reconcile("w", 7, [], 7) == []


@pytest.mark.parametrize("store_last", [-1, 0, 9])
def test_a_store_that_forgot_confirmed_events_is_writer_state_lost(store_last: int) -> None:
    with pytest.raises(WriterStateLostError, match=r"writer w: the store knows its events only through"):
        reconcile("w", 10, BLOCKS, store_last)


@pytest.mark.parametrize("store_last", [12, 13, 17, 19])
def test_a_number_inside_a_block_is_refused(store_last: int) -> None:
    with pytest.raises(WriterStateLostError, match="blocks are applied whole"):
        reconcile("w", 10, BLOCKS, store_last)


def test_more_than_was_sent_means_another_session_used_the_id() -> None:
    with pytest.raises(WriterFencedError, match="another session used the same writer id"):
        reconcile("w", 10, BLOCKS, 21)


def test_in_flight_blocks_must_follow_the_confirmed_events() -> None:
    with pytest.raises(ValueError, match="contiguous from event 11"):
        reconcile("w", 10, [BlockNumbers(12, 1)], 10)
    with pytest.raises(ValueError, match="at least one event"):
        BlockNumbers(1, 0)
    with pytest.raises(ValueError, match="from 0"):
        BlockNumbers(-1, 1)


@pytest.mark.parametrize(("store_last", "outcomes"), [(10, [R, R, R]), (14, [A, R, R])])
def test_with_one_block_on_the_wire_only_it_can_have_been_applied(
    store_last: int, outcomes: list[Outcome]
) -> None:
    assert reconcile("w", 10, BLOCKS, store_last, sent=1) == outcomes


@pytest.mark.parametrize("store_last", [15, 20, 21])
def test_with_one_block_on_the_wire_a_store_beyond_it_means_another_session_used_the_id(
    store_last: int,
) -> None:
    # The store's events beyond the head are another session's: taken as this writer's blocks, they
    # would be answered with that session's message ids (the appender has one block on the wire).
    with pytest.raises(WriterFencedError, match="sent only through 14: another session used"):
        reconcile("w", 10, BLOCKS, store_last, sent=1)
