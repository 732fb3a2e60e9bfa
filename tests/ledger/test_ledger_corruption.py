"""Torn tails are cut on open; corruption anywhere else is a clear error naming ledger, entry, offset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txnkeeper.ledger import (
    CorruptEntryError,
    CorruptMetadataError,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
    Position,
)
from txnkeeper.ledger.entry_format import FILE_HEADER, RECORD_HEADER_SIZE, record_header
from txnkeeper.ledger.ledger_file import ledger_file_name
from txnkeeper.ledger.metadata import ManagedLedgerMetadata

NAME = "log"
SIZES = [10, 20, 30, 40, 50]


async def write_ledgers(root: Path, ledgers: int = 1, *, crashed: bool = True) -> list[Position]:
    """Write ``ledgers`` ledgers of SIZES entries each and close.

    ``crashed``: then mark the last ledger open again in the metadata, the state a crash leaves.
    """
    factory = ManagedLedgerFactory(root)
    ml = await factory.open(NAME)
    positions = []
    for n in range(ledgers):
        if n:
            await ml.rollover()
        positions += [await ml.add_entry(bytes([i]) * size) for i, size in enumerate(SIZES)]
    await factory.close()
    if crashed:
        meta_path = root / NAME / "meta.json"
        meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
        assert meta.ledgers[-1].closed is True  # a clean close records it closed
        meta.ledgers[-1].closed = False
        meta_path.write_bytes(meta.encode())
    return positions


def ledger_path(root: Path, ledger_id: int) -> Path:
    return root / NAME / "ledgers" / ledger_file_name(ledger_id)


def record_offset(index: int) -> int:
    return FILE_HEADER.size + sum(RECORD_HEADER_SIZE + s for s in SIZES[:index])


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


async def reopen_entries(root: Path) -> tuple[list[bytes], list[str]]:
    factory = ManagedLedgerFactory(root)
    try:
        ml = await factory.open(NAME)
        entries = await ml.read_entries(Position(0, 0), 100)
        return [e.data for e in entries], ml.torn_tails_cut
    finally:
        await factory.close()


TORN_TAILS = {
    "incomplete header": record_header(5, b"y" * 60)[:11],
    "body cut short": record_header(5, b"y" * 60) + b"y" * 25,
    "zero-filled tail": bytes(4096),
}


@pytest.mark.parametrize("tail", list(TORN_TAILS), ids=list(TORN_TAILS))
async def test_torn_tail_of_the_open_ledger_is_cut(tmp_path: Path, tail: str) -> None:
    positions = await write_ledgers(tmp_path)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    intact = path.stat().st_size
    with path.open("ab") as f:
        f.write(TORN_TAILS[tail])
    data, cut = await reopen_entries(tmp_path)
    assert data == [bytes([i]) * s for i, s in enumerate(SIZES)]
    assert len(cut) == 1 and f"ledger {positions[0].ledger_id}" in cut[0]
    assert path.stat().st_size == intact  # cut back to the last whole record


async def test_bad_checksum_on_a_complete_last_record_is_corruption(tmp_path: Path) -> None:
    # Issue 11.1: cutting it would drop an acknowledged entry (a pending-ack log would redeliver).
    positions = await write_ledgers(tmp_path)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    before = path.read_bytes()
    flip_byte(path, record_offset(4) + RECORD_HEADER_SIZE + 3)
    with pytest.raises(CorruptEntryError, match="bad data checksum on a complete record") as info:
        await reopen_entries(tmp_path)
    err = info.value
    assert (err.ledger_id, err.entry_id, err.offset, err.path) == (1, 4, record_offset(4), path)
    assert f"truncate -s {record_offset(4)} {path}" in str(err), "says how to accept the loss"
    assert len(path.read_bytes()) == len(before), "nothing was cut"


async def test_after_a_clean_close_a_damaged_tail_is_corruption(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, crashed=False)
    flip_byte(ledger_path(tmp_path, positions[0].ledger_id), record_offset(4) + RECORD_HEADER_SIZE + 3)
    with pytest.raises(CorruptEntryError, match="entry 4 in ledger"):
        await reopen_entries(tmp_path)


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        (RECORD_HEADER_SIZE + 5, "bad data checksum"),
        (1, "bad record header checksum"),
        (5, "header checksum"),
    ],
    ids=["data byte", "length byte", "entry id byte"],
)
async def test_corruption_before_the_tail_is_an_error(tmp_path: Path, where: int, reason: str) -> None:
    positions = await write_ledgers(tmp_path)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    flip_byte(path, record_offset(2) + where)
    with pytest.raises(CorruptEntryError, match=reason) as info:
        await reopen_entries(tmp_path)
    err = info.value
    assert (err.ledger_id, err.entry_id, err.offset, err.path) == (
        positions[0].ledger_id,
        2,
        record_offset(2),
        path,
    )
    assert f"ledger {positions[0].ledger_id}" in str(err) and f"offset {record_offset(2)}" in str(err)
    assert str(path) in str(err)


async def test_closed_ledger_is_checked_strictly(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2)
    closed = ledger_path(tmp_path, positions[0].ledger_id)
    os.truncate(closed, record_offset(4) + 7)  # a "torn tail" in a closed ledger is data loss
    with pytest.raises(CorruptEntryError, match=f"ledger {positions[0].ledger_id}"):
        await reopen_entries(tmp_path)


async def test_missing_closed_ledger_file_is_an_error(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2)
    ledger_path(tmp_path, positions[0].ledger_id).unlink()
    with pytest.raises(CorruptEntryError, match="file missing"):
        await reopen_entries(tmp_path)


async def test_corruption_after_open_is_caught_on_read(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME, ManagedLedgerConfig())
    ps = [await ml.add_entry(bytes([i]) * s) for i, s in enumerate(SIZES)]
    flip_byte(ledger_path(tmp_path, ps[0].ledger_id), record_offset(1) + RECORD_HEADER_SIZE)
    with pytest.raises(CorruptEntryError, match="entry 1 in ledger"):
        await ml.read_entry(ps[1])
    with pytest.raises(CorruptEntryError):
        await ml.read_entries(ps[0], 5)
    assert await ml.read_entry(ps[2]) == b"\x02" * 30
    await factory.close()


async def test_bad_file_header_is_an_error(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2)
    flip_byte(ledger_path(tmp_path, positions[0].ledger_id), 0)
    with pytest.raises(CorruptEntryError, match="bad magic"):
        await reopen_entries(tmp_path)


async def test_unreadable_metadata_is_a_clear_error(tmp_path: Path) -> None:
    await write_ledgers(tmp_path)
    meta = tmp_path / NAME / "meta.json"
    meta.write_bytes(meta.read_bytes()[:40])
    with pytest.raises(CorruptMetadataError, match=r"meta\.json"):
        await reopen_entries(tmp_path)


async def test_ledger_file_unknown_to_the_metadata_is_an_error(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)
    stray = ledger_path(tmp_path, positions[0].ledger_id + 100)
    stray.write_bytes(b"")
    with pytest.raises(CorruptMetadataError, match="older copy"):
        await reopen_entries(tmp_path)
    assert stray.exists()  # never deleted: it could hold acknowledged data


async def test_corrupt_cursor_file_is_a_clear_error(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    await ml.open_cursor("sub")
    await factory.close()
    (tmp_path / NAME / "cursors" / "sub.json").write_text('{"version": 1, "name": "sub"}')
    with pytest.raises(CorruptMetadataError, match=r"sub\.json"):
        await reopen_entries(tmp_path)


async def test_crash_while_creating_a_ledger_file_is_repaired(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    ledger_id = ml.current_ledger_id()
    await factory.close()  # the empty ledger stays the open one
    os.truncate(ledger_path(tmp_path, ledger_id), 7)  # its header was cut short by a crash
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    assert ml.current_ledger_id() == ledger_id
    assert "incomplete file header" in ml.torn_tails_cut[0]
    assert await ml.add_entry(b"x") == Position(ledger_id, 0)
    await factory.close()


def zero_from_next_page(path: Path, after: int) -> None:
    """Zero the file from the first 4 KiB boundary after ``after`` to its end (pages a power loss lost)."""
    size = path.stat().st_size
    boundary = (after // 4096 + 1) * 4096
    assert boundary < size
    with path.open("r+b") as f:
        f.seek(boundary)
        f.write(bytes(size - boundary))


async def test_zero_filled_pages_after_the_last_acknowledged_entry_are_a_torn_tail(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)  # entries 0-4 acknowledged (the watermark says so)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    intact = path.stat().st_size
    body = b"z" * 6000
    with path.open("ab") as f:
        f.write(record_header(5, body) + body)  # entry 5: written, never acknowledged
    zero_from_next_page(path, intact + RECORD_HEADER_SIZE)
    data, cut = await reopen_entries(tmp_path)
    assert data == [bytes([i]) * s for i, s in enumerate(SIZES)]
    assert "zero-filled from a page boundary" in cut[0]
    assert path.stat().st_size == intact


async def test_zero_filled_pages_in_an_acknowledged_entry_are_corruption(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    small = await ml.add_entry(b"a" * 10)
    big = await ml.add_entry(b"z" * 6000)
    await factory.close()  # the watermark now vouches for ``big``
    meta_path = tmp_path / NAME / "meta.json"
    meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
    meta.ledgers[-1].closed = False  # as a crash leaves it: only the watermark protects ``big``
    meta_path.write_bytes(meta.encode())
    path = ledger_path(tmp_path, big.ledger_id)
    big_offset = FILE_HEADER.size + RECORD_HEADER_SIZE + 10
    zero_from_next_page(path, big_offset + RECORD_HEADER_SIZE)
    with pytest.raises(CorruptEntryError, match="but entry 1 was acknowledged") as info:
        await reopen_entries(tmp_path)
    assert (info.value.entry_id, info.value.offset) == (big.entry_id, big_offset)
    assert small.entry_id == 0


async def test_ledger_file_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    raw = bytearray(path.read_bytes())
    raw[4:6] = (2).to_bytes(2, "little")  # a format a newer txnkeeper might write
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptEntryError, match="unknown ledger file version 2 \\(this build reads 1\\)"):
        await reopen_entries(tmp_path)
    assert path.read_bytes() == bytes(raw), "not cut or rewritten"
