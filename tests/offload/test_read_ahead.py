"""Read-ahead of offloaded blocks: a sequential reader finds the next blocks fetched and checked, a
corrupt prefetched block is refused only when read (naming uuid/part/offset), a segment deleted while
its blocks were being prefetched is never served from the cache, close cancels every prefetch, and the
cache's byte budget holds prefetched and cached blocks together."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.offload import (
    BlobNotFound,
    FileSystemBlobStore,
    IndexCache,
    OffloadConfig,
    OffloadCorruptionError,
    SegmentDescription,
    SegmentReader,
    SegmentWriter,
    data_key,
    index_key,
)
from txnkeeper.ledger.offload.offloader import OffloadPolicy

BLOCK = 1024
ENTRY = 100  # 8 framed entries (112 bytes each) fill a 1 KiB block: every block has the same length
BLOCKS = 10
CONFIG = OffloadConfig(fileSystemURI="/unused", managedLedgerOffloadMaxBlockSizeInBytes=BLOCK)
DEADLINE = 60.0  # generous: the machine running the tests may be loaded


def payload(entry_id: int) -> bytes:
    return entry_id.to_bytes(4, "big") * (ENTRY // 4)


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE}s: {what}")
        await asyncio.sleep(0.005)  # polling interval of a condition with a deadline


class GatedStore(FileSystemBlobStore):
    """A filesystem store that records every block read and, once ``gate`` is armed, holds each
    (after its bytes were read) until the gate opens: a prefetch stays in flight as long as a test
    needs."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int]] = []
        self.held = 0
        self.armed = False
        self.free: set[int] = set()  # offsets never held, even when armed
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def _read_into(self, key: str, offset: int, into: memoryview) -> int:
        n = super()._read_into(key, offset, into)
        with self._lock:
            self.reads.append((key, offset))
            gated = self.armed and offset not in self.free
            if gated:
                self.held += 1
        if gated and not self.gate.wait(DEADLINE):
            raise AssertionError("the test never opened the gate")
        return n


async def one_ledger_segment(store: FileSystemBlobStore) -> SegmentDescription:
    writer = SegmentWriter(store, CONFIG)
    for entry_id in range(BLOCKS * 8):
        await writer.add_entry(5, entry_id, payload(entry_id))
    seg = await writer.finish()
    assert len(seg.blocks) == BLOCKS and all(b.length == BLOCK for b in seg.blocks)
    return seg


def block_reads(store: GatedStore, seg: SegmentDescription) -> list[int]:
    """Which blocks (by position in the segment) were read, sorted (concurrent reads end in any order)."""
    number = {b.offset: n for n, b in enumerate(seg.blocks)}
    return sorted(number[offset] for key, offset in store.reads if key == data_key(seg.uuid))


