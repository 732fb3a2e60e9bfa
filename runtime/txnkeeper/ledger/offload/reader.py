"""Reading entries back from an offloaded segment, verified, fetching only the blocks needed.

The index object is fetched once and cached (it is small and immutable); each read then issues one
ranged GET per block that holds requested entries, checks the block's length, its CRC from the index and
its structure, and only then returns entries. Anything that does not check out is an
OffloadCorruptionError naming the segment uuid, the part and the object offset: corrupt bytes are
never returned as entries.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from . import index as index_format
from .blobstore import BlobStore
from .block import block_crc, decode_block
from .errors import BlobNotFound, OffloadCorruptionError, OffloadFormatError, OffloadRangeError
from .index import IndexEntry, OffloadIndex
from .writer import data_key, index_key


@dataclass(frozen=True)
class OffloadedEntry:
    ledger_id: int
    entry_id: int
    data: bytes


class IndexCache:
    """A small LRU of decoded index objects, and of the last blocks read (already CRC-checked and
    decoded), shared by the readers of one store. Blocks are cached because a consumer draining the
    tier asks for a few entries at a time and one block holds many: without it each request would GET
    and check the whole block again."""

    def __init__(self, max_segments: int = 256, max_block_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_segments = max_segments
        self.max_block_bytes = max_block_bytes
        self._items: OrderedDict[tuple[str, str], OffloadIndex] = OrderedDict()
        self._blocks: OrderedDict[tuple[str, str, int], tuple[int, list[tuple[int, bytes]]]] = OrderedDict()
        self._block_bytes = 0

    def block(self, location: str, uuid: str, offset: int) -> list[tuple[int, bytes]] | None:
        item = self._blocks.get((location, uuid, offset))
        if item is None:
            return None
        self._blocks.move_to_end((location, uuid, offset))
        return item[1]

    def put_block(
        self, location: str, uuid: str, offset: int, length: int, entries: list[tuple[int, bytes]]
    ) -> None:
        if length > self.max_block_bytes:
            return
        old = self._blocks.pop((location, uuid, offset), None)
        self._block_bytes -= old[0] if old is not None else 0
        self._blocks[(location, uuid, offset)] = (length, entries)
        self._block_bytes += length
        while self._block_bytes > self.max_block_bytes:
            _, (size, _) = self._blocks.popitem(last=False)
            self._block_bytes -= size

    def get(self, location: str, uuid: str) -> OffloadIndex | None:
        item = self._items.get((location, uuid))
        if item is not None:
            self._items.move_to_end((location, uuid))
        return item

    def put(self, location: str, uuid: str, idx: OffloadIndex) -> None:
        self._items[(location, uuid)] = idx
        self._items.move_to_end((location, uuid))
        while len(self._items) > self.max_segments:
            self._items.popitem(last=False)

    def forget(self, location: str, uuid: str) -> None:
        self._items.pop((location, uuid), None)
        for key in [k for k in self._blocks if k[:2] == (location, uuid)]:
            self._block_bytes -= self._blocks.pop(key)[0]


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
        if data_length != idx.data_object_length:
            raise OffloadCorruptionError(
                self.uuid,
                None,
                8,
                f"index says the data object is {idx.data_object_length} bytes, it is {data_length}",
                key,
            )
        for led in idx.ledgers:
            try:
                crcs = led.info.block_crcs()
            except OffloadFormatError as exc:
                raise OffloadCorruptionError(self.uuid, None, 0, exc.problem, key) from None
            for e in led.entries:
                if e.part_id not in crcs and self.require_crc:
                    raise OffloadCorruptionError(
                        self.uuid,
                        e.part_id,
                        e.offset,
                        "the index records no CRC for this block (not written by txnkeeper?); "
                        "open the reader with require_crc=False to read it unverified",
                        key,
                    )
        self.cache.put(self.store.location, self.uuid, idx)
        return idx

    async def read_entries(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int
    ) -> list[OffloadedEntry]:
        """Entries ``first..last`` (inclusive) of ``ledger_id``, all or an error."""
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
        crcs = led.info.block_crcs()
        wanted = [
            e
            for i, e in enumerate(led.entries)
            if e.first_entry_id <= last_entry_id
            and (i + 1 == len(led.entries) or led.entries[i + 1].first_entry_id > first_entry_id)
        ]
        out: list[OffloadedEntry] = []
        for entry in wanted:
            for entry_id, data in await self._read_block(idx, entry, crcs.get(entry.part_id)):
                if first_entry_id <= entry_id <= last_entry_id:
                    out.append(OffloadedEntry(ledger_id, entry_id, data))
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

    async def _read_block(
        self, idx: OffloadIndex, entry: IndexEntry, crc: int | None
    ) -> list[tuple[int, bytes]]:
        key = data_key(self.uuid)
        cached = self.cache.block(self.store.location, self.uuid, entry.offset)
        if cached is not None:
            return cached
        length = idx.block_length(entry)
        raw = await self.store.get(key, entry.offset, length)

        def corrupt(offset: int, problem: str) -> OffloadCorruptionError:
            return OffloadCorruptionError(self.uuid, entry.part_id, offset, problem, key)

        if len(raw) != length:
            raise corrupt(
                entry.offset + len(raw), f"object truncated: block needs {length} bytes, got {len(raw)}"
            )
        if crc is not None:
            actual = await asyncio.to_thread(block_crc, raw)  # off the loop: blocks are megabytes
            if actual != crc:
                raise corrupt(entry.offset, f"block CRC-32 is {actual:08x}, the index recorded {crc:08x}")
        elif self.require_crc:
            raise corrupt(entry.offset, "the index records no CRC for this block")
        try:
            decoded = await asyncio.to_thread(decode_block, raw)
        except OffloadFormatError as exc:
            raise corrupt(entry.offset + exc.offset, exc.problem) from None
        if (
            decoded.header.ledger_id != entry.ledger_id
            or decoded.header.first_entry_id != entry.first_entry_id
        ):
            raise corrupt(
                entry.offset,
                f"block header holds {decoded.header.ledger_id}:{decoded.header.first_entry_id}, "
                f"the index says {entry.ledger_id}:{entry.first_entry_id}",
            )
        entries = list(decoded.entries)
        self.cache.put_block(self.store.location, self.uuid, entry.offset, length, entries)
        return entries
