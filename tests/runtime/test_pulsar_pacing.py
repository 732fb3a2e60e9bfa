"""BeginPacing's bookkeeping (server/pulsar_pacing.py), pure logic on an event loop: which begins are
held, and every way a held begin is let go (a registration lands, its transaction ends, the
connection closes, the hold times out), so that no begin can wait forever."""

from __future__ import annotations

import asyncio

import pytest

from txnkeeper.server.pulsar_pacing import BeginPacing
from txnkeeper.txnid import TxnID

A, B = 1, 2  # session ids of two connections


def _register(pacing: BeginPacing, session: int, txn: TxnID, count: int) -> list[tuple[str, str]]:
    items = [(f"persistent://t/ns/p-{i}", "") for i in range(count)]
    pacing.registered(session, txn, items)
    return items


async def test_a_connection_below_the_limit_is_never_held() -> None:
    pacing = BeginPacing(limit=3, max_hold_s=60)
    _register(pacing, A, TxnID(0, 1), 2)
    assert pacing.admit(A) is None
    assert pacing.begins_held == 0


async def test_a_held_begin_goes_when_one_registration_lands_and_others_are_never_held() -> None:
    pacing = BeginPacing(limit=3, max_hold_s=60)
    txn = TxnID(0, 1)
    items = _register(pacing, A, txn, 3)
    held = pacing.admit(A)
    assert held is not None and not held.done()
    assert pacing.admit(B) is None  # another connection's begins are not paced by A's backlog
    pacing.confirmed(txn, "persistent://t/ns/unknown", "")  # a registration nobody made: ignored
    pacing.confirmed(TxnID(0, 9), *items[0])  # the same topic of another transaction: ignored
    assert not held.done()
    pacing.confirmed(txn, *items[0])
    assert held.done()
    assert pacing.unconfirmed == 2 and pacing.begins_held == 1


async def test_a_registration_counts_once_however_often_it_is_made() -> None:
    pacing = BeginPacing(limit=2, max_hold_s=60)
    txn = TxnID(0, 1)
    for _ in range(5):
        pacing.registered(A, txn, [("persistent://t/ns/p", ""), ("persistent://t/ns/p", "sub")])
    assert pacing.unconfirmed == 2
    pacing.confirmed(txn, "persistent://t/ns/p", "sub")
    assert pacing.admit(A) is None


async def test_the_end_of_a_transaction_lets_its_connections_begins_go() -> None:
    pacing = BeginPacing(limit=2, max_hold_s=60)
    first, second = TxnID(0, 1), TxnID(0, 2)
    _register(pacing, A, first, 2)
    _register(pacing, A, second, 1)
    held = pacing.admit(A)
    assert held is not None
    pacing.ended(first)
    assert held.done()
    assert pacing.unconfirmed == 1
    pacing.ended(first)  # twice: nothing left to forget
    pacing.ended(second)
    assert pacing.unconfirmed == 0


async def test_a_closed_connection_releases_its_held_begins_and_forgets_its_registrations() -> None:
    pacing = BeginPacing(limit=1, max_hold_s=60)
    _register(pacing, A, TxnID(0, 1), 1)
    _register(pacing, B, TxnID(0, 2), 1)
    held = pacing.admit(A)
    assert held is not None
    pacing.session_closed(A)
    assert held.done()
    assert pacing.unconfirmed == 1  # B's stays
    assert pacing.admit(B) is not None


async def test_a_hold_ends_after_max_hold_even_if_nothing_lands() -> None:
    pacing = BeginPacing(limit=1, max_hold_s=0.05)
    _register(pacing, A, TxnID(0, 1), 1)
    held = pacing.admit(A)
    assert held is not None
    await asyncio.wait_for(held, timeout=30)  # the timer, not a landing, let it go
    assert pacing.unconfirmed == 1
    again = pacing.admit(A)
    assert again is not None
    assert pacing._held[A] == [again]  # the one the timer let go is not kept


async def test_the_oldest_registrations_are_forgotten_past_the_tracking_bound() -> None:
    pacing = BeginPacing(limit=2, max_hold_s=60, max_tracked=3)
    _register(pacing, A, TxnID(0, 1), 2)
    _register(pacing, B, TxnID(0, 2), 2)  # four tracked: A's oldest goes
    assert pacing.unconfirmed == 3
    assert pacing.admit(A) is None  # A has one left
    assert pacing.admit(B) is not None
    pacing.ended(TxnID(0, 1))
    assert pacing.unconfirmed == 2


async def test_registrations_that_never_land_stop_counting_once_stale() -> None:
    """E.g. the transaction's coordinator id moved to another pod: its stores confirm there."""
    now = [100.0]
    pacing = BeginPacing(limit=2, max_hold_s=60, stale_s=10, clock=lambda: now[0])
    _register(pacing, A, TxnID(0, 1), 1)
    now[0] = 105.0
    _register(pacing, A, TxnID(0, 2), 1)
    assert pacing.admit(A) is not None  # nothing stale yet
    now[0] = 110.5  # the first is past 10 s, the second not
    assert pacing.admit(A) is None
    assert pacing.unconfirmed == 1
    pacing.ended(TxnID(0, 1))  # its end later: nothing left to forget
    assert pacing.unconfirmed == 1


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        BeginPacing(limit=0)
