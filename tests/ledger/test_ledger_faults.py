"""Disk full and failed writes, injected at the file layer: failed appends fail loudly, acknowledged
entries stay intact and readable, and the ledger recovers (or, if it cannot cut, fails clearly)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from txnkeeper.ledger import LedgerWriteError, ManagedLedgerFactory, Position

from .conftest import FaultyIO


async def test_disk_full_fails_the_group_and_recovers_with_a_new_ledger(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    acked = [await ml.add_entry(b"ok%d" % i) for i in range(10)]
    io.disk_full = True
    io.partial_bytes = 30  # part of the group reaches the file before ENOSPC
    results = await asyncio.gather(
        *(ml.add_entry(b"lost%d" % i * 10) for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, LedgerWriteError) for r in results)
    assert "No space left on device" in str(results[0]) and "retry" in str(results[0])
    assert [e.data for e in await ml.read_entries(acked[0], 100)] == [b"ok%d" % i for i in range(10)]
    file = tmp_path / "log" / "ledgers" / f"{acked[0].ledger_id:020d}.ledger"
    assert file.stat().st_size == ml.internal_stats()["ledgers"][0]["size"] + 10 * 20 + 16  # partial cut

    # still full: the next append's rollover fails too, clearly, and loses nothing
    io.metadata_fails = True
    with pytest.raises(LedgerWriteError, match="rollover"):
        await ml.add_entry(b"still-full")
    io.disk_full = io.metadata_fails = False
    after = await ml.add_entry(b"after")
    assert after.ledger_id > acked[0].ledger_id and after.entry_id == 0
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert ml.torn_tails_cut == []
    data = [e.data for e in await ml.read_entries(Position(0, 0), 100)]
    assert data == [b"ok%d" % i for i in range(10)] + [b"after"]
    await factory.close()


async def test_failed_cut_puts_the_ledger_in_a_failed_state_until_reopened(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    acked = [await ml.add_entry(b"x" * 50) for _ in range(3)]
    io.disk_full = True
    io.partial_bytes = 35
    io.truncate_fails = True
    with pytest.raises(LedgerWriteError, match="cutting the partial write failed"):
        await ml.add_entry(b"y" * 50)
    assert ml.internal_stats()["state"] == "WriteFailed"
    io.disk_full = io.truncate_fails = False
    with pytest.raises(LedgerWriteError, match="close and reopen"):
        await ml.add_entry(b"z")
    assert await ml.read_entry(acked[2]) == b"x" * 50
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert len(ml.torn_tails_cut) == 1  # the partial record is cut on open
    assert [e.data for e in await ml.read_entries(acked[0], 10)] == [b"x" * 50] * 3
    assert (await ml.add_entry(b"w")).ledger_id > acked[0].ledger_id
    await factory.close()


async def test_cursor_write_failure_is_reported_and_retried(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    ps = [await ml.add_entry(b"x") for _ in range(3)]
    cursor = await ml.open_cursor("c")
    io.metadata_fails = True
    with pytest.raises(LedgerWriteError, match="could not persist cursor"):
        await cursor.mark_delete(ps[1])
    io.metadata_fails = False
    await cursor.mark_delete(ps[1])  # the retry writes the change that is still pending
    await factory.close()
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert (await ml.open_cursor("c")).mark_delete_position() == ps[1]
    await factory.close()


async def test_failed_ledger_creation_is_recovered_by_the_next_append(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    acked = await ml.add_entry(b"before")
    io.ledger_create_fails = True
    with pytest.raises(LedgerWriteError, match="could not create its file"):
        await ml.rollover()
    io.ledger_create_fails = False
    after = await ml.add_entry(b"after")
    assert after.ledger_id > acked.ledger_id + 1  # the half-created ledger is skipped, its id not reused
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert [e.data for e in await ml.read_entries(Position(0, 0), 10)] == [b"before", b"after"]
    await factory.close()
