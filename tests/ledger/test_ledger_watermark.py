"""The acknowledged-entry watermark: a log shortened on a record boundary, or a lost ledger file, is
refused on open; the watermark never runs ahead of durable data; its own file is checked and versioned."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import threading
import zlib
from pathlib import Path

import pytest

from txnkeeper.ledger import (
    CorruptEntryError,
    CorruptMetadataError,
    FileIO,
    ManagedLedgerFactory,
    Position,
    recovery,
)
from txnkeeper.ledger.entry_format import RECORD_HEADER_SIZE
from txnkeeper.ledger.errors import LedgerWriteError
from txnkeeper.ledger.ledger_file import ledger_file_name
from txnkeeper.ledger.metadata import ManagedLedgerMetadata
from txnkeeper.ledger.watermark import (
    FILE_SIZE,
    SLOT_SIZE,
    WATERMARK_FILE,
    WatermarkState,
    decode_watermark,
    encode_slot,
    load_watermark,
)

from .conftest import FaultyIO, FileKindIO, wait_for
from .test_ledger_corruption import NAME, SIZES, ledger_path, record_offset, reopen_entries, write_ledgers


def watermark_path(root: Path) -> Path:
    return root / NAME / WATERMARK_FILE


def acknowledged(root: Path) -> Position | None:
    state = load_watermark(FileIO(), root / NAME)
    assert state is not None
    return state.confirmed


async def test_clean_close_records_the_last_entry(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, crashed=False)
    assert acknowledged(tmp_path) == positions[-1]


@pytest.mark.parametrize("keep", [0, 3], ids=["all entries", "two entries"])
async def test_open_ledger_shortened_on_a_record_boundary_is_refused(tmp_path: Path, keep: int) -> None:
    positions = await write_ledgers(tmp_path)  # the ledger is left open, as a crash leaves it
    path = ledger_path(tmp_path, positions[0].ledger_id)
    os.truncate(path, record_offset(keep))  # a whole-record cut: every remaining record is valid
    with pytest.raises(CorruptEntryError, match="the log was shortened") as info:
        await reopen_entries(tmp_path)
    err = info.value
    assert (err.ledger_id, err.entry_id, err.offset, err.path) == (1, keep, record_offset(keep), path)
    assert f"entry {len(SIZES) - 1} was acknowledged" in str(err)
    assert str(watermark_path(tmp_path)) in str(err), "names the watermark to delete to accept the loss"
    assert path.stat().st_size == record_offset(keep), "nothing was cut or rewritten"


async def test_missing_open_ledger_file_with_acknowledged_entries_is_refused(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)
    ledger_path(tmp_path, positions[0].ledger_id).unlink()
    with pytest.raises(CorruptEntryError, match=r"file missing; the watermark .* records entry 4"):
        await reopen_entries(tmp_path)


async def test_metadata_that_lost_the_acknowledged_ledger_is_refused(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, ledgers=2, crashed=False)
    meta_path = tmp_path / NAME / "meta.json"
    meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
    meta.ledgers = meta.ledgers[:1]  # an older copy of the metadata
    meta.ledgers[0].closed = False
    meta_path.write_bytes(meta.encode())
    with pytest.raises(CorruptMetadataError, match=f"records entry {positions[-1]} as acknowledged"):
        await reopen_entries(tmp_path)


async def test_torn_tail_after_the_watermark_is_still_cut(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)
    path = ledger_path(tmp_path, positions[0].ledger_id)
    with path.open("ab") as f:
        f.write(b"\x07" * 9)  # a record header cut short: entry 5, never acknowledged
    data, cut = await reopen_entries(tmp_path)
    assert len(data) == len(SIZES) and "incomplete record header" in cut[0]


async def test_deleting_the_watermark_accepts_a_shortened_log(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path)
    os.truncate(ledger_path(tmp_path, positions[0].ledger_id), record_offset(3))
    with pytest.raises(CorruptEntryError):
        await reopen_entries(tmp_path)
    watermark_path(tmp_path).unlink()  # the documented way to accept the loss
    data, _ = await reopen_entries(tmp_path)
    assert data == [bytes([i]) * s for i, s in enumerate(SIZES[:3])]
    assert acknowledged(tmp_path) is None, "rebuilt vouching for nothing it did not see written"


class SlowWatermarkIO(FileKindIO):
    """Holds every watermark fsync until released, to observe what the appends wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.held = 0

    def sync_data(self, fd: int) -> None:
        if fd in self.watermark_fds:
            self.held += 1
            self.release.wait(timeout=30)
        super().sync_data(fd)


async def test_appends_never_wait_for_the_watermark_and_it_trails_durable_data(tmp_path: Path) -> None:
    io = SlowWatermarkIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    try:
        ml = await factory.open(NAME)
        first = await ml.add_entry(b"a")
        await wait_for(lambda: io.held == 1, what="the watermark write for the first entry")
        # While that write hangs, appends keep being acknowledged.
        later = [await ml.add_entry(b"b%d" % i) for i in range(20)]
        assert later[-1] == Position(first.ledger_id, 20)
        assert io.held == 1, "one watermark write at a time (the next one carries the newest value)"
        io.release.set()
    finally:
        io.release.set()
        await factory.close()
    assert acknowledged(tmp_path) == later[-1], "close writes the final value"


async def test_a_torn_watermark_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    positions = await write_ledgers(tmp_path, crashed=False)
    raw = watermark_path(tmp_path).read_bytes()
    state = decode_watermark(raw, watermark_path(tmp_path))
    newest = (state.sequence % 2) * SLOT_SIZE
    damaged = bytearray(raw)
    damaged[newest + 20] ^= 0xFF  # the slot being written when the power went
    older = decode_watermark(bytes(damaged), watermark_path(tmp_path))
    assert older.sequence == state.sequence - 1 and older.confirmed is not None
    assert older.confirmed <= positions[-1]


