"""Trimming: a ledger is deleted exactly when every cursor is past its last entry, never the current one."""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, NoSuchEntryError, Position
from txnkeeper.ledger.ledger_file import ledger_file_name

from .conftest import FaultyIO


def ledger_files(root: Path) -> set[str]:
    return {p.name for p in root.glob("*/ledgers/*.ledger")}


async def test_ledger_deleted_exactly_when_every_cursor_is_past(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=3))
    ps = [await ml.add_entry(b"%d" % i) for i in range(7)]
    first, second = ps[0].ledger_id, ps[3].ledger_id
    fast = await ml.open_cursor("fast")
    slow = await ml.open_cursor("slow")
    await fast.mark_delete(ps[5])
    await slow.mark_delete(ps[1])
    assert await ml.trim() == []  # slow still needs ps[2]
    await slow.delete([ps[2]])
    assert slow.mark_delete_position() == ps[2]  # at the last entry of the first ledger
    assert await ml.trim() == [first]
    assert ml.ledger_ids() == [second, ps[6].ledger_id]
    assert ledger_file_name(first) not in ledger_files(tmp_path)
    with pytest.raises(NoSuchEntryError):
        await ml.read_entry(ps[0])
    assert [e.position for e in await ml.read_entries(ps[0], 10)] == ps[3:]
    await slow.mark_delete(ps[4])
    assert await ml.trim() == []  # second ledger's last entry ps[5] not yet passed by slow
    await slow.mark_delete(ps[5])
    assert await ml.trim() == [second]
    stats = ml.internal_stats()
    assert [led["ledgerId"] for led in stats["ledgers"]] == [ps[6].ledger_id]
    assert stats["numberOfEntries"] == 1
    await factory.close()


async def test_current_ledger_is_never_trimmed(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    ps = [await ml.add_entry(b"x") for _ in range(3)]
    cursor = await ml.open_cursor("c")
    await cursor.mark_delete(ps[-1])
    assert await ml.trim() == []
    assert ml.ledger_ids() == [ps[0].ledger_id]
    new = await ml.rollover()
    assert await ml.trim() == [ps[0].ledger_id]  # closed now, and wholly behind the cursor
    assert ml.ledger_ids() == [new]


async def test_without_cursors_nothing_is_trimmed(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    await ml.add_entry(b"x")
    await ml.rollover()
    assert await ml.trim() == []
    assert len(ml.ledger_ids()) == 2


async def test_empty_ledgers_are_trimmed_once_cursors_pass_them(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    cursor = await ml.open_cursor("c")
    empty_a = ml.current_ledger_id()
    empty_b = await ml.rollover()
    full = await ml.rollover()
    p = await ml.add_entry(b"x")
    await ml.rollover()
    assert await ml.trim() == [empty_a, empty_b]  # nothing in them; the cursor still needs p
    await cursor.delete([p])
    assert await ml.trim() == [full]


async def test_trim_interrupted_before_unlink_is_finished_on_open(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    p = await ml.add_entry(b"x")
    await ml.rollover()
    cursor = await ml.open_cursor("c")
    await cursor.mark_delete(p)
    io.unlink_fails = True
    assert await ml.trim() == [p.ledger_id]  # metadata says trimmed; the file stayed behind
    assert ledger_file_name(p.ledger_id) in ledger_files(tmp_path)
    await factory.close()
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert ledger_file_name(p.ledger_id) not in ledger_files(tmp_path)
    assert p.ledger_id not in ml.ledger_ids()
    await factory.close()


async def test_trimmed_ledger_ids_are_not_reused(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    cursor = await ml.open_cursor("c")
    p = await ml.add_entry(b"x")
    new = await ml.rollover()
    await cursor.mark_delete(p)
    assert await ml.trim() == [p.ledger_id]
    assert await ml.rollover() > new
    assert ml.ledger_ids() == sorted(ml.ledger_ids())
    assert min(ml.ledger_ids()) > p.ledger_id
    assert Position(p.ledger_id, 0) < await ml.add_entry(b"y")
