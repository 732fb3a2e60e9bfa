"""The managed ledger's metadata and cursor files: checksummed, range-checked on open, legacy-readable.

Every refusal is a CorruptMetadataError naming the file (and, for range checks, the position), and a
refused open changes nothing on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper import statefile
from txnkeeper.ledger import (
    CorruptEntryError,
    CorruptMetadataError,
    ManagedLedgerFactory,
    MissingCursorError,
    Position,
)
from txnkeeper.ledger.cursor import CursorState
from txnkeeper.ledger.ledger_file import ledger_file_name
from txnkeeper.ledger.metadata import ManagedLedgerMetadata
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.rangeset import EntryRangeSet
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.txnlog import CURSOR_NAME, TransactionLogStore, TxnID

NAME = "log"
MASKS = (0x01, 0x10, 0x40, 0x80)  # low, middle and high bits of every byte


def meta_path(root: Path, name: str = NAME) -> Path:
    return root / encode_name(name) / "meta.json"


def cursor_path(root: Path, cursor: str = "sub", name: str = NAME) -> Path:
    return root / encode_name(name) / "cursors" / f"{encode_name(cursor, 'cursor')}.json"


async def make_ledger(root: Path, entries: int = 4) -> list[Position]:
    """A closed managed ledger with two ledgers, ``entries`` each, and a cursor "sub" with some deletes."""
    factory = ManagedLedgerFactory(root)
    try:
        ml = await factory.open(NAME)
        positions = [await ml.add_entry(b"a%d" % i) for i in range(entries)]
        await ml.rollover()
        positions += [await ml.add_entry(b"b%d" % i) for i in range(entries)]
        cursor = await ml.open_cursor("sub")
        await cursor.mark_delete(positions[0])
        await cursor.delete([positions[2], positions[entries + 1]])
        await cursor.delete_batch_indexes(positions[entries + 2], 70, [3, 65])
    finally:
        await factory.close()
    return positions


async def reopen(root: Path) -> None:
    factory = ManagedLedgerFactory(root)
    try:
        await factory.open(NAME)
    finally:
        await factory.close()


def cursor_view(state: CursorState) -> tuple[Position, list[tuple[int, list[tuple[int, int]]]], object]:
    individual = [(lid, list(ranges.ranges())) for lid, ranges in sorted(state.individual.items())]
    return state.mark_delete, individual, sorted(state.ack_masks.items())


def forge_cursor(path: Path, state: CursorState, name: str = "sub") -> None:
    """Write a well-formed, correctly checksummed cursor file holding ``state`` (what a bug could write)."""
    path.write_bytes(state.encode(name))


# --- checksums: a flipped bit is refused, never a different value ------------------------------------


async def test_every_flipped_bit_of_the_metadata_file_is_refused(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    path = meta_path(tmp_path)
    good = path.read_bytes()
    original = ManagedLedgerMetadata.decode(good, path)
    assert good.startswith(b"txnkeeper-state managed-ledger-metadata 1 ")
    accepted_same = 0
    for offset in range(len(good)):
        for mask in MASKS:
            damaged = bytearray(good)
            damaged[offset] ^= mask
            try:
                decoded = ManagedLedgerMetadata.decode(bytes(damaged), path)
            except CorruptMetadataError as exc:
                assert str(path) in str(exc)
                continue
            assert decoded == original, f"flip 0x{mask:02x} at {offset} gave a different accepted value"
            accepted_same += 1
    assert accepted_same == 0  # the checksum covers every byte of this format


async def test_every_flipped_bit_of_a_cursor_file_is_refused(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    path = cursor_path(tmp_path)
    good = path.read_bytes()
    _, original = CursorState.decode(good, path, "sub")
    assert original.individual and original.ack_masks  # the file exercises every field
    for offset in range(len(good)):
        for mask in MASKS:
            damaged = bytearray(good)
            damaged[offset] ^= mask
            try:
                _, decoded = CursorState.decode(bytes(damaged), path, "sub")
            except CorruptMetadataError as exc:
                assert str(path) in str(exc)
                continue
            assert cursor_view(decoded) == cursor_view(original), f"flip 0x{mask:02x} at {offset}"
            pytest.fail(f"flip 0x{mask:02x} at offset {offset} was accepted")


async def test_a_damaged_cursor_file_stops_the_open_and_is_left_as_it_was(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    path = cursor_path(tmp_path)
    damaged = bytearray(path.read_bytes())
    damaged[-5] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptMetadataError, match="checksum mismatch") as info:
        await reopen(tmp_path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == bytes(damaged)


async def test_a_known_cursor_without_its_file_is_refused_until_the_reset_is_accepted(tmp_path: Path) -> None:
    """``reopen_cursor`` never creates a cursor afresh in silence: that would read every deleted
    entry as not deleted. The acceptance file is the operator's consent, taken once."""
    positions = await make_ledger(tmp_path)
    path = cursor_path(tmp_path)
    acceptance = path.with_name(f"{encode_name('sub', 'cursor')}.accept-reset")
    path.unlink()
    factory = ManagedLedgerFactory(tmp_path)
    try:
        ml = await factory.open(NAME)
        with pytest.raises(MissingCursorError, match="it is missing, but the test's cursor exists") as info:
            await ml.reopen_cursor("sub", owner="the test's cursor")
        assert str(path) in str(info.value) and f"touch '{acceptance}'" in str(info.value)
        assert not path.exists() and "sub" not in ml.cursors()
        acceptance.touch()
        cursor = await ml.reopen_cursor("sub", owner="the test's cursor")
        assert cursor.mark_delete_position() == Position(positions[0].ledger_id, -1)
        assert path.is_file() and not acceptance.exists()
        acceptance.touch()  # left over once the cursor exists: removed, never kept for a later loss
        assert await ml.reopen_cursor("sub", owner="the test's cursor") is cursor
        assert not acceptance.exists()
    finally:
        await factory.close()