def test_watermark_file_damage_and_unknown_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / WATERMARK_FILE
    good = encode_slot(3, Position(1, 4)) + encode_slot(2, Position(1, 2))
    assert decode_watermark(good, path).confirmed == Position(1, 4)
    with pytest.raises(CorruptMetadataError, match=f"{path}.*slot 0 at offset 0 fails its checksum"):
        decode_watermark(bytes(FILE_SIZE), path)
    with pytest.raises(CorruptMetadataError, match="is 100 bytes long"):
        decode_watermark(good[:100], path)
    body = struct.pack("<4sHHQqqqq16s", b"TKWM", 2, 0, 9, 1, 4, -1, -1, bytes(16))
    newer = body + struct.pack("<I", zlib.crc32(body)) + bytes(SLOT_SIZE - len(body) - 4)
    with pytest.raises(CorruptMetadataError, match="format version 2 kind 0; this build reads version 1"):
        decode_watermark(newer + good[SLOT_SIZE:], path)


async def test_concurrent_groups_keep_the_watermark_at_or_behind_durable_entries(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    positions = await asyncio.gather(*(ml.add_entry(b"x" * 30) for _ in range(300)))
    last = max(positions)
    seen = acknowledged(tmp_path)
    assert seen is None or seen <= last
    await factory.close()
    assert acknowledged(tmp_path) == last


async def _crash_copy_with_lagging_confirmation(tmp_path: Path) -> tuple[Path, list[Position], Position]:
    """Entries written while the confirmed value is held back; a copy of the directory as a SIGKILL leaves it.

    Returns the copy's root, the acknowledged positions and the confirmed value the copy's watermark holds.
    """
    io = SlowWatermarkIO()
    live = tmp_path / "live"
    factory = ManagedLedgerFactory(live, io=io)
    try:
        ml = await factory.open(NAME)
        first = await ml.add_entry(b"a" * 40)
        await wait_for(lambda: io.held == 1, what="the confirmed write for the first entry")
        later = [await ml.add_entry(b"b%d" % i * 10) for i in range(5)]
        crashed = tmp_path / "crashed"
        # The page cache as a killed process leaves it: every pwrite that returned is in the files.
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("LOCK"))
    finally:
        io.release.set()
        await factory.close()
    state = load_watermark(FileIO(), crashed / NAME)
    assert state is not None and state.written == later[-1]
    assert state.confirmed is None or state.confirmed < later[-1], "the confirmation lags (held)"
    return crashed, [first, *later], later[-1]


async def test_last_group_cut_after_a_process_crash_is_refused(tmp_path: Path) -> None:
    # Issue 11.1 / the soak: the confirmed value lags one group, so the written mark (a plain pwrite
    # between the group's data write and its fsync) is what protects the newest acknowledged group.
    crashed, _, last = await _crash_copy_with_lagging_confirmation(tmp_path)
    path = crashed / NAME / "ledgers" / ledger_file_name(last.ledger_id)
    data = path.read_bytes()
    os.truncate(path, len(data) - (RECORD_HEADER_SIZE + len(b"b4" * 10)))  # exactly the last record
    with pytest.raises(CorruptEntryError, match="the log was shortened") as info:
        await reopen_entries(crashed)
    assert info.value.entry_id == last.entry_id and info.value.path == path


async def test_written_mark_is_not_trusted_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a power loss (another boot id) only fsynced entries are vouched for: the page cache that
    # held the rest is gone, so a shorter last group is a torn tail, not corruption.
    crashed, positions, last = await _crash_copy_with_lagging_confirmation(tmp_path)
    path = crashed / NAME / "ledgers" / ledger_file_name(last.ledger_id)
    os.truncate(path, path.stat().st_size - (RECORD_HEADER_SIZE + len(b"b4" * 10)))
    monkeypatch.setattr(recovery, "current_boot_id", lambda: b"\x01" * 16)
    entries, _ = await reopen_entries(crashed)
    assert len(entries) == len(positions) - 1


def test_vouched_position_depends_on_the_boot() -> None:
    boot = b"\x07" * 16
    state = WatermarkState(5, Position(1, 3), Position(1, 9), boot)
    assert state.vouched(boot) == Position(1, 9)
    assert state.vouched(b"\x08" * 16) == Position(1, 3)
    assert state.entry_in(1, boot) == 9 and state.entry_in(2, boot) is None
    unknown = WatermarkState(5, Position(1, 3), Position(1, 9), bytes(16))
    assert unknown.vouched(bytes(16)) == Position(1, 3), "an unknown boot never vouches for written data"
    assert decode_watermark(encode_slot(5, Position(1, 3), Position(1, 9), boot) * 2, Path("w")) == state


async def test_a_failed_group_takes_its_written_mark_back(tmp_path: Path) -> None:
    io = FaultyIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    try:
        ml = await factory.open(NAME)
        kept = await ml.add_entry(b"kept")
        io.disk_full = True
        with pytest.raises(LedgerWriteError):
            await ml.add_entry(b"lost" * 100)
        io.disk_full = False
        state = load_watermark(FileIO(), tmp_path / NAME)
        assert state is not None and state.written == kept, "the failed group is not vouched for"
    finally:
        io.disk_full = False
        await factory.close()
    entries, _ = await reopen_entries(tmp_path)
    assert entries[0] == b"kept"
