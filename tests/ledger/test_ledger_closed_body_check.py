"""A closed ledger's record bodies are checksummed when read, not at open (issue 12: CRC-ing every body
of every closed ledger was most of a large store's open). Its record headers still are, so a damaged
body is refused at the read naming file, ledger, entry and offset, and a damaged header or a short
file still at open; the ledger that was open for writing is still checked in full at open."""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkeeper.ledger import CorruptEntryError, ManagedLedgerFactory, Position
from txnkeeper.ledger.entry_format import RECORD_HEADER_SIZE

from .test_ledger_corruption import NAME, SIZES, flip_byte, ledger_path, record_offset, write_ledgers


async def test_a_damaged_body_of_a_closed_ledger_is_refused_when_read(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2, crashed=False)
    closed = positions[0].ledger_id
    path = ledger_path(tmp_path, closed)
    flip_byte(path, record_offset(2) + RECORD_HEADER_SIZE + 3)
    factory = ManagedLedgerFactory(tmp_path)
    try:
        ml = await factory.open(NAME)  # headers intact: the open does not read the bodies
        assert await ml.read_entry(Position(closed, 1)) == bytes([1]) * SIZES[1]
        with pytest.raises(CorruptEntryError, match="bad data checksum") as info:
            await ml.read_entry(Position(closed, 2))
        err = info.value
        assert (err.ledger_id, err.entry_id, err.offset, err.path) == (closed, 2, record_offset(2), path)
        with pytest.raises(CorruptEntryError):  # a range read over it is refused as a whole
            await ml.read_entries(Position(closed, 0), 5)
    finally:
        await factory.close()


async def test_a_damaged_record_header_of_a_closed_ledger_is_still_refused_at_open(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2, crashed=False)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    flip_byte(path, record_offset(3) + 1)
    factory = ManagedLedgerFactory(tmp_path)
    try:
        with pytest.raises(CorruptEntryError, match="header checksum") as info:
            await factory.open(NAME)
        assert info.value.path == path and info.value.entry_id == 3
    finally:
        await factory.close()


async def test_a_damaged_body_of_the_ledger_open_for_writing_is_refused_at_open(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2, crashed=True)
    path = ledger_path(tmp_path, positions[-1].ledger_id)
    flip_byte(path, record_offset(1) + RECORD_HEADER_SIZE)
    factory = ManagedLedgerFactory(tmp_path)
    try:
        with pytest.raises(CorruptEntryError, match="bad data checksum"):
            await factory.open(NAME)
    finally:
        await factory.close()
