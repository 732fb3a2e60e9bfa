"""Appends, reads, reopen continuity, names, stats shape and bad input of the managed ledger."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from txnkeeper.ledger import (
    LedgerClosedError,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
    NoSuchEntryError,
    Position,
)
from txnkeeper.ledger.names import MAX_COMPONENT, decode_name, encode_name, is_bounded_form


async def test_appends_get_ordered_positions_and_read_back(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    positions = await asyncio.gather(*(ml.add_entry(f"e{i}".encode()) for i in range(300)))
    ledger = ml.current_ledger_id()
    assert positions == [Position(ledger, i) for i in range(300)]
    entries = await ml.read_entries(Position(ledger, 10), 5)
    assert [(e.position.entry_id, e.data) for e in entries] == [(i, f"e{i}".encode()) for i in range(10, 15)]
    assert await ml.read_entry(Position(ledger, 299)) == b"e299"
    assert ml.last_confirmed_entry() == Position(ledger, 299)


async def test_reads_cross_ledgers_and_stop_at_the_end(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=3))
    positions = [await ml.add_entry(bytes([i])) for i in range(8)]
    assert len({p.ledger_id for p in positions}) == 3
    entries = await ml.read_entries(Position(0, 0), 100)
    assert [e.position for e in entries] == positions
    assert [e.data for e in entries] == [bytes([i]) for i in range(8)]
    tail = await ml.read_entries(positions[4], 2)
    assert [e.position for e in tail] == positions[4:6]
    assert await ml.read_entries(Position(positions[-1].ledger_id + 5, 0), 10) == []
    with pytest.raises(NoSuchEntryError, match="never written or was trimmed"):
        await ml.read_entry(Position(positions[-1].ledger_id, 99))
    with pytest.raises(ValueError, match="max_entries"):
        await ml.read_entries(Position(0, 0), 0)


async def test_reopen_keeps_entries_and_continues_with_a_new_ledger(tmp_path: Path) -> None:
    f1 = ManagedLedgerFactory(tmp_path)
    ml = await f1.open("persistent://tenant/ns/topic-0")
    first = [await ml.add_entry(b"a%d" % i) for i in range(5)]
    await f1.close()
    f2 = ManagedLedgerFactory(tmp_path)
    ml = await f2.open("persistent://tenant/ns/topic-0")
    assert ml.ledger_ids()[0] == first[0].ledger_id
    assert ml.current_ledger_id() > first[0].ledger_id  # ids continue, never reused
    later = await ml.add_entry(b"b")
    assert later > first[-1]
    entries = await ml.read_entries(first[0], 10)
    assert [e.data for e in entries] == [b"a%d" % i for i in range(5)] + [b"b"]
    assert f2.list_names() == ["persistent://tenant/ns/topic-0"]
    await f2.close()


async def test_empty_current_ledger_is_reused_on_reopen(tmp_path: Path) -> None:
    f1 = ManagedLedgerFactory(tmp_path)
    ml = await f1.open("log")
    ledger = ml.current_ledger_id()
    await f1.close()
    f2 = ManagedLedgerFactory(tmp_path)
    ml = await f2.open("log")
    assert ml.ledger_ids() == [ledger]
    assert ml.last_confirmed_entry() is None
    await f2.close()


async def test_open_returns_the_same_ledger_and_close_rejects_appends(factory: ManagedLedgerFactory) -> None:
    a, b = await asyncio.gather(factory.open("x"), factory.open("x"))
    assert a is b
    pending = [asyncio.ensure_future(a.add_entry(b"%d" % i)) for i in range(50)]
    await asyncio.sleep(0)  # let the appends queue before close starts
    await a.close()
    assert all(p.done() and p.exception() is None for p in pending)  # queued appends complete on close
    with pytest.raises(LedgerClosedError, match="reopen"):
        await a.add_entry(b"late")
    c = await factory.open("x")
    assert c is not a
    assert len(await c.read_entries(Position(0, 0), 100)) == 50


async def test_bad_input_is_refused_with_a_clear_error(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    with pytest.raises(TypeError, match="bytes"):
        await ml.add_entry("text")  # type: ignore[arg-type]
    assert await ml.add_entry(bytearray(b"copy")) == Position(ml.current_ledger_id(), 0)
    with pytest.raises(ValueError, match="non-empty"):
        await factory.open("")
    with pytest.raises(ValueError, match="max_entries_per_ledger"):
        ManagedLedgerConfig(max_entries_per_ledger=0)
    with pytest.raises(ValueError, match="max_ledger_age_seconds"):
        ManagedLedgerConfig(max_ledger_age_seconds=0)
    with pytest.raises(ValueError, match="ledgerId:entryId"):
        Position.parse("12")
    with pytest.raises(TypeError, match="Position"):
        await ml.read_entries((1, 0), 10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["persistent://t/ns/a", ".", "..", "a b/%c", "ünïcode", "__transaction_log_0"]
)
def test_names_round_trip_to_one_safe_path_component(name: str) -> None:
    encoded = encode_name(name)
    assert "/" not in encoded and encoded not in (".", "..")
    assert decode_name(encoded) == name


def test_names_that_fit_keep_their_plain_encoding() -> None:
    """Existing directories and cursor files keep their names: the bounded form is only for names
    whose plain encoding never fit (those were refused before)."""
    assert encode_name("persistent://t/ns/a") == "persistent%3A%2F%2Ft%2Fns%2Fa"
    fits = "persistent://t/ns/" + "a" * 212  # 28 + 212 = 240 bytes encoded: the longest plain name
    assert encode_name(fits) == "persistent%3A%2F%2Ft%2Fns%2F" + "a" * 212
    assert decode_name(encode_name(fits)) == fits and not is_bounded_form(encode_name(fits))


@pytest.mark.parametrize(
    "name",
    [
        "persistent://t/ns/" + "a" * 213,  # one byte over
        "\U0001f600" * 80,
        "x" * 174 + "/" * 30,  # the prefix would end inside a %XX triple
        "%" * 512,
        "a-b" * 170 + "__transaction_pending_ack",
    ],
)
def test_long_names_get_a_bounded_form_that_never_decodes_to_another_name(name: str) -> None:
    encoded = encode_name(name)
    assert len(encoded) <= MAX_COMPONENT and is_bounded_form(encoded) and "/" not in encoded
    assert decode_name(encoded) is None  # read from the file's content instead
    # is_bounded_form also says the readable prefix ends on a whole %XX triple
    assert encode_name(name + "x") != encoded and encode_name(name[:-1] + "y") != encoded


async def test_long_ledger_and_cursor_names_reopen_and_are_listed(tmp_path: Path) -> None:
    name = "persistent://t/ns/" + "\U0001f600" * 80
    other = "persistent://t/ns/" + "\U0001f600" * 79 + "x"  # same readable prefix, another ledger
    cursor_name = "\U0001f680" * 100
    f1 = ManagedLedgerFactory(tmp_path)
    ml = await f1.open(name)
    first = await ml.add_entry(b"a")
    await ml.add_entry(b"b")
    await (await ml.open_cursor(cursor_name)).mark_delete(first)
    await (await f1.open(other)).add_entry(b"c")
    await f1.close()
    f2 = ManagedLedgerFactory(tmp_path)
    assert f2.list_names() == sorted([name, other])
    ml = await f2.open(name)
    assert list(ml.cursors()) == [cursor_name]
    assert (await ml.open_cursor(cursor_name)).mark_delete_position() == first
    await f2.close()


async def test_internal_stats_have_the_pulsar_shape(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=2))
    for i in range(5):
        await ml.add_entry(b"x" * (i + 1))
    cursor = await ml.open_cursor("sub")
    await cursor.delete([Position(ml.ledger_ids()[1], 1)])
    stats = ml.internal_stats()
    assert stats["entriesAddedCounter"] == 5
    assert stats["numberOfEntries"] == 5
    assert stats["totalSize"] == 1 + 2 + 3 + 4 + 5
    assert stats["currentLedgerEntries"] == 1
    assert stats["currentLedgerSize"] == 5
    assert stats["lastConfirmedEntry"] == f"{ml.current_ledger_id()}:0"
    assert stats["state"] == "LedgerOpened"
    assert [led["entries"] for led in stats["ledgers"]] == [2, 2, 1]
    assert all(led["offloaded"] is False and led["underReplicated"] is False for led in stats["ledgers"])
    assert set(stats["ledgers"][0]) == {"ledgerId", "entries", "size", "offloaded", "underReplicated"}
    second = ml.ledger_ids()[1]
    assert stats["cursors"]["sub"]["markDeletePosition"] == f"{ml.ledger_ids()[0]}:-1"
    assert stats["cursors"]["sub"]["individuallyDeletedMessages"] == f"[({second}:0..{second}:1]]"
