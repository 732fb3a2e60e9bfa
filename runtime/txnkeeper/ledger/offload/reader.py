"""Reading entries back from an offloaded segment, verified, fetching only the blocks needed.

The index object is fetched once and cached (it is small and immutable); each read then issues one
ranged read per block that holds requested entries (``BlobStore.read_checked``: the block is checked
against the index on the worker thread that read it, by ``checks.check_block``, the same checks
``txnkeeper inspect-offload`` applies), and only then returns entries. Anything that does not check out is an
OffloadCorruptionError naming the segment uuid, the part and the object offset: corrupt bytes are
never returned as entries.

Checked blocks are cached (a consumer asks for fewer entries than a block holds), and with read-ahead
(``IndexCache(read_ahead_blocks=...)``, what the managed ledger's offloader uses) the next blocks of a
segment are fetched and checked in the background while the current one is handed out, so draining
the tier overlaps the GET and CRC of block k+1 with the consumer's work on block k.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from . import index as index_format
from .blobstore import BlobStore
from .checks import BlockPlan, block_plans, check_block, check_index
from .errors import BlobNotFound, OffloadCorruptionError, OffloadFormatError, OffloadRangeError
from .index import IndexEntry, OffloadIndex
from .writer import data_key, index_key


@dataclass(frozen=True)
class OffloadedEntry:
    ledger_id: int
    entry_id: int
    data: bytes


BlockKey = tuple[str, str, int]  # store location, segment uuid, block offset in the data object
BlockEntries = list[tuple[int, bytes]]  # (entry id, data) of one checked block


class IndexCache:
    """A small LRU of decoded index objects, and of the last blocks read (already CRC-checked and
    decoded), shared by the readers of one store. Blocks are cached because a consumer draining the
    tier asks for a few entries at a time and one block holds many: without it each request would GET
    and check the whole block again.

    With ``read_ahead_blocks`` > 0, a read that uses block k of a segment also starts fetching and
    checking the next blocks (in object order) in the background, so a sequential consumer finds them
    ready: the GET and the CRC run on worker threads while the event loop hands entries out. Prefetched
    bytes count against ``max_block_bytes`` with the cached blocks (the least recently used are evicted
    to make room, never a block the triggering read uses; no room, no prefetch). A block larger than
    the budget is cached alone (everything else evicted), so the budget is exceeded by at most that one
    block. A prefetch's error is
    raised only by a read of that block. ``forget`` (segment deleted) and ``close`` cancel prefetches,
    and nothing fetched before a ``forget`` is cached after it.
    """

    def __init__(
        self, max_segments: int = 256, max_block_bytes: int = 32 * 1024 * 1024, read_ahead_blocks: int = 0
    ) -> None:
        if read_ahead_blocks < 0:
            raise ValueError(f"read_ahead_blocks must be >= 0 (got {read_ahead_blocks})")
        self.max_segments = max_segments
        self.max_block_bytes = max_block_bytes
        self.read_ahead_blocks = read_ahead_blocks
        self._items: OrderedDict[tuple[str, str], OffloadIndex] = OrderedDict()
        self._orders: dict[tuple[str, str], _BlockOrder] = {}
        self._blocks: OrderedDict[BlockKey, tuple[int, BlockEntries]] = OrderedDict()
        self._block_bytes = 0
        self._prefetches: dict[BlockKey, tuple[int, asyncio.Task[BlockEntries]]] = {}
        # Bumped by every forget: a fetch that started before it may hold a deleted segment's bytes,
        # so its result is handed to its reader but never cached.
        self.epoch = 0
        self._closed = False

    @property
    def block_bytes(self) -> int:
        """Bytes of cached blocks plus those being prefetched (at most ``max_block_bytes``)."""
        return self._block_bytes + self._prefetch_bytes()

    def _prefetch_bytes(self) -> int:
        return sum(length for length, _ in self._prefetches.values())

    def block(self, location: str, uuid: str, offset: int) -> BlockEntries | None:
        item = self._blocks.get((location, uuid, offset))
        if item is None:
            return None
        self._blocks.move_to_end((location, uuid, offset))
        return item[1]

    def put_block(
        self,
        location: str,
        uuid: str,
        offset: int,
        length: int,
        entries: BlockEntries,
        *,
        epoch: int | None = None,
    ) -> None:
        """Cache a checked block; ``epoch``: the cache's epoch when its fetch started (not cached if a
        segment was forgotten since)."""
        if (epoch is not None and epoch != self.epoch) or self._closed:
            return
        # A block larger than the whole budget (``offloadMode=ledger`` writes 64 MiB blocks) is still
        # cached, alone: otherwise a consumer reading a few entries at a time would GET and check the
        # entire block again for every read.
        key = (location, uuid, offset)
        old = self._blocks.pop(key, None)
        self._block_bytes -= old[0] if old is not None else 0
        self._blocks[key] = (length, entries)
        self._block_bytes += length
        self._evict(self.max_block_bytes - self._prefetch_bytes(), keep={key})

    def _evict(self, budget: int, keep: set[BlockKey]) -> bool:
        """Drop least recently used blocks not in ``keep`` until cached bytes fit ``budget``."""
        if self._block_bytes <= budget:
            return True
        for key in list(self._blocks):
            if key in keep:
                continue
            self._block_bytes -= self._blocks.pop(key)[0]
            if self._block_bytes <= budget:
                return True
        return False

    def get(self, location: str, uuid: str) -> OffloadIndex | None:
        item = self._items.get((location, uuid))
        if item is not None:
            self._items.move_to_end((location, uuid))
        return item

    def put(self, location: str, uuid: str, idx: OffloadIndex) -> None:
        self._items[(location, uuid)] = idx
        self._items.move_to_end((location, uuid))
        while len(self._items) > self.max_segments:
            gone, _ = self._items.popitem(last=False)
            self._orders.pop(gone, None)

    def order(self, location: str, uuid: str, idx: OffloadIndex) -> _BlockOrder:
        """The segment's blocks in object order with their CRCs (computed once per cached index)."""
        order = self._orders.get((location, uuid))
        if order is None or order.index is not idx:
            order = _BlockOrder(uuid, idx)
            if self._items.get((location, uuid)) is idx:
                self._orders[(location, uuid)] = order
        return order

    def forget(self, location: str, uuid: str) -> None:
        self.epoch += 1
        self._items.pop((location, uuid), None)
        self._orders.pop((location, uuid), None)
        for key in [k for k in self._blocks if k[:2] == (location, uuid)]:
            self._block_bytes -= self._blocks.pop(key)[0]
        for key in [k for k in self._prefetches if k[:2] == (location, uuid)]:
            self._prefetches.pop(key)[1].cancel()

    def close(self) -> None:
        """Cancel every prefetch and cache nothing more (the store is about to close)."""
        self._closed = True
        self.epoch += 1
        for _, task in self._prefetches.values():
            task.cancel()
        self._prefetches.clear()
        self._blocks.clear()
        self._block_bytes = 0

    def prefetching(self, location: str, uuid: str, offset: int) -> bool:
        """Whether a background fetch of this block is under way (tests and stats)."""
        return (location, uuid, offset) in self._prefetches

    def claim_prefetch(self, location: str, uuid: str, offset: int) -> asyncio.Task[BlockEntries] | None:
        """The prefetch of this block, if one runs or ran unread; the caller now owns its result."""
        item = self._prefetches.pop((location, uuid, offset), None)
        return item[1] if item is not None else None

    def start_prefetch(
        self,
        key: BlockKey,
        length: int,
        fetch: Callable[[], Coroutine[Any, Any, BlockEntries]],
        keep: set[BlockKey],
        reserve: int = 0,
    ) -> bool:
        """Fetch a block in the background unless it is cached or being fetched already; False when
        it does not fit in the budget (or the cache is closed). ``keep``: blocks not to evict for it;
        ``reserve``: bytes of blocks being read on demand, to be cached beside it."""
        if self._closed:
            return False
        if key in self._blocks or key in self._prefetches:
            return True
        if not self._evict(self.max_block_bytes - self._prefetch_bytes() - length - reserve, keep):
            return False
        epoch = self.epoch
        task = asyncio.get_running_loop().create_task(fetch(), name=f"offload-read-ahead:{key[1]}@{key[2]}")
        self._prefetches[key] = (length, task)
        task.add_done_callback(lambda t: self._prefetched(key, length, epoch, t))
        return True

    def _prefetched(self, key: BlockKey, length: int, epoch: int, task: asyncio.Task[BlockEntries]) -> None:
        if task.cancelled():
            return
        error = task.exception()  # retrieved, so an unread failure is not logged as never retrieved
        current = self._prefetches.get(key)
        if current is None or current[1] is not task:
            return  # claimed by a read (which caches it) or dropped by forget/close
        del self._prefetches[key]
        if error is None:
            self.put_block(*key, length, task.result(), epoch=epoch)
        # A failed prefetch is dropped: a read of the block fetches it afresh and raises what it finds
        # then (a store that was briefly unavailable is not reported later as still failing).


