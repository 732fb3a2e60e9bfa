"""add_entry_notify: an append settled by a callback in the step that confirms its write.

The buffered writer settles its batches so (a future's callbacks run a loop turn later, and at one
transaction in flight every turn is on the commit path). The callback must be called exactly once,
with the position or the write's error, and a failing callback must not stop the ledger.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from txnkeeper.ledger import LedgerClosedError, LedgerWriteError, ManagedLedgerFactory, Position

from .conftest import FaultyIO


async def test_notify_is_called_once_with_the_position_in_the_confirming_step(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    await ml.add_entry(b"create the ledger file")
    before = ml.add_entry(b"a")  # same group, resolved just before the notify in the same step
    future_callbacks_ran: list[bool] = []
    before.add_done_callback(lambda _: future_callbacks_ran.append(True))
    calls: list[tuple[Position | None, BaseException | None, bool, Position | None]] = []
    settled = asyncio.Event()

    def notify(position: Position | None, error: BaseException | None) -> None:
        calls.append((position, error, bool(future_callbacks_ran), ml.last_confirmed_entry()))
        settled.set()

    ml.add_entry_notify(b"b", notify)
    await asyncio.wait_for(settled.wait(), 30)
    await before
    (position, error, callbacks_ran_first, confirmed) = calls[0]
    assert error is None and position is not None and position.entry_id == 2
    assert confirmed == position, "notified only once the entry is confirmed"
    assert not callbacks_ran_first, "notified in the confirming step, before any future callback ran"
    assert await ml.read_entry(position) == b"b"
    await ml.close()
    assert len(calls) == 1
    await factory.close()


async def test_notify_reports_a_failed_write_and_nothing_of_it_is_served(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    acked = await ml.add_entry(b"ok")
    io.disk_full = True
    outcome: asyncio.Future[tuple[Position | None, BaseException | None]] = (
        asyncio.get_running_loop().create_future()
    )
    ml.add_entry_notify(b"lost", lambda p, e: outcome.set_result((p, e)))
    position, error = await asyncio.wait_for(outcome, 30)
    assert position is None and isinstance(error, LedgerWriteError)
    assert "No space left on device" in str(error)
    assert [e.data for e in await ml.read_entries(acked, 10)] == [b"ok"]
    await factory.close()


async def test_a_failing_callback_is_logged_and_the_ledger_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")

    def broken(position: Position | None, error: BaseException | None) -> None:
        raise RuntimeError("bug in the caller")

    with caplog.at_level(logging.ERROR, logger="txnkeeper.ledger.writer"):
        ml.add_entry_notify(b"first", broken)
        second = ml.add_entry(b"second")  # same group as the broken callback's entry
        third = await ml.add_entry(b"third")
        assert (await second).entry_id == 1 and third.entry_id == 2
    assert "settle callback failed" in caplog.text
    await factory.close()


async def test_notify_on_a_closed_ledger_is_refused_at_the_call(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    await ml.close()
    calls: list[object] = []
    with pytest.raises(LedgerClosedError, match="reopen"):
        ml.add_entry_notify(b"x", lambda p, e: calls.append((p, e)))
    assert calls == []
    await factory.close()