def cached(cache: IndexCache, store: GatedStore, seg: SegmentDescription, blocks: list[int]) -> bool:
    """Whether each of the blocks (by position in the segment) is in the cache."""
    return all(cache.block(store.location, seg.uuid, seg.blocks[n].offset) is not None for n in blocks)


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Errors the event loop would log (a prefetch's exception never retrieved, for one)."""
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        yield errors
    finally:
        loop.set_exception_handler(None)


async def test_a_sequential_reader_finds_the_next_blocks_fetched_and_checked(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache(read_ahead_blocks=2)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    assert await reader.read_entry_data(5, 0, 7) == [payload(i) for i in range(8)]
    # Both prefetches run side by side and either may finish first: wait for each one's block.
    await wait_until(lambda: cached(cache, store, seg, [1, 2]), "blocks 1 and 2 prefetched")
    assert block_reads(store, seg) == [0, 1, 2]  # block 0 on demand, 1 and 2 ahead of the reader
    # Reading on consumes the prefetched blocks without reading them again, and reads further ahead.
    assert await reader.read_entry_data(5, 8, 23) == [payload(i) for i in range(8, 24)]
    await wait_until(lambda: cached(cache, store, seg, [3, 4]), "blocks 3 and 4 prefetched")
    assert block_reads(store, seg) == [0, 1, 2, 3, 4]
    # Entries come out whole and in order across blocks.
    entries = await reader.read_entries(5, 6, 41)
    assert [(e.entry_id, e.data) for e in entries] == [(i, payload(i)) for i in range(6, 42)]


async def test_a_corrupt_prefetched_block_is_refused_only_when_read(
    tmp_path: Path, loop_errors: list[dict[str, Any]]
) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    bad = seg.blocks[2]
    path = tmp_path / data_key(seg.uuid)
    raw = bytearray(path.read_bytes())
    raw[bad.offset + 128 + 12 + 5] ^= 0x01  # a byte of an entry's data: only the CRC can tell
    path.write_bytes(bytes(raw))
    cache = IndexCache(read_ahead_blocks=2)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    assert await reader.read_entry_data(5, 0, 7) == [payload(i) for i in range(8)]  # prefetches 1 and 2
    await wait_until(lambda: block_reads(store, seg) == [0, 1, 2], "both prefetches read their block")
    await wait_until(
        lambda: not cache.prefetching(store.location, seg.uuid, bad.offset), "the prefetch of 2 finished"
    )
    assert cache.block(store.location, seg.uuid, bad.offset) is None  # the corrupt block is not cached
    assert await reader.read_entry_data(5, 8, 15) == [payload(i) for i in range(8, 16)]  # block 1 is fine
    with pytest.raises(OffloadCorruptionError) as err:
        await reader.read_entry_data(5, 16, 16)
    assert (err.value.uuid, err.value.part, err.value.offset) == (seg.uuid, bad.part_id, bad.offset)
    assert "CRC-32" in str(err.value) and "the data was not served" in str(err.value)
    # Asked again, it is refused again (fetched afresh, never served from a cache).
    with pytest.raises(OffloadCorruptionError):
        await reader.read_entry_data(5, 20, 23)
    gc.collect()
    assert loop_errors == []  # the prefetch's own failure was not left unretrieved


async def test_a_prefetch_in_flight_when_the_segment_is_deleted_is_never_served(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache(read_ahead_blocks=2)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    await reader.read_entry_data(5, 0, 0)
    # Both prefetches run side by side and either may finish first: wait for each one's block.
    await wait_until(lambda: cached(cache, store, seg, [1, 2]), "blocks 1 and 2 prefetched")
    store.armed = True
    await reader.read_entry_data(5, 16, 23)  # block 2 cached: prefetches 3 and 4, held after reading
    await wait_until(lambda: store.held == 2, "both prefetches read their bytes")
    # What the offloader does when a trimmed segment goes: delete the objects, forget the segment.
    await store.delete(index_key(seg.uuid))
    await store.delete(data_key(seg.uuid))
    cache.forget(store.location, seg.uuid)
    store.gate.set()
    assert not cache.prefetching(store.location, seg.uuid, seg.blocks[3].offset)
    assert not cache.prefetching(store.location, seg.uuid, seg.blocks[4].offset)
    await asyncio.sleep(0)  # let the cancelled prefetches' callbacks run
    assert cache.block_bytes == 0
    with pytest.raises(BlobNotFound):
        await reader.read_entry_data(5, 24, 24)  # the bytes prefetched before the delete are gone too
    for block in seg.blocks:
        assert cache.block(store.location, seg.uuid, block.offset) is None


async def test_a_demand_read_racing_a_forget_is_answered_but_not_cached(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache()  # no read-ahead: the demand read itself races the delete
    reader = SegmentReader(store, seg.uuid, cache=cache)
    await reader.index()
    store.armed = True
    read = asyncio.ensure_future(reader.read_entry_data(5, 0, 0))
    await wait_until(lambda: store.held == 1, "the read has its bytes")
    cache.forget(store.location, seg.uuid)
    store.gate.set()
    assert await read == [payload(0)]  # asked before the delete: answered
    assert cache.block(store.location, seg.uuid, seg.blocks[0].offset) is None
    assert cache.block_bytes == 0


async def test_the_byte_budget_holds_cached_and_prefetched_blocks_together(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache(max_block_bytes=3 * BLOCK, read_ahead_blocks=4)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    for first in range(0, BLOCKS * 8, 8):
        assert await reader.read_entry_data(5, first, first + 7) == [payload(first + i) for i in range(8)]
        assert cache.block_bytes <= 3 * BLOCK
        # The block just read is kept; read-ahead took only the room left beside it.
        assert cache.block(store.location, seg.uuid, seg.blocks[first // 8].offset) is not None
        await wait_until(
            lambda: not any(cache.prefetching(store.location, seg.uuid, b.offset) for b in seg.blocks),
            "prefetches done",
        )
        assert cache.block_bytes <= 3 * BLOCK
    assert block_reads(store, seg) == list(range(BLOCKS))  # each read once, none evicted unread
    # A budget with no room beside the block being read: no read-ahead at all.
    store.reads.clear()
    tight = IndexCache(max_block_bytes=BLOCK, read_ahead_blocks=2)
    await SegmentReader(store, seg.uuid, cache=tight).read_entry_data(5, 0, 0)
    assert block_reads(store, seg) == [0] and not tight.prefetching(
        store.location, seg.uuid, seg.blocks[1].offset
    )


async def test_close_cancels_every_prefetch(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache(read_ahead_blocks=2)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    await reader.index()
    # Only the prefetches are held: the demand read of block 0 passes while they wait at the gate
    # (opening the gate for the demand read let prefetches started meanwhile pass and finish too).
    store.free = {seg.blocks[0].offset}
    store.armed = True
    await reader.read_entry_data(5, 0, 0)
    await wait_until(lambda: store.held >= 2, "the prefetches are in flight")
    ahead = [t for t in asyncio.all_tasks() if t.get_name().startswith("offload-read-ahead:")]
    cache.close()
    store.gate.set()
    await asyncio.gather(*ahead, return_exceptions=True)
    assert ahead and all(t.cancelled() for t in ahead)
    assert cache.block_bytes == 0
    await reader.read_entry_data(5, 8, 8)  # a closed cache still reads (uncached), it only stops helping
    assert cache.block_bytes == 0 and not cache.prefetching(store.location, seg.uuid, seg.blocks[2].offset)


async def test_a_managed_ledger_drains_its_offloaded_ledgers_with_read_ahead_and_closes_clean(
    tmp_path: Path,
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    policy = OffloadPolicy(
        OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=4096),
        managedLedgerOffloadDeletionLagMs=0,
    )
    config = ManagedLedgerConfig(max_entries_per_ledger=100, offload=policy)
    factory = ManagedLedgerFactory(tmp_path / "data")
    data = [os.urandom(300) for _ in range(250)]
    try:
        ml = await factory.open("persistent://t/ns/drain", config)
        for d in data:
            await ml.add_entry(d)
        await ml.rollover()
        assert ml.offloader is not None
        await ml.offloader.offload()
        got: list[bytes] = []
        pos = Position(ml.ledger_ids()[0], 0)
        while len(got) < len(data):
            entries = await ml.read_entries(pos, 16)
            assert entries, f"nothing at {pos}"
            got += [e.data for e in entries]
            last = entries[-1].position
            pos = Position(last.ledger_id, last.entry_id + 1)
            if pos.entry_id >= ml.confirmed_entries(last.ledger_id):
                pos = Position(min(i for i in ml.ledger_ids() if i > last.ledger_id), 0)
        assert got == data
        assert ml.offloader.stats.read_offload_bytes == sum(len(d) for d in data)  # all from the tier
    finally:
        await factory.close()
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("offload-read-ahead:") and not t.done()]
    assert left == []


async def test_a_block_larger_than_the_budget_is_cached_alone_not_read_again_per_request(
    tmp_path: Path,
) -> None:
    """offloadMode=ledger writes 64 MiB blocks, twice the default budget: a consumer reading a few
    entries at a time must not GET and check the whole block again for each read."""
    store = GatedStore(tmp_path)
    seg = await one_ledger_segment(store)
    cache = IndexCache(max_block_bytes=BLOCK // 2)
    reader = SegmentReader(store, seg.uuid, cache=cache)
    for entry_id in range(16):  # two blocks, one entry per read
        assert await reader.read_entry_data(5, entry_id, entry_id) == [payload(entry_id)]
    assert block_reads(store, seg) == [0, 1]
    assert cache.block(store.location, seg.uuid, seg.blocks[0].offset) is None  # evicted by block 1
    assert cache.block_bytes == BLOCK
