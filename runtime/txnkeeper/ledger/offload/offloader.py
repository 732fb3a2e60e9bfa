"""The offloader of one managed ledger: decides what goes to the tier, records it, reads it back.

PIP-76 segments are recorded in the managed ledger's metadata (version 2): a segment is Assigned (its
uuid and first position persisted) before any byte is uploaded, and Offloaded (its last position and
time persisted) only after its index object is complete. So after a crash an Assigned segment is an
orphan: its objects are deleted and it is marked Failed, and a Failed segment is retried (from the same
first position, under a new uuid) before any new segment opens. A ledger's local file is deleted only
once Offloaded segments hold every entry and the deletion lag has passed; a segment's objects are
deleted only once every ledger it holds was trimmed.

The managed ledger hands itself in as an ``OffloadHost`` (a narrow protocol): the offloader reads local
entries and changes metadata through it and never touches ledger files itself. The methods below
(``offload``, ``status``, ``segments``, ``policy``) are what admin verbs are meant to wrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..metadata import LedgerInfo, ManagedLedgerMetadata, OffloadSegment
from ..position import Position
from .blobstore import BlobStore
from .config import OffloadConfig
from .errors import OffloadConfigError, OffloadError, OffloadRangeError
from .reader import IndexCache, SegmentReader
from .writer import SegmentWriter, data_key, index_key

log = logging.getLogger(__name__)

GIB = 1024 * 1024 * 1024
READ_PRIORITIES = ("tiered-storage-first", "bookkeeper-first")
_READ_BATCH = 256  # local entries read per executor call while uploading


@dataclass(frozen=True)
class OffloadPolicy:
    """When to offload and delete; Pulsar's key names and defaults where Pulsar has the setting.

    ``managedLedgerOffloadThresholdInBytes`` < 0 disables automatic offload (only ``offload()``
    uploads), as in Pulsar; with >= 0, closed ledgers are offloaded once the managed ledger holds more
    than that many bytes, and local files are deleted only while at least that many bytes of newer
    ledgers stay local. ``offloadRetryIntervalSeconds`` (ours) paces retries while the store is down.
    ``store_factory`` replaces the driver (tests inject faults through it).
    """

    config: OffloadConfig
    managedLedgerOffloadThresholdInBytes: int = -1
    managedLedgerOffloadDeletionLagMs: int = 4 * 3600 * 1000
    maxOffloadSegmentSizeInBytes: int = 1 * GIB
    managedLedgerDataReadPriority: str = "tiered-storage-first"
    offloadRetryIntervalSeconds: float = 30.0
    store_factory: Callable[[OffloadConfig], BlobStore] | None = None

    def __post_init__(self) -> None:
        if self.managedLedgerOffloadDeletionLagMs < 0:
            raise OffloadConfigError(
                "managedLedgerOffloadDeletionLagMs must be >= 0 "
                f"(got {self.managedLedgerOffloadDeletionLagMs})"
            )
        if self.maxOffloadSegmentSizeInBytes < 1:
            raise OffloadConfigError(
                f"maxOffloadSegmentSizeInBytes must be >= 1 (got {self.maxOffloadSegmentSizeInBytes})"
            )
        if self.managedLedgerDataReadPriority not in READ_PRIORITIES:
            raise OffloadConfigError(
                f"managedLedgerDataReadPriority={self.managedLedgerDataReadPriority!r} is not supported; "
                f"use one of {', '.join(READ_PRIORITIES)}"
            )
        if not self.offloadRetryIntervalSeconds > 0:
            raise OffloadConfigError(
                f"offloadRetryIntervalSeconds must be > 0 (got {self.offloadRetryIntervalSeconds})"
            )

    def open_store(self) -> BlobStore:
        if self.store_factory is not None:
            return self.store_factory(self.config)
        return open_blob_store(self.config)


def open_blob_store(config: OffloadConfig) -> BlobStore:
    """The configured driver's store (``s3`` imported only here: boto3 is an optional extra)."""
    if config.is_s3:
        from .s3 import S3BlobStore

        return S3BlobStore(
            config.managedLedgerOffloadBucket,
            endpoint=config.managedLedgerOffloadServiceEndpoint or None,
            region=config.managedLedgerOffloadRegion or None,
            read_buffer_size=config.managedLedgerOffloadReadBufferSizeInBytes,
        )
    from .filesystem import FileSystemBlobStore

    return FileSystemBlobStore(config.fileSystemURI)


class OffloadHost(Protocol):
    """What the offloader needs from its managed ledger."""

    name: str

    def offload_metadata(self) -> ManagedLedgerMetadata: ...

    async def update_offload_metadata(self, change: Callable[[ManagedLedgerMetadata], None]) -> None: ...

    async def read_local(self, ledger_id: int, first: int, count: int) -> list[bytes]: ...

    async def drop_local(self, ledger_id: int) -> None: ...