# --- range checks on open --------------------------------------------------------------------------


async def test_mark_delete_past_the_end_of_the_log_is_refused_not_adopted(tmp_path: Path) -> None:
    positions = await make_ledger(tmp_path)
    last = positions[-1]
    path = cursor_path(tmp_path)
    past = Position(last.ledger_id, last.entry_id + 1)
    forge_cursor(path, CursorState(past))
    with pytest.raises(CorruptMetadataError, match=rf"markDelete {past} is past the last entry") as info:
        await reopen(tmp_path)
    message = str(info.value)
    assert str(path) in message and f"last confirmed entry {last}" in message
    # the exact last entry is a valid mark-delete position
    forge_cursor(path, CursorState(last))
    await reopen(tmp_path)


async def test_mark_delete_in_a_ledger_that_does_not_exist_yet_is_refused(tmp_path: Path) -> None:
    positions = await make_ledger(tmp_path)
    future = Position(positions[-1].ledger_id + 5, 0)
    forge_cursor(cursor_path(tmp_path), CursorState(future))
    with pytest.raises(CorruptMetadataError, match=rf"markDelete {future} is in a ledger"):
        await reopen(tmp_path)


async def test_individual_deletes_and_ack_sets_of_missing_entries_are_refused(tmp_path: Path) -> None:
    positions = await make_ledger(tmp_path)
    first, last = positions[0], positions[-1]
    path = cursor_path(tmp_path)

    beyond = CursorState(first)
    beyond.individual[last.ledger_id] = EntryRangeSet()
    beyond.individual[last.ledger_id].add_range(last.entry_id, last.entry_id + 3)
    forge_cursor(path, beyond)
    with pytest.raises(CorruptMetadataError, match=r"individually deleted range .* does not exist"):
        await reopen(tmp_path)

    unknown_ledger = CursorState(first)
    unknown_ledger.individual[last.ledger_id + 9] = EntryRangeSet()
    unknown_ledger.individual[last.ledger_id + 9].add(0)
    forge_cursor(path, unknown_ledger)
    with pytest.raises(CorruptMetadataError, match=rf"{last.ledger_id + 9}:0\.\.{last.ledger_id + 9}:0"):
        await reopen(tmp_path)

    ack_beyond = CursorState(first)
    ack_beyond.ack_masks[Position(last.ledger_id, last.entry_id + 1)] = 0b101
    forge_cursor(path, ack_beyond)
    with pytest.raises(CorruptMetadataError, match=r"batch ack set at .* names an entry that does not"):
        await reopen(tmp_path)

    empty_ack = CursorState(first)
    empty_ack.ack_masks[last] = 0
    forge_cursor(path, empty_ack)
    with pytest.raises(CorruptMetadataError, match=rf"batch ack set at {last} is empty"):
        await reopen(tmp_path)


