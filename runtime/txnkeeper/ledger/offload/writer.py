"""Streaming segment writer: entries of one or more ledgers in, one PIP-76 segment (data + index) out.

A segment is what Pulsar's streaming offloader (BlobStoreManagedLedgerOffloader.streamingOffload)
produces: a data object ``${uuid}`` made of blocks (one ledger each, cut at maxBlockSize, uploaded as
they fill so memory stays at one block) and then an index object ``${uuid}-index``. The index is written
last, so a segment without an index was never finished and must not be read (the later read-through
slice ignores and deletes such leftovers). The returned SegmentDescription is what a later slice
records in the ledger metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from txnkeeper.ledger.position import Position

from . import index as index_format
from . import timeline
from .blobstore import BlobStore, BlobUpload
from .block import (
    ENTRY_HEADER_SIZE,
    HEADER_SIZE,
    MAX_ENTRY_SIZE,
    frame_entry,
    seal_block,
)
from .config import OffloadConfig
from .errors import OffloadInputError, StagedBlockLost
from .index import IndexEntry, LedgerIndex
from .ledgerinfo import CRC_PROPERTY_PREFIX, LedgerInfo, crc_property

INDEX_SUFFIX = "-index"
_pack_entry_header = struct.Struct(">iq").pack  # block framing: entry_len, entry_id


def data_key(uuid: str) -> str:
    return uuid


def index_key(uuid: str) -> str:
    return f"{uuid}{INDEX_SUFFIX}"


@dataclass(frozen=True)
class BlockDescription:
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    part_id: int
    offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class SegmentDescription:
    uuid: str
    begin: Position  # first entry written
    end: Position  # last entry written
    blocks: tuple[BlockDescription, ...]
    data_length: int
    index_length: int


class BlockStaging(Protocol):
    """Blocks built and uploaded by another process (the read-back worker): the writer says what
    goes in which block and where it is written, and gets back only each block's CRC and length."""

    def new_block(self) -> int:
        """An id for a new, empty staged block."""
        ...

    async def stage(self, block: int, ledger_id: int, first: int, count: int) -> None:
        """Append durable local entries ``first``..``first+count-1``, checked and framed, to ``block``.
        Raises StagedBlockLost when the process holding ``block`` was replaced."""
        ...

    async def write_block(
        self,
        block: int,
        *,
        ledger_id: int,
        first_entry_id: int,
        min_size: int,
        path: str,
        offset: int,
        slice_bytes: int | None,
    ) -> tuple[int, int]:
        """Seal ``block``, write it at ``offset`` of the upload file ``path`` and make it durable
        (fdatasynced in ``slice_bytes`` slices; None: the driver's); returns (CRC, length). Raises
        StagedBlockLost as ``stage``."""
        ...

    async def drop_block(self, block: int) -> None:
        """Forget ``block`` (best effort)."""
        ...