def _key(p: Position) -> tuple[int, int]:
    return (p.ledger_id, p.entry_id)


class Offloader:
    def __init__(
        self, host: OffloadHost, policy: OffloadPolicy, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.host = host
        self.policy = policy
        self.store = policy.open_store()
        self._clock = clock
        self._cache = IndexCache()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._recovered = False
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._wake.set()  # the first pass removes crash orphans and resumes pending work
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"offloader:{self.host.name}")

    def notify(self) -> None:
        """A ledger closed or was trimmed: look for work."""
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.store.close()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.policy.offloadRetryIntervalSeconds)
            self._wake.clear()
            with contextlib.suppress(OffloadError, OSError):
                await self._pass(manual=False)

    # --- the API admin verbs wrap ------------------------------------------------------------------

    async def offload(self) -> list[OffloadSegment]:
        """Manual offload: every closed ledger now, whatever the threshold; returns the segments
        Offloaded by this call. Store errors propagate (the segment is recorded Failed first)."""
        return await self._pass(manual=True)

    def segments(self) -> list[OffloadSegment]:
        return list(self.host.offload_metadata().segments)

    def status(self) -> dict[str, Any]:
        """Pulsar's OffloadProcessStatus shape: status, lastError, firstUnoffloadedMessage."""
        meta = self.host.offload_metadata()
        running = self._lock.locked()
        failed = any(s.status == "Failed" for s in meta.segments)
        first = self._first_unoffloaded(meta)
        return {
            "status": "RUNNING" if running else ("ERROR" if failed or self.last_error else "SUCCESS"),
            "lastError": self.last_error or "",
            "firstUnoffloadedMessage": str(first) if first is not None else "",
        }

    def fully_offloaded(self, info: LedgerInfo, meta: ManagedLedgerMetadata | None = None) -> bool:
        """Whether Offloaded segments hold every entry of this closed ledger."""
        return self._covered_until(info, meta or self.host.offload_metadata()) is not None

    async def read(self, ledger_id: int, first: int, count: int) -> list[bytes]:
        """Entries of a ledger from the tier, checked (CRC, structure) before anything is returned."""
        meta = self.host.offload_metadata()
        out: list[bytes] = []
        entry = first
        last = first + count - 1
        while entry <= last:
            segment = next((s for s in meta.segments if s.holds(ledger_id, entry)), None)
            if segment is None or segment.end is None:
                raise OffloadRangeError(
                    f"entry {ledger_id}:{entry} of managed ledger {self.host.name!r} is in no Offloaded "
                    "segment and its local file is gone; restore the ledger directory from a backup"
                )
            upto = last if segment.end.ledger_id != ledger_id else min(last, segment.end.entry_id)
            reader = SegmentReader(self.store, segment.uuid, cache=self._cache)
            entries = await reader.read_entries(ledger_id, entry, upto)
            out.extend(e.data for e in entries)
            entry = upto + 1
        return out

    # --- one pass -------------------------------------------------------------------------------------

    async def _pass(self, *, manual: bool) -> list[OffloadSegment]:
        async with self._lock:
            try:
                if not self._recovered:
                    await self._remove_orphans()
                    self._recovered = True
                await self._delete_trimmed_segments()
                done = []
                while (begin := self._next_begin(manual)) is not None:
                    done.append(await self._offload_segment(begin))
                await self._delete_local_files()
            except (OffloadError, OSError) as exc:
                self.last_error = str(exc)
                log.warning("managed ledger %s: offload failed: %s", self.host.name, exc)
                raise
            self.last_error = None
            return done

    async def _remove_orphans(self) -> None:
        """Assigned segments at open were being uploaded when the process died: delete, mark Failed."""
        orphans = [s.uuid for s in self.host.offload_metadata().segments if s.status == "Assigned"]
        for uuid in orphans:
            await self._delete_objects(uuid)

        def fail(meta: ManagedLedgerMetadata) -> None:
            for s in meta.segments:
                if s.uuid in orphans:
                    s.status = "Failed"

        if orphans:
            await self.host.update_offload_metadata(fail)

    async def _delete_objects(self, uuid: str) -> None:
        await self.store.delete(index_key(uuid))  # the index first: a segment without one is unreadable
        await self.store.delete(data_key(uuid))
        self._cache.forget(self.store.location, uuid)

    async def _delete_trimmed_segments(self) -> None:
        meta = self.host.offload_metadata()
        live = [i.ledger_id for i in meta.ledgers]
        floor = live[0] if live else meta.next_ledger_id
        gone = [s for s in meta.segments if (s.end or s.begin).ledger_id < floor]
        for segment in gone:
            await self._delete_objects(segment.uuid)
        uuids = {s.uuid for s in gone}

        def drop(meta: ManagedLedgerMetadata) -> None:
            meta.segments = [s for s in meta.segments if s.uuid not in uuids]

        if uuids:
            await self.host.update_offload_metadata(drop)

    def _first_unoffloaded(self, meta: ManagedLedgerMetadata) -> Position | None:
        """The first entry of a closed ledger no Offloaded segment holds (None: nothing to do)."""
        done = [s.end for s in meta.segments if s.status == "Offloaded" and s.end is not None]
        after = max((_key(e) for e in done), default=(0, -1))
        for info in meta.ledgers:
            if not info.closed or info.offloaded or info.entries == 0:
                continue
            if info.ledger_id > after[0]:
                return Position(info.ledger_id, 0)
            if info.ledger_id == after[0] and after[1] + 1 < info.entries:
                return Position(info.ledger_id, after[1] + 1)
        return None

    def _next_begin(self, manual: bool) -> Position | None:
        meta = self.host.offload_metadata()
        first = self._first_unoffloaded(meta)
        if first is None:
            return None
        if not manual:
            threshold = self.policy.managedLedgerOffloadThresholdInBytes
            if threshold < 0 or sum(i.size for i in meta.ledgers if not i.offloaded) <= threshold:
                return None
        return first

    async def _offload_segment(self, begin: Position) -> OffloadSegment:
        uuid = str(uuidlib.uuid4())
        segment = OffloadSegment(uuid, "Assigned", self._clock(), begin)

        def assign(meta: ManagedLedgerMetadata) -> None:
            # A Failed segment is retried now, from the same begin: it is replaced, not kept beside.
            meta.segments = [s for s in meta.segments if s.status != "Failed"] + [segment]

        await self.host.update_offload_metadata(assign)
        writer = SegmentWriter(self.store, self.policy.config, uuid=uuid)
        try:
            await self._upload(writer, begin)
            desc = await writer.finish()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await writer.abort()
            if isinstance(exc, Exception):
                with contextlib.suppress(OSError):
                    await self.host.update_offload_metadata(lambda m: _set_status(m, uuid, "Failed"))
            raise
        offloaded = OffloadSegment(
            uuid,
            "Offloaded",
            segment.assigned_at,
            begin,
            end=desc.end,
            offloaded_at=self._clock(),
            driver_metadata={"driver": self.policy.config.managedLedgerOffloadDriver},
        )

        def complete(meta: ManagedLedgerMetadata) -> None:
            meta.segments = [offloaded if s.uuid == uuid else s for s in meta.segments]

        await self.host.update_offload_metadata(complete)
        log.info("managed ledger %s: offloaded %s..%s as segment %s", self.host.name, begin, desc.end, uuid)
        return offloaded

    async def _upload(self, writer: SegmentWriter, begin: Position) -> None:
        """Entries from ``begin`` through the last closed ledger, cut at maxOffloadSegmentSizeInBytes."""
        budget = self.policy.maxOffloadSegmentSizeInBytes
        written = 0
        for info in self.host.offload_metadata().ledgers:
            if info.ledger_id < begin.ledger_id or info.offloaded or info.entries == 0:
                continue
            if not info.closed:
                break
            entry = begin.entry_id if info.ledger_id == begin.ledger_id else 0
            while entry < info.entries:
                batch = await self.host.read_local(
                    info.ledger_id, entry, min(_READ_BATCH, info.entries - entry)
                )
                for data in batch:
                    await writer.add_entry(info.ledger_id, entry, data)
                    entry += 1
                    written += len(data)
                    if written >= budget:
                        return

    def _covered_until(self, info: LedgerInfo, meta: ManagedLedgerMetadata) -> float | None:
        """The latest offloadedAt of the segments holding all of the ledger (None: not all held)."""
        if not info.closed or info.entries == 0:
            return None
        entry = 0
        latest = 0.0
        while entry < info.entries:
            segment = next((s for s in meta.segments if s.holds(info.ledger_id, entry)), None)
            if segment is None or segment.end is None or segment.offloaded_at is None:
                return None
            latest = max(latest, segment.offloaded_at)
            entry = segment.end.entry_id + 1 if segment.end.ledger_id == info.ledger_id else info.entries
        return latest

    async def _delete_local_files(self) -> None:
        meta = self.host.offload_metadata()
        lag = self.policy.managedLedgerOffloadDeletionLagMs / 1000.0
        threshold = self.policy.managedLedgerOffloadThresholdInBytes
        now = self._clock()
        for n, info in enumerate(meta.ledgers):
            if info.offloaded:
                continue
            offloaded_at = self._covered_until(info, meta)
            if offloaded_at is None or now < offloaded_at + lag:
                continue
            newer_local = sum(i.size for i in meta.ledgers[n + 1 :] if not i.offloaded)
            if threshold >= 0 and newer_local < threshold:
                break  # keep the newest threshold bytes local
            await self.host.drop_local(info.ledger_id)


def _set_status(meta: ManagedLedgerMetadata, uuid: str, status: str) -> None:
    for s in meta.segments:
        if s.uuid == uuid:
            s.status = status