async def test_mark_delete_in_a_trimmed_ledger_is_accepted(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    positions = [await ml.add_entry(b"x") for _ in range(3)]
    await ml.rollover()
    cursor = await ml.open_cursor("sub")
    await cursor.mark_delete(positions[-1])
    assert await ml.trim() == [positions[0].ledger_id]
    await factory.close()
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    assert positions[0].ledger_id not in ml.ledger_ids()
    assert (await ml.open_cursor("sub")).mark_delete_position() == positions[-1]
    await factory.close()


async def test_stale_positions_in_a_trimmed_ledger_are_accepted(tmp_path: Path) -> None:
    """A crash after a trim's metadata write but before the cursor's next write leaves these."""
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    positions = [await ml.add_entry(b"x") for _ in range(4)]
    await ml.rollover()
    later = await ml.add_entry(b"y")
    cursor = await ml.open_cursor("sub")
    await cursor.mark_delete(positions[-1])
    await ml.trim()
    await factory.close()
    trimmed = positions[0].ledger_id
    stale = CursorState(Position(trimmed, 0))
    stale.individual[trimmed] = EntryRangeSet()
    stale.individual[trimmed].add_range(1, 2)
    stale.ack_masks[Position(trimmed, 3)] = 0b10
    forge_cursor(cursor_path(tmp_path), stale)
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    try:
        assert trimmed not in ml.ledger_ids()
        reopened = await ml.open_cursor("sub")
        assert not reopened.is_deleted(later)  # the live entry is still there for the cursor
        assert reopened.first_undeleted_position() == later
    finally:
        await factory.close()


async def test_a_forged_mark_delete_cannot_make_the_log_forget_an_open_transaction(tmp_path: Path) -> None:
    """The issue's failure: a markDelete past the end silently deleted an OPEN txn written later."""
    factory = ManagedLedgerFactory(tmp_path)
    store = await TransactionLogStore.open(factory, 0)
    await store.append(
        tm.TransactionMetadataEntry(
            metadata_op=tm.TransactionMetadataEntry.NEW,
            txnid_most_bits=0,
            txnid_least_bits=1,
            timeout_ms=60_000,
        )
    )
    await store.close()
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    store = await TransactionLogStore.open(factory, 0)
    assert TxnID(0, 1) in await store.replay()  # untampered: the open txn is recovered
    current = store.current_ledger_id()
    await store.close()
    await factory.close()

    # A cursor file claiming everything up to a ledger the log has not even created yet is deleted:
    # adopted, it would hide the txn above and every txn the next run writes.
    log_name = "__transaction_log_0"
    path = cursor_path(tmp_path, CURSOR_NAME, log_name)
    forge_cursor(path, CursorState(Position(current + 1, 10)), CURSOR_NAME)
    factory = ManagedLedgerFactory(tmp_path)
    try:
        with pytest.raises(CorruptMetadataError, match=rf"markDelete {current + 1}:10") as info:
            await TransactionLogStore.open(factory, 0)
        assert str(path) in str(info.value)
    finally:
        await factory.close()


# --- shape checks on checksummed files (what a bug, not damage, could write) --------------------------


async def test_well_checksummed_but_malformed_files_are_refused_with_the_field_named(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    path = meta_path(tmp_path)
    body = statefile.decode(path.read_bytes(), path, "managed-ledger-metadata", frozenset({1})).body
    body["nextLedgerId"] = "7"
    path.write_bytes(statefile.encode("managed-ledger-metadata", 1, body))
    with pytest.raises(CorruptMetadataError, match=r"nextLedgerId must be an integer, not \"7\""):
        await reopen(tmp_path)
    del body["nextLedgerId"]
    path.write_bytes(statefile.encode("managed-ledger-metadata", 1, body))
    with pytest.raises(CorruptMetadataError, match=r"missing field\(s\) \['nextLedgerId'\]"):
        await reopen(tmp_path)
    path.write_bytes(statefile.encode("managed-ledger-metadata", 3, body))
    with pytest.raises(CorruptMetadataError, match="version 3 is not one this release reads"):
        await reopen(tmp_path)
    path.write_bytes(statefile.encode("cursor", 1, body))
    with pytest.raises(CorruptMetadataError, match="it is a 'cursor' state file, not a 'managed-ledger"):
        await reopen(tmp_path)


async def test_cursor_file_with_a_bad_position_or_range_is_refused(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    path = cursor_path(tmp_path)
    good = statefile.decode(path.read_bytes(), path, "cursor", frozenset({1})).body
    for field, value, message in [
        ("markDelete", "1: 2", "markDelete '1: 2' is not a position"),
        ("markDelete", 12, "markDelete must be a string"),
        ("individuallyDeleted", [[1, 3, 2]], r"individuallyDeleted\[0\] is an empty range"),
        ("individuallyDeleted", [[1, 3]], r"individuallyDeleted\[0\] must be \[ledgerId"),
        ("batchDeletedIndexes", [{"position": "1:1", "ackSet": [2**64]}], "does not fit in 64 bits"),
        ("batchDeletedIndexes", [{"position": "1:1"}], r"missing field\(s\) \['ackSet'\]"),
    ]:
        path.write_bytes(statefile.encode("cursor", 1, {**good, field: value}))
        with pytest.raises(CorruptMetadataError, match=message) as info:
            await reopen(tmp_path)
        assert str(path) in str(info.value)


# --- the previous release's files ----------------------------------------------------------------------


def legacy_meta(meta: ManagedLedgerMetadata) -> bytes:
    """meta.json exactly as the previous release wrote it."""
    doc = {
        "version": 1,
        "name": meta.name,
        "nextLedgerId": meta.next_ledger_id,
        "ledgers": [i.to_json() for i in meta.ledgers],
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


def legacy_cursor(state: CursorState, name: str) -> bytes:
    """A cursor file exactly as the previous release wrote it."""
    body = statefile.decode(state.encode(name), Path("x"), "cursor", frozenset({1})).body
    return json.dumps({"version": 1, **body}, separators=(",", ":")).encode() + b"\n"


async def test_previous_release_files_are_read_and_rewritten_checksummed(tmp_path: Path) -> None:
    positions = await make_ledger(tmp_path)
    mpath, cpath = meta_path(tmp_path), cursor_path(tmp_path)
    meta = ManagedLedgerMetadata.decode(mpath.read_bytes(), mpath)
    _, state = CursorState.decode(cpath.read_bytes(), cpath, "sub")
    before = cursor_view(state)
    mpath.write_bytes(legacy_meta(meta))
    cpath.write_bytes(legacy_cursor(state, "sub"))

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open(NAME)
    # the open started a new ledger, so the metadata was rewritten; the cursor is rewritten on its update
    assert mpath.read_bytes().startswith(b"txnkeeper-state managed-ledger-metadata 1 ")
    assert ml.ledger_ids()[: len(meta.ledgers)] == [i.ledger_id for i in meta.ledgers]
    cursor = await ml.open_cursor("sub")
    assert cursor.mark_delete_position() == before[0]
    assert not cpath.read_bytes().startswith(b"txnkeeper-state")
    await cursor.delete([positions[3]])
    await factory.close()
    assert cpath.read_bytes().startswith(b"txnkeeper-state cursor 1 ")
    _, after = CursorState.decode(cpath.read_bytes(), cpath, "sub")
    assert after.is_deleted(positions[3]) and after.ack_masks == state.ack_masks


async def test_previous_release_files_must_have_exactly_the_old_shape(tmp_path: Path) -> None:
    await make_ledger(tmp_path)
    mpath = meta_path(tmp_path)
    legacy = json.loads(legacy_meta(ManagedLedgerMetadata.decode(mpath.read_bytes(), mpath)))
    for doc, message in [
        ({**legacy, "version": 2}, "unknown metadata version 2"),
        ({**legacy, "extra": 1}, r"unexpected field\(s\) \['extra'\]"),
        ({**legacy, "nextLedgerId": 3.0}, "nextLedgerId must be an integer"),
    ]:
        mpath.write_text(json.dumps(doc))
        with pytest.raises(CorruptMetadataError, match=message) as info:
            await reopen(tmp_path)
        assert "no 'txnkeeper-state' header" in str(info.value) and str(mpath) in str(info.value)
    mpath.write_bytes(b'{"version": 1, "name": "\xff"}')
    with pytest.raises(CorruptMetadataError, match="not UTF-8: byte 0xff at offset 24") as info:
        await reopen(tmp_path)
    assert str(mpath) in str(info.value)


async def test_metadata_that_does_not_match_the_ledger_files_is_refused(tmp_path: Path) -> None:
    positions = await make_ledger(tmp_path)
    path = meta_path(tmp_path)
    good = ManagedLedgerMetadata.decode(path.read_bytes(), path)
    first = good.find(positions[0].ledger_id)
    assert first is not None and first.closed
    ledger_file = tmp_path / NAME / "ledgers" / ledger_file_name(first.ledger_id)
    for claimed in (first.entries - 1, first.entries + 1):
        meta = good.copy()
        changed = meta.find(first.ledger_id)
        assert changed is not None
        changed.entries = claimed
        path.write_bytes(meta.encode())
        with pytest.raises(CorruptEntryError, match=f"should hold {claimed} entries") as info:
            await reopen(tmp_path)
        assert str(ledger_file) in str(info.value)
    meta = good.copy()
    meta.name = "another"
    path.write_bytes(meta.encode())
    with pytest.raises(CorruptMetadataError, match="belongs to managed ledger 'another'"):
        await reopen(tmp_path)
    path.write_bytes(good.encode())
    await reopen(tmp_path)  # the untouched metadata still opens: nothing above changed the files
