"""Segment writer and reader: round trips on both drivers, input refusals, ranged reads, corruption."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from txnkeeper.ledger.offload import (
    BlobNotFound,
    BlobStore,
    BlobStoreError,
    BlobUpload,
    FileSystemBlobStore,
    OffloadConfig,
    OffloadCorruptionError,
    OffloadInputError,
    OffloadRangeError,
    SegmentDescription,
    SegmentReader,
    SegmentWriter,
    data_key,
    index_key,
)
from txnkeeper.ledger.offload import index as index_format
from txnkeeper.ledger.offload.block import assemble_block, decode_block, encode_block, frame_entry
from txnkeeper.ledger.offload.index import LedgerIndex
from txnkeeper.ledger.offload.ledgerinfo import LedgerInfo
from txnkeeper.ledger.position import Position

BLOCK = 1024
CONFIG = OffloadConfig(fileSystemURI="/unused", managedLedgerOffloadMaxBlockSizeInBytes=BLOCK)


def entries_of(seed: int) -> list[tuple[int, int, bytes]]:
    rnd = random.Random(seed)
    out = [(5, i, rnd.randbytes(rnd.randrange(0, 200))) for i in range(50)]
    out.append((5, 50, rnd.randbytes(3 * BLOCK)))  # larger than a block: its block grows to fit
    out += [(6, i, rnd.randbytes(rnd.randrange(0, 50))) for i in range(10)]
    return out


async def write_segment(store: BlobStore, entries: list[tuple[int, int, bytes]]) -> SegmentDescription:
    writer = SegmentWriter(store, CONFIG)
    for ledger_id, entry_id, data in entries:
        await writer.add_entry(ledger_id, entry_id, data)
    return await writer.finish()


async def test_round_trip_on_every_driver(store: BlobStore) -> None:
    entries = entries_of(1)
    seg = await write_segment(store, entries)
    assert seg.begin == Position(5, 0) and seg.end == Position(6, 9)
    assert sorted(await store.list()) == sorted([data_key(seg.uuid), index_key(seg.uuid)])
    # Blocks tile the object in order, one ledger each, parts numbered from 1, each at least maxBlockSize.
    offset = 0
    for part, blk in enumerate(seg.blocks, start=1):
        assert (blk.part_id, blk.offset) == (part, offset)
        assert blk.length >= BLOCK
        offset += blk.length
    assert offset == seg.data_length == await store.length(data_key(seg.uuid))
    assert {b.ledger_id for b in seg.blocks} == {5, 6}
    assert max(b.length for b in seg.blocks) == 128 + 12 + 3 * BLOCK

    reader = SegmentReader(store, seg.uuid)
    for ledger_id, first, last in ((5, 0, 50), (5, 17, 17), (5, 48, 50), (6, 0, 9), (6, 3, 4)):
        got = await reader.read_entries(ledger_id, first, last)
        want = [(lid, eid, d) for lid, eid, d in entries if lid == ledger_id and first <= eid <= last]
        assert [(e.ledger_id, e.entry_id, e.data) for e in got] == want

    idx = index_format.decode(await store.get(index_key(seg.uuid)))
    info5 = idx.ledger(5)
    assert info5 is not None
    assert info5.info.entries == 51
    assert info5.info.size == sum(len(d) for lid, _, d in entries if lid == 5)


async def test_ledger_infos_are_merged_into_the_index(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    writer = SegmentWriter(store, CONFIG)
    for i in range(3):
        await writer.add_entry(2, i, b"x")
    seg = await writer.finish({2: LedgerInfo(2, entries=100, size=999, timestamp=1700000000000)})
    idx = await SegmentReader(store, seg.uuid).index()
    led = idx.ledger(2)
    assert led is not None
    # entries says what the segment holds (0..2), not the ledger's 100, so later entries are not promised.
    assert (led.info.entries, led.info.size, led.info.timestamp) == (3, 999, 1700000000000)
    assert set(led.info.block_crcs()) == {1}
    with pytest.raises(OffloadRangeError, match=r"holds entries 0\.\.2 of ledger 2, not 0\.\.3"):
        await SegmentReader(store, seg.uuid).read_entries(2, 0, 3)


async def test_writer_refuses_bad_input_naming_it(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    writer = SegmentWriter(store, CONFIG)
    with pytest.raises(OffloadInputError, match="has no entries"):
        await writer.finish()
    await writer.add_entry(3, 7, b"a")
    with pytest.raises(OffloadInputError, match="must be consecutive"):
        await writer.add_entry(3, 9, b"b")
    with pytest.raises(OffloadInputError, match="ascending order"):
        await writer.add_entry(2, 0, b"b")
    with pytest.raises(OffloadInputError, match="non-negative"):
        await writer.add_entry(-1, 0, b"b")
    seg = await writer.finish()
    with pytest.raises(OffloadInputError, match="is finished"):
        await writer.add_entry(3, 8, b"c")
    # The refused entries changed nothing: the segment holds exactly the one accepted entry.
    got = await SegmentReader(store, seg.uuid).read_entries(3, 7, 7)
    assert [e.data for e in got] == [b"a"]


async def test_aborted_segment_leaves_no_objects(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    writer = SegmentWriter(store, CONFIG)
    for i in range(40):
        await writer.add_entry(1, i, bytes(100))  # several blocks already uploaded
    await writer.abort()
    assert await store.list() == []
    assert [p for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir()))] == []


async def test_reader_refuses_ranges_the_segment_does_not_hold(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    seg = await write_segment(store, entries_of(2))
    reader = SegmentReader(store, seg.uuid)
    with pytest.raises(OffloadRangeError, match=r"holds no entries of ledger 4 \(it holds 5, 6\)"):
        await reader.read_entries(4, 0, 0)
    with pytest.raises(OffloadRangeError, match=r"holds entries 0\.\.9 of ledger 6, not 5\.\.10"):
        await reader.read_entries(6, 5, 10)
    with pytest.raises(BlobNotFound):
        await SegmentReader(store, "no-such-uuid").read_entries(5, 0, 0)


class CountingStore(FileSystemBlobStore):
    """Records every object read, to prove the reader fetches only what it needs (no mock of S3)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int, int | None]] = []

    def _read_range(self, key: str, offset: int, length: int | None) -> bytes:
        self.reads.append((key, offset, length))
        return super()._read_range(key, offset, length)

    def _read_into(self, key: str, offset: int, into: memoryview) -> int:
        self.reads.append((key, offset, len(into)))
        return super()._read_into(key, offset, into)