class SegmentWriter:
    """Feed ``add_entry`` in ledger order, then ``finish``; ``abort`` discards an unfinished segment.

    Entries of a ledger must have consecutive ids; ledgers must come in ascending id order (a segment
    covers a stretch of one managed ledger). Not safe for concurrent calls: one offload task owns it.

    With ``staging`` and a store whose uploads are local files (the filesystem driver), blocks are
    built and written by the staging process (``add_staged``): this process handles no entry bytes.
    """

    def __init__(
        self,
        store: BlobStore,
        config: OffloadConfig,
        *,
        uuid: str | None = None,
        block_size: int | None = None,
        staging: BlockStaging | None = None,
    ) -> None:
        """``block_size`` overrides the max block size (streaming cuts blocks at the min block size);
        ``staging`` is used only if the store's uploads are local files (``stages`` tells)."""
        self.store = store
        self.uuid = uuid or str(uuidlib.uuid4())
        self._upload: BlobUpload | None = None
        if staging is not None:  # opening an upload does no I/O (every driver starts it lazily)
            self._upload = store.open_upload(data_key(self.uuid))
        self._staging = staging if self._upload is not None and self._upload.local_files else None
        self._block: int | None = None  # the staged block being filled
        #: staged blocks are fdatasynced in slices this large (None: the driver's default)
        self.sync_slice_bytes: int | None = None
        self._staged_size = HEADER_SIZE  # its size so far, header room included
        self.max_block_size = block_size or config.managedLedgerOffloadMaxBlockSizeInBytes
        # The block being filled, its entries already framed after HEADER_SIZE bytes reserved for its
        # header: a bytearray and two ints, never an object per entry (see block.assemble_block).
        self._pending = bytearray(HEADER_SIZE)
        self._pending_first = 0
        self._pending_last = 0
        self._pending_ledger: int | None = None
        self._blocks: list[BlockDescription] = []
        self._offset = 0
        self._last: Position | None = None
        self._first: Position | None = None
        self._ledger_bytes: dict[int, int] = {}
        self._state = "open"

    @property
    def stages(self) -> bool:
        """Whether entries go in through ``add_staged`` (blocks built by the staging process)."""
        return self._staging is not None

    def _filled(self) -> int:
        return self._staged_size if self._staging is not None else len(self._pending)

    @property
    def last(self) -> Position | None:
        """The last entry added (None before the first)."""
        return self._last

    def _check_open(self) -> None:
        if self._state != "open":
            raise OffloadInputError(f"segment {self.uuid} is {self._state}; start a new SegmentWriter")

    def _check_follows(self, ledger_id: int, entry_id: int) -> None:
        last = self._last
        if last is None:
            return
        if ledger_id < last.ledger_id:
            raise OffloadInputError(
                f"entry {ledger_id}:{entry_id} comes after ledger {last.ledger_id}; "
                "feed ledgers in ascending order"
            )
        if ledger_id == last.ledger_id and entry_id != last.entry_id + 1:
            raise OffloadInputError(
                f"entry {ledger_id}:{entry_id} after {last}: entries of a ledger must be consecutive"
            )

    async def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self._check_open()
        if ledger_id < 0 or entry_id < 0:
            raise OffloadInputError(
                f"entry {ledger_id}:{entry_id}: ledger and entry ids must be non-negative"
            )
        if len(data) > MAX_ENTRY_SIZE - ENTRY_HEADER_SIZE - HEADER_SIZE:
            raise OffloadInputError(
                f"entry {ledger_id}:{entry_id} of {len(data)} bytes is too large to offload"
            )
        self._check_follows(ledger_id, entry_id)
        framed = ENTRY_HEADER_SIZE + len(data)
        if len(self._pending) > HEADER_SIZE and (
            ledger_id != self._pending_ledger or len(self._pending) + framed > self.max_block_size
        ):
            await self._flush_block()
        if len(self._pending) == HEADER_SIZE:
            self._pending_first = entry_id
        frame_entry(self._pending, entry_id, data)
        self._pending_last = entry_id
        self._pending_ledger = ledger_id
        self._ledger_bytes[ledger_id] = self._ledger_bytes.get(ledger_id, 0) + len(data)
        self._last = Position(ledger_id, entry_id)
        if self._first is None:
            self._first = self._last

    async def add_entries(self, ledger_id: int, first_entry_id: int, datas: Sequence[bytes]) -> None:
        """Consecutive entries of one ledger from ``first_entry_id``: what ``add_entry`` does for each,
        with the ordering checks once per call (streaming feeds thousands of entries a second)."""
        if not datas:
            return
        await self.add_entry(ledger_id, first_entry_id, datas[0])
        limit = MAX_ENTRY_SIZE - ENTRY_HEADER_SIZE - HEADER_SIZE
        room = self.max_block_size - ENTRY_HEADER_SIZE  # the pending buffer holds the header's room
        pack = _pack_entry_header
        entry_id = first_entry_id
        added = 0
        try:
            pending = self._pending
            for data in datas[1:]:
                size = len(data)
                if size > limit:
                    raise OffloadInputError(
                        f"entry {ledger_id}:{entry_id + 1} of {size} bytes is too large to offload"
                    )
                if len(pending) > HEADER_SIZE and len(pending) + size > room:
                    self._pending_last = entry_id
                    await self._flush_block()
                    pending = self._pending
                    self._pending_first = entry_id + 1
                entry_id += 1
                pending += pack(size, entry_id)
                pending += data
                added += size
        finally:
            self._pending_last = entry_id
            self._ledger_bytes[ledger_id] += added
            self._last = Position(ledger_id, entry_id)

    def block_room(self, ledger_id: int) -> int:
        """Bytes of framed entries of ``ledger_id`` that fit in the block being filled without cutting
        it (a new block's room when the pending block holds another ledger or nothing)."""
        if ledger_id != self._pending_ledger:
            return self.max_block_size - HEADER_SIZE
        return self.max_block_size - self._filled()

    async def add_framed(
        self, ledger_id: int, first_entry_id: int, count: int, framed: bytearray, payload: int
    ) -> None:
        """``count`` consecutive entries of one ledger from ``first_entry_id``, already checked and
        framed (``frame_entry`` layout; the read-back worker makes them) holding ``payload`` data bytes.

        The block being filled is cut first unless they fit in it (``block_room``); a batch larger than
        a whole block makes one block of its own (the caller sizes batches to ``block_room``).
        """
        self._check_batch(ledger_id, first_entry_id, count, staged=False)
        if len(self._pending) > HEADER_SIZE and (
            ledger_id != self._pending_ledger or len(framed) > self.block_room(ledger_id)
        ):  # a block holds one ledger
            await self._flush_block()
        if len(self._pending) == HEADER_SIZE:
            self._pending_first = first_entry_id
        self._pending += framed
        self._added(ledger_id, first_entry_id, count, payload)

    def _check_batch(self, ledger_id: int, first_entry_id: int, count: int, *, staged: bool) -> None:
        self._check_open()
        if staged != self.stages:
            raise OffloadInputError(
                f"segment {self.uuid}: use {'add_staged' if self.stages else 'add_framed'} with this writer"
            )
        if count < 1 or first_entry_id < 0 or ledger_id < 0:
            raise OffloadInputError(
                f"entries {ledger_id}:{first_entry_id} (+{count}): "
                "need non-negative ids and at least one entry"
            )
        self._check_follows(ledger_id, first_entry_id)

    async def add_staged(self, ledger_id: int, first_entry_id: int, count: int, payload: int) -> None:
        """``count`` consecutive durable local entries of one ledger from ``first_entry_id`` holding
        ``payload`` data bytes, framed by the staging process into the block it holds for this writer
        (cut first unless they fit: as ``add_framed``)."""
        self._check_batch(ledger_id, first_entry_id, count, staged=True)
        framed = payload + count * ENTRY_HEADER_SIZE
        if self._staged_size > HEADER_SIZE and (
            ledger_id != self._pending_ledger or framed > self.block_room(ledger_id)
        ):  # a block holds one ledger
            await self._flush_block()
        if self._staged_size == HEADER_SIZE:
            self._pending_first = first_entry_id
        await self._stage(ledger_id, first_entry_id, count)
        self._staged_size += framed
        self._added(ledger_id, first_entry_id, count, payload)

    def _added(self, ledger_id: int, first_entry_id: int, count: int, payload: int) -> None:
        """Account a batch just put in the block being filled (framed here or staged elsewhere)."""
        self._pending_last = first_entry_id + count - 1
        self._pending_ledger = ledger_id
        self._ledger_bytes[ledger_id] = self._ledger_bytes.get(ledger_id, 0) + payload
        self._last = Position(ledger_id, self._pending_last)
        if self._first is None:
            self._first = Position(ledger_id, first_entry_id)

    async def _stage(self, ledger_id: int, first: int, count: int) -> None:
        staging = self._staging
        assert staging is not None
        if self._block is None:
            self._block = staging.new_block()
        try:
            await staging.stage(self._block, ledger_id, first, count)
        except StagedBlockLost:
            await self._restage()
            await staging.stage(self._block, ledger_id, first, count)

    async def _restage(self) -> None:
        """The staging process that held the block being filled was replaced: build it again there
        from the local files (its entries are durable and not yet offloaded)."""
        staging = self._staging
        assert staging is not None
        self._block = staging.new_block()
        if self._staged_size > HEADER_SIZE:
            assert self._pending_ledger is not None
            count = self._pending_last - self._pending_first + 1
            await staging.stage(self._block, self._pending_ledger, self._pending_first, count)

    async def _flush_block(self) -> None:
        if self._staging is not None:
            await self._write_staged_block()
            return
        assert self._pending_ledger is not None
        # Off the event loop: a block is megabytes, and the loop also serves the producers' appends.
        block = self._pending
        started = timeline.now()
        crc = await asyncio.to_thread(
            seal_block, self._pending_ledger, self._pending_first, block, self.max_block_size
        )
        timeline.span("seal", started)
        started = timeline.now()
        part_id = len(self._blocks) + 1
        if self._upload is None:
            self._upload = self.store.open_upload(data_key(self.uuid))
        try:
            await self._upload.write(block)
        except BaseException:
            await self.abort()
            raise
        timeline.span("upload", started)
        self._blocks.append(
            BlockDescription(
                ledger_id=self._pending_ledger,
                first_entry_id=self._pending_first,
                last_entry_id=self._pending_last,
                part_id=part_id,
                offset=self._offset,
                length=len(block),
                crc32=crc,
            )
        )
        self._offset += len(block)
        self._pending = bytearray(HEADER_SIZE)

    async def _write_staged_block(self) -> None:
        staging, ledger_id = self._staging, self._pending_ledger
        assert staging is not None and ledger_id is not None and self._block is not None
        started = timeline.now()
        if self._upload is None:
            self._upload = self.store.open_upload(data_key(self.uuid))
        upload = self._upload
        try:
            path = await asyncio.to_thread(upload.local_file)
            assert path is not None  # upload.local_files

            async def write(block: int) -> tuple[int, int]:
                return await staging.write_block(
                    block,
                    ledger_id=ledger_id,
                    first_entry_id=self._pending_first,
                    min_size=self.max_block_size,
                    path=path,
                    offset=self._offset,
                    slice_bytes=self.sync_slice_bytes,
                )

            try:
                crc, length = await write(self._block)
            except StagedBlockLost:
                await self._restage()
                crc, length = await write(self._block)
            upload.appended(length)
        except BaseException:
            await self.abort()
            raise
        timeline.span("upload", started)
        self._blocks.append(
            BlockDescription(
                ledger_id=ledger_id,
                first_entry_id=self._pending_first,
                last_entry_id=self._pending_last,
                part_id=len(self._blocks) + 1,
                offset=self._offset,
                length=length,
                crc32=crc,
            )
        )
        self._offset += length
        self._block = None
        self._staged_size = HEADER_SIZE

    async def finish(self, ledger_infos: Mapping[int, LedgerInfo] | None = None) -> SegmentDescription:
        """Upload the last block, complete the data object, then write the index.

        ``ledger_infos`` (optional) supplies what the managed ledger knows of each ledger (size,
        timestamp, properties), as Pulsar merges the ledger's LedgerInfo. ``entries`` is always the last
        entry written + 1 (what Pulsar writes for a ledger still open), and ``size`` defaults to the
        payload bytes written.
        """
        self._check_open()
        if self._last is None or self._first is None:
            raise OffloadInputError(f"segment {self.uuid} has no entries; there is nothing to offload")
        await self._flush_block()
        assert self._upload is not None
        try:
            data_length = await self._upload.complete()
            index_bytes = index_format.encode(data_length, self._ledger_indexes(ledger_infos or {}))
            await self.store.put(index_key(self.uuid), index_bytes)
        except BaseException:
            self._state = "failed"
            await self._delete_objects()
            raise
        self._state = "finished"
        return SegmentDescription(
            uuid=self.uuid,
            begin=self._first,
            end=self._last,
            blocks=tuple(self._blocks),
            data_length=data_length,
            index_length=len(index_bytes),
        )

    def _ledger_indexes(self, ledger_infos: Mapping[int, LedgerInfo]) -> list[LedgerIndex]:
        out: list[LedgerIndex] = []
        for ledger_id in sorted({b.ledger_id for b in self._blocks}):
            blocks = [b for b in self._blocks if b.ledger_id == ledger_id]
            given = ledger_infos.get(ledger_id)
            if given is not None and given.ledger_id != ledger_id:
                raise OffloadInputError(f"ledger_infos[{ledger_id}] describes ledger {given.ledger_id}")
            info = given or LedgerInfo(ledger_id)
            crcs = tuple(crc_property(b.part_id, b.crc32) for b in blocks)
            info = replace(
                info,
                # What this segment holds, not the ledger's total (which Pulsar copies): a segment may end
                # mid-ledger, and a reader must learn from the index that later entries are elsewhere.
                entries=blocks[-1].last_entry_id + 1,
                size=info.size if info.size is not None else self._ledger_bytes[ledger_id],
                properties=tuple(p for p in info.properties if not p[0].startswith(CRC_PROPERTY_PREFIX))
                + crcs,
            )
            entries = tuple(IndexEntry(ledger_id, b.first_entry_id, b.part_id, b.offset) for b in blocks)
            out.append(LedgerIndex(info, entries))
        return out

    async def abort(self) -> None:
        """Discard the segment: the upload in progress, or the objects of a failed finish."""
        if self._state == "finished":
            raise OffloadInputError(f"segment {self.uuid} is finished; delete it instead of aborting")
        self._state = "aborted"
        block, self._block = self._block, None
        if block is not None and self._staging is not None:
            with contextlib.suppress(Exception):
                await self._staging.drop_block(block)
        if self._upload is not None:
            upload, self._upload = self._upload, None
            await upload.abort()

    async def _delete_objects(self) -> None:
        for key in (index_key(self.uuid), data_key(self.uuid)):
            # Best effort: the error that made finish fail is the one the caller must see.
            with contextlib.suppress(Exception):
                await self.store.delete(key)