class _BlockOrder:
    """A segment's blocks in object order, each as the index describes it (``checks.BlockPlan``), and
    where each block sits in that order: what reads check blocks against and read-ahead walks."""

    def __init__(self, uuid: str, index: OffloadIndex) -> None:
        self.index = index
        # The index was checked (with the reader's require_crc) before it was cached.
        self.blocks = block_plans(uuid, index, require_crc=False)
        self.position = {p.entry.offset: n for n, p in enumerate(self.blocks)}

    def plan(self, entry: IndexEntry) -> BlockPlan:
        return self.blocks[self.position[entry.offset]]

    def after(self, entry: IndexEntry, count: int) -> list[BlockPlan]:
        n = self.position[entry.offset] + 1
        return self.blocks[n : n + count]


class SegmentReader:
    """Reads entries of one segment ``uuid``.

    ``require_crc`` (default) refuses blocks whose index records no CRC (segments not written by
    txnkeeper): without one, a flipped bit in entry data could not be told from data.
    """

    def __init__(
        self, store: BlobStore, uuid: str, *, cache: IndexCache | None = None, require_crc: bool = True
    ) -> None:
        self.store = store
        self.uuid = uuid
        self.cache = cache if cache is not None else IndexCache()
        self.require_crc = require_crc

    async def index(self) -> OffloadIndex:
        cached = self.cache.get(self.store.location, self.uuid)
        if cached is not None:
            return cached
        key = index_key(self.uuid)
        raw = await self.store.get(key)
        try:
            idx = index_format.decode(raw)
        except OffloadFormatError as exc:
            raise OffloadCorruptionError(self.uuid, None, exc.offset, exc.problem, key) from None
        try:
            data_length = await self.store.length(data_key(self.uuid))
        except BlobNotFound:
            raise OffloadCorruptionError(
                self.uuid, None, 0, "the index exists but the data object is missing", data_key(self.uuid)
            ) from None
        check_index(self.uuid, idx, data_length=data_length, require_crc=self.require_crc)
        self.cache.put(self.store.location, self.uuid, idx)
        return idx

    async def read_entries(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int
    ) -> list[OffloadedEntry]:
        """Entries ``first..last`` (inclusive) of ``ledger_id``, all or an error."""
        datas = await self.read_entry_data(ledger_id, first_entry_id, last_entry_id)
        return [OffloadedEntry(ledger_id, first_entry_id + i, d) for i, d in enumerate(datas)]

    async def read_entry_data(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """The data of entries ``first..last`` (inclusive) of ``ledger_id``, in order, all or an error
        (what the managed ledger's reads need, without an object per entry)."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise OffloadRangeError(f"invalid entry range {first_entry_id}..{last_entry_id}")
        idx = await self.index()
        led = idx.ledger(ledger_id)
        if led is None:
            held = ", ".join(str(x.info.ledger_id) for x in idx.ledgers)
            raise OffloadRangeError(
                f"segment {self.uuid} holds no entries of ledger {ledger_id} (it holds {held})"
            )
        first_held = led.entries[0].first_entry_id
        last_held = led.info.last_entry_id
        if first_entry_id < first_held or last_held is None or last_entry_id > last_held:
            raise OffloadRangeError(
                f"segment {self.uuid} holds entries {first_held}..{last_held} of ledger {ledger_id}, "
                f"not {first_entry_id}..{last_entry_id}"
            )
        wanted = [
            e
            for i, e in enumerate(led.entries)
            if e.first_entry_id <= last_entry_id
            and (i + 1 == len(led.entries) or led.entries[i + 1].first_entry_id > first_entry_id)
        ]
        order = self.cache.order(self.store.location, self.uuid, idx)
        if self.cache.read_ahead_blocks:
            self._read_ahead(idx, order, wanted)
        out: list[bytes] = []
        for entry in wanted:
            block = await self._read_block(order.plan(entry))
            # A checked block holds consecutive ids from its first (decode_block refuses anything else).
            skip = max(first_entry_id - entry.first_entry_id, 0)
            out.extend(data for _, data in block[skip : last_entry_id - entry.first_entry_id + 1])
        expected = last_entry_id - first_entry_id + 1
        if len(out) != expected:
            raise OffloadCorruptionError(
                self.uuid,
                wanted[-1].part_id,
                wanted[-1].offset,
                f"blocks hold {len(out)} of the {expected} entries {first_entry_id}..{last_entry_id} "
                "the index promises",
                data_key(self.uuid),
            )
        return out

    def _read_ahead(self, idx: OffloadIndex, order: _BlockOrder, wanted: list[IndexEntry]) -> None:
        """Start fetching the blocks after the last one this read uses (a sequential consumer's next)."""
        location = self.store.location
        keep = {(location, self.uuid, e.offset) for e in wanted}
        # The wanted blocks not cached yet are cached by this read: room for them is kept too.
        reserve = sum(
            idx.block_length(e) for e in wanted if self.cache.block(location, self.uuid, e.offset) is None
        )
        for plan in order.after(wanted[-1], self.cache.read_ahead_blocks):
            key = (location, self.uuid, plan.entry.offset)
            fetch = partial(self._fetch_block, plan)
            if not self.cache.start_prefetch(key, plan.length, fetch, keep, reserve):
                return  # no room (or closed): the blocks after it would not fit either
            keep.add(key)

    async def _read_block(self, plan: BlockPlan) -> BlockEntries:
        location = self.store.location
        offset = plan.entry.offset
        cached = self.cache.block(location, self.uuid, offset)
        if cached is not None:
            return cached
        epoch = self.cache.epoch
        prefetch = self.cache.claim_prefetch(location, self.uuid, offset)
        # A prefetch's error (corruption, store unavailable) is raised here, by the read of its block.
        entries = await (prefetch if prefetch is not None else self._fetch_block(plan))
        self.cache.put_block(location, self.uuid, offset, plan.length, entries, epoch=epoch)
        return entries

    async def _fetch_block(self, plan: BlockPlan) -> BlockEntries:
        """Read one block, check it and decode it on a worker thread (one call where the driver can:
        the CRC of a block of megabytes and the copy of its entries are the costly part, and zlib
        releases the GIL for the CRC, so the loop hands entries out meanwhile)."""
        return await self.store.read_checked(
            data_key(self.uuid), plan.entry.offset, plan.length, partial(self._check_block, plan=plan)
        )

    def _check_block(self, raw: memoryview, *, plan: BlockPlan) -> BlockEntries:
        """The block checked against the index (``checks.check_block``), then its entries."""
        return list(check_block(self.uuid, raw, plan, require_crc=self.require_crc).entries)