async def test_reads_fetch_only_the_blocks_needed_and_the_index_once(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    seg = await write_segment(store, entries_of(3))
    reader = SegmentReader(store, seg.uuid)
    target = next(b for b in seg.blocks if b.ledger_id == 5 and b.first_entry_id > 0)
    entry_id = target.first_entry_id
    await reader.read_entries(5, entry_id, entry_id)
    assert store.reads == [
        (index_key(seg.uuid), 0, None),
        (data_key(seg.uuid), target.offset, target.length),
    ]
    store.reads.clear()
    nxt = next(b for b in seg.blocks if b.part_id == target.part_id + 1)
    await reader.read_entries(5, target.last_entry_id, nxt.first_entry_id)
    # Index and the block read before cached (checked already); only the next block is fetched.
    assert store.reads == [(data_key(seg.uuid), nxt.offset, nxt.length)]


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


async def test_flipped_byte_in_a_block_is_an_error_naming_uuid_part_offset(store: BlobStore) -> None:
    seg = await write_segment(store, entries_of(4))
    blk = seg.blocks[2]
    raw = bytearray(await store.get(data_key(seg.uuid)))
    raw[blk.offset + 128 + 12 + 1] ^= 0x01  # a byte of an entry's data: only the CRC can tell
    await store.put(data_key(seg.uuid), bytes(raw))
    reader = SegmentReader(store, seg.uuid)
    with pytest.raises(OffloadCorruptionError) as err:
        await reader.read_entries(blk.ledger_id, blk.first_entry_id, blk.last_entry_id)
    assert (err.value.uuid, err.value.part, err.value.offset) == (seg.uuid, blk.part_id, blk.offset)
    assert (
        "CRC-32" in str(err.value) and seg.uuid in str(err.value) and f"part {blk.part_id}" in str(err.value)
    )
    # Blocks that are intact still read.
    other = seg.blocks[0]
    assert len(await reader.read_entries(other.ledger_id, other.first_entry_id, other.last_entry_id)) > 0


async def test_without_crc_the_structure_check_still_names_the_exact_offset(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    seg = await write_segment(store, entries_of(5))
    # Rewrite the index without CRC properties, as a Pulsar-written segment would have it.
    idx = index_format.decode(await store.get(index_key(seg.uuid)))
    bare = [
        LedgerIndex(LedgerInfo(x.info.ledger_id, x.info.entries, x.info.size), x.entries) for x in idx.ledgers
    ]
    await store.put(index_key(seg.uuid), index_format.encode(idx.data_object_length, bare))
    with pytest.raises(OffloadCorruptionError, match="records no CRC"):
        await SegmentReader(store, seg.uuid).index()
    blk = seg.blocks[1]
    second_entry_id_at = blk.offset + 128 + 12 + (len(entries_of(5)[blk.first_entry_id][2])) + 4
    flip(tmp_path / data_key(seg.uuid), second_entry_id_at + 7)
    reader = SegmentReader(store, seg.uuid, require_crc=False)
    with pytest.raises(OffloadCorruptionError) as err:
        await reader.read_entries(blk.ledger_id, blk.first_entry_id, blk.last_entry_id)
    assert (err.value.part, err.value.offset) == (blk.part_id, second_entry_id_at)


async def test_truncated_data_object_is_refused(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    seg = await write_segment(store, entries_of(6))
    path = tmp_path / data_key(seg.uuid)
    path.write_bytes(path.read_bytes()[: seg.blocks[-1].offset + 10])
    with pytest.raises(OffloadCorruptionError) as err:
        await SegmentReader(store, seg.uuid).read_entries(5, 0, 0)
    assert err.value.part is None and err.value.key == index_key(seg.uuid)
    assert f"data object is {seg.data_length} bytes, it is {seg.blocks[-1].offset + 10}" in str(err.value)


async def test_truncated_block_after_the_index_was_cached_is_refused(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    seg = await write_segment(store, entries_of(7))
    reader = SegmentReader(store, seg.uuid)
    await reader.index()
    last = seg.blocks[-1]
    path = tmp_path / data_key(seg.uuid)
    path.write_bytes(path.read_bytes()[: last.offset + 10])
    with pytest.raises(OffloadCorruptionError) as err:
        await reader.read_entries(last.ledger_id, last.first_entry_id, last.first_entry_id)
    assert (err.value.part, err.value.offset) == (last.part_id, last.offset + 10)
    assert "truncated" in str(err.value)


async def test_bad_index_magic_and_missing_data_are_refused(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    seg = await write_segment(store, entries_of(8))
    flip(tmp_path / index_key(seg.uuid), 0)
    with pytest.raises(OffloadCorruptionError, match="index magic is 0x3C1FB0BC") as err:
        await SegmentReader(store, seg.uuid).index()
    assert (err.value.uuid, err.value.part, err.value.offset) == (seg.uuid, None, 0)
    flip(tmp_path / index_key(seg.uuid), 0)
    (tmp_path / data_key(seg.uuid)).unlink()
    with pytest.raises(OffloadCorruptionError, match="data object is missing"):
        await SegmentReader(store, seg.uuid).index()


class FailingSecondWrite(FileSystemBlobStore):
    """A real filesystem store whose uploads fail on their second write, as a full volume would."""

    def open_upload(self, key: str) -> BlobUpload:
        upload = super().open_upload(key)
        original = upload.write
        calls = 0

        async def write(data: bytes | bytearray) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise BlobStoreError(self.location, key, "write failed: No space left on device")
            await original(data)

        upload.write = write  # type: ignore[method-assign]
        return upload


async def test_store_error_while_uploading_aborts_the_segment(tmp_path: Path) -> None:
    store = FailingSecondWrite(tmp_path)
    writer = SegmentWriter(store, CONFIG)
    with pytest.raises(BlobStoreError, match="No space left"):
        for i in range(40):
            await writer.add_entry(1, i, bytes(100))
    assert await store.list() == []
    assert [p for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir()))] == []
    with pytest.raises(OffloadInputError, match="is aborted; start a new SegmentWriter"):
        await writer.add_entry(1, 40, b"x")


async def test_add_entries_writes_the_same_objects_as_add_entry_one_by_one(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    entries = entries_of(7)
    one_by_one = await write_segment(store, entries)
    batched = SegmentWriter(store, CONFIG)
    for ledger_id in (5, 6):
        datas = [data for lid, _, data in entries if lid == ledger_id]
        await batched.add_entries(ledger_id, 0, datas[:7])  # split, so a call starts mid-block
        await batched.add_entries(ledger_id, 7, datas[7:])
    seg = await batched.finish()
    assert seg.blocks == one_by_one.blocks and (seg.begin, seg.end) == (one_by_one.begin, one_by_one.end)
    for key in (data_key, index_key):
        assert await store.get(key(seg.uuid)) == await store.get(key(one_by_one.uuid))
    gap = SegmentWriter(store, CONFIG)
    await gap.add_entries(5, 0, [b"a", b"b"])
    with pytest.raises(OffloadInputError, match="consecutive"):
        await gap.add_entries(5, 5, [b"c"])
    await gap.abort()


@pytest.mark.parametrize("max_block_size", [140, BLOCK, 64 * 1024])
def test_a_block_assembled_from_framed_entries_is_encode_blocks_byte_for_byte(max_block_size: int) -> None:
    # The streaming writer frames entries as they arrive and assembles the block without a per-entry
    # loop; the result must still be Pulsar's block (encode_block is checked against golden bytes).
    rnd = random.Random(max_block_size)
    entries = [(100 + i, rnd.randbytes(rnd.randrange(0, 300))) for i in range(40)]
    framed = bytearray()
    for entry_id, data in entries:
        frame_entry(framed, entry_id, data)
    block = assemble_block(9, 100, framed, max_block_size)
    assert block == encode_block(9, entries, max_block_size)
    assert decode_block(block).entries == tuple(entries)
    with pytest.raises(ValueError, match="at least one entry"):
        assemble_block(9, 100, bytearray(), max_block_size)
