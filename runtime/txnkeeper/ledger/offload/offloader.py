"""The offloader of one managed ledger: decides what goes to the tier, records it, reads it back.

PIP-76 segments are recorded in the managed ledger's metadata (version 2): a segment is Assigned (its
uuid and first position persisted) before any byte is uploaded, and Offloaded (its last position and
time persisted) only after its index object is complete. So after a crash an Assigned segment is an
orphan: its objects are deleted and it is marked Failed, and a Failed segment is retried (from the same
first position, under a new uuid) before any new segment opens. A ledger's local file is deleted only
once Offloaded segments hold every entry and the deletion lag has passed; a segment's objects are
deleted only once every ledger it holds was trimmed.

Two modes (``offloadMode``): ``streaming`` (PIP-76, the default) keeps one segment open and feeds it
the managed ledger's durable entries as they are written, the open ledger included, closing it by size
(maxOffloadSegmentSizeInBytes, once minOffloadSegmentRolloverTimeInSeconds passed), by time
(maxOffloadSegmentRolloverTimeInSeconds) or on a manual offload; ``ledger`` (Pulsar's classic offload)
writes one segment per closed ledger. Streaming reads entries back from the local files, never from
the append path: producing never waits for offload, and a slow or absent store only grows the lag.
Switching modes on a live ledger closes the current segment; the next one begins in the new mode.

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
from functools import partial
from typing import Any, Protocol

from ..errors import CorruptEntryError
from ..metadata import LedgerInfo, ManagedLedgerMetadata, OffloadSegment
from ..position import Position
from . import timeline
from .blobstore import BlobStore
from .block import ENTRY_HEADER_SIZE
from .config import OffloadConfig
from .errors import OffloadConfigError, OffloadError, OffloadRangeError
from .filesystem import STREAMING_CATCH_UP_SLICE_BYTES, STREAMING_WRITE_SLICE_BYTES
from .reader import IndexCache, SegmentReader
from .stats import OffloaderStats
from .unreadable import UnreadableTier
from .writer import SegmentWriter, data_key, index_key

log = logging.getLogger(__name__)

GIB = 1024 * 1024 * 1024
READ_AHEAD_BLOCKS = 2
READ_PRIORITIES = ("tiered-storage-first", "bookkeeper-first")
MODES = ("streaming", "ledger")
_READ_BATCH = 256  # local entries read per executor call while uploading
# Streaming read-back batches (one read-back worker call each, at most the write buffer's worth): big
# enough that a call's overhead is small next to the work, small enough that a batch crosses the
# worker's pipe in a millisecond or two.
_FRAME_BATCH_BYTES = 1024 * 1024
# The background stream reads back in smaller batches, more often: bursts of several MiB every 100 ms
# (Pulsar's streamingOffloadLoop pace) kept the second core busy for tens of milliseconds, and
# group commits finishing meanwhile waited for a core (docs/performance.md, issue 13). A manual
# offload, which a caller waits for, keeps the big batches.
_STREAM_BATCH_BYTES = 256 * 1024
_FRAME_BATCH_ENTRIES = 16384
# Streaming wakes on appends; like Pulsar's streamingOffloadLoop (which waits 100 ms) it then lets
# entries gather for a moment, so one pass uploads many group commits instead of running once per
# commit; 20 ms, so that each pass is short (see _STREAM_BATCH_BYTES).
_STREAM_POLL_SECONDS = 0.02
_CLOSE_FINISH_SECONDS = 5.0
# More durable bytes than this not yet streamed: the stream is catching up, not keeping up (two
# default streaming blocks), and syncs the tier in larger slices (streaming_slice_bytes).
_CATCH_UP_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class OffloadPolicy:
    """When to offload and delete; Pulsar's key names and defaults where Pulsar has the setting.

    ``managedLedgerOffloadThresholdInBytes`` < 0 disables automatic offload (only ``offload()``
    uploads), as in Pulsar; with >= 0, closed ledgers are offloaded once the managed ledger holds more
    than that many bytes, and local files are deleted only while at least that many bytes of newer
    ledgers stay local. ``offloadRetryIntervalSeconds`` (ours) paces retries while the store is down.
    ``offloadMode`` (ours: ``streaming`` | ``ledger``) picks PIP-76 streaming or one segment per closed
    ledger; streaming runs while automatic offload is on (threshold >= 0). ``store_factory`` replaces
    the driver (tests inject faults through it).
    """

    config: OffloadConfig
    managedLedgerOffloadThresholdInBytes: int = -1
    managedLedgerOffloadDeletionLagMs: int = 4 * 3600 * 1000
    maxOffloadSegmentSizeInBytes: int = 1 * GIB
    managedLedgerDataReadPriority: str = "tiered-storage-first"
    offloadRetryIntervalSeconds: float = 30.0
    offloadMode: str = "streaming"
    maxOffloadSegmentRolloverTimeInSeconds: float = 600.0
    minOffloadSegmentRolloverTimeInSeconds: float = 0.0
    store_factory: Callable[[OffloadConfig], BlobStore] | None = None
    clock: Callable[[], float] | None = None  # wall clock for segment ages and lags (tests inject one)

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
        if self.offloadMode not in MODES:
            raise OffloadConfigError(
                f"offloadMode={self.offloadMode!r} is not supported; use one of {', '.join(MODES)}"
            )
        if not self.maxOffloadSegmentRolloverTimeInSeconds > 0:
            raise OffloadConfigError(
                "maxOffloadSegmentRolloverTimeInSeconds must be > 0 "
                f"(got {self.maxOffloadSegmentRolloverTimeInSeconds})"
            )
        low, high = self.minOffloadSegmentRolloverTimeInSeconds, self.maxOffloadSegmentRolloverTimeInSeconds
        if not 0 <= low <= high:
            raise OffloadConfigError(
                "minOffloadSegmentRolloverTimeInSeconds must be between 0 and "
                f"maxOffloadSegmentRolloverTimeInSeconds={self.maxOffloadSegmentRolloverTimeInSeconds} "
                f"(got {self.minOffloadSegmentRolloverTimeInSeconds})"
            )
        if not self.offloadRetryIntervalSeconds > 0:
            raise OffloadConfigError(
                f"offloadRetryIntervalSeconds must be > 0 (got {self.offloadRetryIntervalSeconds})"
            )

    @property
    def automatic(self) -> bool:
        return self.managedLedgerOffloadThresholdInBytes >= 0

    @property
    def streams(self) -> bool:
        """Whether the open ledger is streamed now (streaming mode with automatic offload on)."""
        return self.offloadMode == "streaming" and self.automatic

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

    def local_payload_bytes(self, ledger_id: int, first: int, count: int) -> int: ...  # durable, no I/O

    async def load_index(self, ledger_id: int) -> None: ...  # so that local_payload_bytes does no I/O

    def release_index(self, ledger_id: int) -> None: ...  # done reading it back

    async def read_local_framed(
        self, ledger_id: int, first: int, count: int, *, into: int | None = None
    ) -> bytearray: ...  # into: append to that block staged in the worker, return nothing

    def block_worker(self) -> BlockWorker | None: ...  # the worker that stages blocks (None: none)

    def confirmed_entries(self, ledger_id: int) -> int: ...  # durable entries (the open ledger too)

    def local_bytes(self, ledger_id: int) -> int: ...  # payload bytes in its local file (0: none)

    async def drop_local(self, ledger_id: int) -> None: ...


class BlockWorker(Protocol):
    """The process that stages blocks for ``read_local_framed(..., into=)`` and writes them
    (``readback.ReadBackWorker``); blocking calls."""

    def new_block(self) -> int: ...

    def write_block(
        self,
        block: int,
        *,
        ledger_id: int,
        first_entry_id: int,
        min_size: int,
        path: str,
        offset: int,
        slice_bytes: int | None,
    ) -> tuple[int, int]: ...

    def drop_block(self, block: int) -> None: ...


class _HostStaging:
    """A SegmentWriter's BlockStaging: entries staged through the host (which resolves them to the
    durable byte range of its files), blocks written by the host's worker, off the event loop."""

    def __init__(self, host: OffloadHost, worker: BlockWorker) -> None:
        self.host = host
        self.worker = worker

    def new_block(self) -> int:
        return self.worker.new_block()

    async def stage(self, block: int, ledger_id: int, first: int, count: int) -> None:
        await self.host.read_local_framed(ledger_id, first, count, into=block)

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
        return await asyncio.to_thread(
            partial(
                self.worker.write_block,
                block,
                ledger_id=ledger_id,
                first_entry_id=first_entry_id,
                min_size=min_size,
                path=path,
                offset=offset,
                slice_bytes=slice_bytes,
            )
        )

    async def drop_block(self, block: int) -> None:
        await asyncio.to_thread(self.worker.drop_block, block)


def _key(p: Position) -> tuple[int, int]:
    return (p.ledger_id, p.entry_id)


class _Stream:
    """The streaming segment being written: its writer, the next entry to feed, when it opened."""

    def __init__(self, writer: SegmentWriter, segment: OffloadSegment, opened_at: float) -> None:
        self.writer = writer
        self.segment = segment
        self.opened_at = opened_at
        self.next = segment.begin
        self.payload = 0


class Offloader:
    def __init__(
        self, host: OffloadHost, policy: OffloadPolicy, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.host = host
        self.policy = policy
        self.store = policy.open_store()
        self.stats = OffloaderStats()
        self._clock = policy.clock or clock
        # Read-ahead of two blocks: a consumer draining the tier finds the next block fetched and
        # CRC-checked on a worker thread while it handles the current one.
        self._cache = IndexCache(read_ahead_blocks=READ_AHEAD_BLOCKS)
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._recovered = False
        self._closing = False
        # False: close() leaves the streaming segment Assigned instead of finishing it (a shard move's
        # fence: the next owner's open deletes its objects and streams those entries again, so the
        # pause never waits for an upload; the pre-copy closed the segment just before).
        self.finish_on_close = True
        self._task: asyncio.Task[None] | None = None
        self._stream: _Stream | None = None
        self._retry_at = 0.0  # monotonic: automatic passes wait until then after a failure
        self.last_error: str | None = None
        # Tier data a read could not read, until a read of it succeeds (reported by status(), the
        # pod's metrics and its offload summary); re-read every retry interval (_probe_unreadable).
        self.unreadable = UnreadableTier(self._clock)
        self._probe_at = 0.0  # monotonic

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._wake.set()  # the first pass removes crash orphans and resumes pending work
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"offloader:{self.host.name}")

    def notify(self) -> None:
        """A ledger closed or was trimmed, or the policy or the clock moved: look for work."""
        self._wake.set()

    def notify_appended(self) -> None:
        """Entries became durable (called on the write path: only sets an event)."""
        if self.policy.streams:
            self._wake.set()

    def set_policy(self, policy: OffloadPolicy) -> None:
        """A live change (admin API). Where segments live cannot change under existing segments."""
        if policy.config.location() != self.policy.config.location():
            raise OffloadConfigError(
                "the offload driver and location (driver, bucket, region, endpoint, fileSystemURI) "
                f"cannot change on a live managed ledger ({self.host.name!r}): its segments live there; "
                "change them in the pod's config and restart, after the old segments were trimmed"
            )
        self.policy = policy
        self._retry_at = 0.0
        self._wake.set()

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if (
            self.finish_on_close
            and self._stream is not None
            and self._stream.writer.last is not None
            and self.last_error is None
        ):
            # A clean close finishes the streaming segment (bounded: the store looked healthy, but a
            # shutdown must not hang on it), so a restart does not upload it all again.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_FINISH_SECONDS), self._lock:
                    await self._close_stream()
        stream, self._stream = self._stream, None
        if stream is not None:  # left Assigned: the next open deletes its objects and retries it
            with contextlib.suppress(Exception):
                await stream.writer.abort()
        self._cache.close()  # no read-ahead outlives the store
        await self.store.close()

    async def _loop(self) -> None:
        # Python 3.11's wait_for can swallow a cancel that lands as the event is set (an append's
        # notify racing close): the flag ends the loop then, else close() would wait forever.
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._timeout())
            self._wake.clear()
            if time.monotonic() < self._retry_at:
                continue  # the store failed lately: appends must not turn into a retry storm
            with contextlib.suppress(OffloadError, OSError, CorruptEntryError):
                await self._pass(manual=False)
            if self.unreadable and time.monotonic() >= self._probe_at:
                self._probe_at = time.monotonic() + self.policy.offloadRetryIntervalSeconds
                await self._probe_unreadable()
            if self.policy.streams:
                await asyncio.sleep(_STREAM_POLL_SECONDS)

    def _timeout(self) -> float:
        interval = self.policy.offloadRetryIntervalSeconds
        if self.unreadable:
            interval = max(0.01, min(interval, self._probe_at - time.monotonic()))
        if time.monotonic() < self._retry_at:
            return max(0.01, min(interval, self._retry_at - time.monotonic()))
        stream = self._stream
        if stream is None:
            return interval
        left = stream.opened_at + self.policy.maxOffloadSegmentRolloverTimeInSeconds - self._clock()
        return max(0.05, min(interval, left))

    # --- the API admin verbs wrap ------------------------------------------------------------------

    async def offload(self) -> list[OffloadSegment]:
        """Manual offload: everything durable now (streaming mode: the open ledger too, and the current
        segment closes; ledger mode: every closed ledger), whatever the threshold; returns the segments
        Offloaded by this call. Store errors propagate (the segment is recorded Failed first)."""
        return await self._pass(manual=True)

    def segments(self) -> list[OffloadSegment]:
        return list(self.host.offload_metadata().segments)

    def status(self) -> dict[str, Any]:
        """Pulsar's OffloadProcessStatus shape (status, lastError, firstUnoffloadedMessage), plus the
        mode, the streaming segment, segment counts by status and the lag in bytes."""
        meta = self.host.offload_metadata()
        running = self._lock.locked()
        failed = any(s.status == "Failed" for s in meta.segments)
        first = self._first_unoffloaded(meta, include_open=self.policy.offloadMode == "streaming")
        unreadable = self.unreadable.failures()
        # Unreadable tier data is an error whatever a pass is doing: readers are refused until it is
        # repaired. Its newest failure comes first in lastError, an upload's error after it.
        errors = [unreadable[-1].describe()] if unreadable else []
        errors += [self.last_error] if self.last_error else []
        if unreadable:
            state = "ERROR"
        else:
            state = "RUNNING" if running else ("ERROR" if failed or self.last_error else "SUCCESS")
        return {
            "status": state,
            "lastError": "; ".join(errors),
            "firstUnoffloadedMessage": str(first) if first is not None else "",
            "mode": self.policy.offloadMode,
            "currentSegment": self._stream.segment.uuid if self._stream is not None else "",
            "streamedUntil": str(self.streamed_until() or ""),
            "segmentsByStatus": self.segment_counts(),
            "lagBytes": self.lag_bytes(),
            "unreadableSegments": [f.to_json() for f in unreadable],
            "tierReadErrors": self.stats.read_offload_error,
        }

    def streamed_until(self) -> Position | None:
        """The last entry fed to the streaming segment still open (None: no segment open)."""
        return self._stream.writer.last if self._stream is not None else None

    def segment_counts(self) -> dict[str, int]:
        counts = {"Assigned": 0, "Offloaded": 0, "Failed": 0}
        for s in self.host.offload_metadata().segments:
            counts[s.status] = counts.get(s.status, 0) + 1
        return counts

    def lag_bytes(self) -> int:
        """Local bytes no Offloaded segment holds yet (per ledger, in proportion to entries held)."""
        meta = self.host.offload_metadata()
        lag = 0.0
        for info in meta.ledgers:
            if info.offloaded:
                continue
            entries = self.host.confirmed_entries(info.ledger_id)
            size = self.host.local_bytes(info.ledger_id)
            if entries <= 0 or size <= 0:
                continue
            held = self._held_from_start(info.ledger_id, entries, meta)
            lag += size * (entries - held) / entries
        return int(lag)

    def fully_offloaded(self, info: LedgerInfo, meta: ManagedLedgerMetadata | None = None) -> bool:
        """Whether Offloaded segments hold every entry of this closed ledger."""
        return self._covered_until(info, meta or self.host.offload_metadata()) is not None

    async def read(self, ledger_id: int, first: int, count: int) -> list[bytes]:
        """Entries of a ledger from the tier, checked (CRC, structure) before anything is returned."""
        started = time.monotonic()
        try:
            out = await self._read(ledger_id, first, count)
        except (OffloadError, OSError):
            self.stats.read_offload_error += 1
            raise
        self.stats.read_ledger_latency.observe(time.monotonic() - started)
        self.stats.read_offload_bytes += sum(len(d) for d in out)
        return out

    async def _read(self, ledger_id: int, first: int, count: int) -> list[bytes]:
        meta = self.host.offload_metadata()
        out: list[bytes] = []
        entry = first
        last = first + count - 1
        while entry <= last:
            segment = next((s for s in meta.segments if s.holds(ledger_id, entry)), None)
            if segment is None or segment.end is None:
                missing = OffloadRangeError(
                    f"entry {ledger_id}:{entry} of managed ledger {self.host.name!r} is in no Offloaded "
                    "segment and its local file is gone; restore the ledger directory from a backup"
                )
                self.unreadable.failed("", ledger_id, entry, last, missing)
                raise missing
            upto = last if segment.end.ledger_id != ledger_id else min(last, segment.end.entry_id)
            reader = SegmentReader(self.store, segment.uuid, cache=self._cache)
            try:
                started = time.monotonic()
                await reader.index()
                self.stats.read_offload_index_latency.observe(time.monotonic() - started)
                started = time.monotonic()
                out.extend(await reader.read_entry_data(ledger_id, entry, upto))
                self.stats.read_offload_data_latency.observe(time.monotonic() - started)
            except (OffloadError, OSError) as exc:
                self.unreadable.failed(segment.uuid, ledger_id, entry, upto, exc)
                raise
            self.unreadable.read(segment.uuid, ledger_id, entry, upto)
            entry = upto + 1
        self.unreadable.read("", ledger_id, first, last)
        return out

    async def _probe_unreadable(self) -> None:
        """Read again what could not be read (every retry interval while anything is unreadable), so
        the status clears once the tier is repaired even if no reader comes back for those entries.
        Records of segments or ledgers trimmed since are dropped."""
        meta = self.host.offload_metadata()
        segments = {s.uuid for s in meta.segments}
        ledgers = {i.ledger_id for i in meta.ledgers}
        for failure in self.unreadable.failures():
            if (failure.segment and failure.segment not in segments) or failure.ledger_id not in ledgers:
                self.unreadable.forget(failure.segment)
                continue
            with contextlib.suppress(OffloadError, OSError):  # recorded again by the read itself
                await self.read(failure.ledger_id, failure.first, failure.last - failure.first + 1)

    # --- one pass -------------------------------------------------------------------------------------

    async def _pass(self, *, manual: bool) -> list[OffloadSegment]:
        async with self._lock:
            try:
                if not self._recovered:
                    await self._remove_orphans()
                    self._recovered = True
                await self._delete_trimmed_segments()
                done: list[OffloadSegment] = []
                policy = self.policy
                if self._stream is not None and not policy.streams and not manual:
                    done.append(await self._close_stream())  # mode switched or automatic offload off
                if policy.offloadMode == "streaming" and (manual or policy.streams):
                    done += await self._stream_pass(manual)
                else:
                    if self._stream is not None:
                        done.append(await self._close_stream())
                    while (begin := self._next_begin(manual)) is not None:
                        done.append(await self._offload_segment(begin))
                await self._delete_local_files()
            except (OffloadError, OSError, CorruptEntryError) as exc:
                # A corrupt local record is never uploaded: the segment is Failed and the error
                # (file, entry, offset, what to do) stays in status() until the operator acts.
                self.last_error = str(exc)
                self._retry_at = time.monotonic() + self.policy.offloadRetryIntervalSeconds
                log.warning("managed ledger %s: offload failed: %s", self.host.name, exc)
                raise
            self.last_error = None
            return done

    async def _update_metadata(self, change: Callable[[ManagedLedgerMetadata], None]) -> None:
        started = timeline.now()
        await self.host.update_offload_metadata(change)
        timeline.span("metadata", started)

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
            await self._update_metadata(fail)

    async def _delete_objects(self, uuid: str) -> None:
        try:
            await self.store.delete(index_key(uuid))  # the index first: a segment without one is unreadable
            await self.store.delete(data_key(uuid))
        except (OffloadError, OSError):
            self.stats.write_storage_error += 1
            raise
        self.stats.delete_offload_ops += 1
        self._cache.forget(self.store.location, uuid)
        self.unreadable.forget(uuid)

    async def _delete_trimmed_segments(self) -> None:
        meta = self.host.offload_metadata()
        live = [i.ledger_id for i in meta.ledgers]
        floor = live[0] if live else meta.next_ledger_id
        streaming = self._stream.segment.uuid if self._stream is not None else None
        gone = [s for s in meta.segments if (s.end or s.begin).ledger_id < floor and s.uuid != streaming]
        for segment in gone:
            await self._delete_objects(segment.uuid)
        uuids = {s.uuid for s in gone}

        def drop(meta: ManagedLedgerMetadata) -> None:
            meta.segments = [s for s in meta.segments if s.uuid not in uuids]

        if uuids:
            await self._update_metadata(drop)

    def _entries(self, info: LedgerInfo, include_open: bool) -> int:
        if info.closed:
            return info.entries
        return self.host.confirmed_entries(info.ledger_id) if include_open else 0

    def _first_unoffloaded(
        self, meta: ManagedLedgerMetadata, *, include_open: bool = False
    ) -> Position | None:
        """The first entry no Offloaded segment holds, of a closed ledger (or, ``include_open``, of
        the open ledger too); None: nothing to do."""
        done = [s.end for s in meta.segments if s.status == "Offloaded" and s.end is not None]
        after = max((_key(e) for e in done), default=(0, -1))
        for info in meta.ledgers:
            entries = self._entries(info, include_open)
            if info.offloaded or entries == 0:
                continue
            if info.ledger_id > after[0]:
                return Position(info.ledger_id, 0)
            if info.ledger_id == after[0] and after[1] + 1 < entries:
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

    async def _assign(self, begin: Position) -> OffloadSegment:
        segment = OffloadSegment(str(uuidlib.uuid4()), "Assigned", self._clock(), begin)

        def assign(meta: ManagedLedgerMetadata) -> None:
            # A Failed segment is retried now, from the same begin: it is replaced, not kept beside.
            meta.segments = [s for s in meta.segments if s.status != "Failed"] + [segment]

        await self._update_metadata(assign)
        return segment

    async def _fail(self, writer: SegmentWriter, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            await writer.abort()
        if isinstance(exc, Exception):
            self.stats.offload_error += 1
            if isinstance(exc, OffloadError | OSError):
                self.stats.write_storage_error += 1
            with contextlib.suppress(OSError):
                await self._update_metadata(lambda m: _set_status(m, writer.uuid, "Failed"))

    async def _complete(self, segment: OffloadSegment, writer: SegmentWriter) -> OffloadSegment:
        desc = await writer.finish()
        offloaded = OffloadSegment(
            segment.uuid,
            "Offloaded",
            segment.assigned_at,
            segment.begin,
            end=desc.end,
            offloaded_at=self._clock(),
            driver_metadata={"driver": self.policy.config.managedLedgerOffloadDriver},
        )

        def complete(meta: ManagedLedgerMetadata) -> None:
            meta.segments = [offloaded if s.uuid == segment.uuid else s for s in meta.segments]

        await self._update_metadata(complete)
        log.info(
            "managed ledger %s: offloaded %s..%s as segment %s",
            self.host.name,
            segment.begin,
            desc.end,
            segment.uuid,
        )
        return offloaded

    async def _offload_segment(self, begin: Position) -> OffloadSegment:
        segment = await self._assign(begin)
        writer = SegmentWriter(self.store, self.policy.config, uuid=segment.uuid)
        try:
            await self._upload(writer, begin, one_ledger=self.policy.offloadMode == "ledger")
            return await self._complete(segment, writer)
        except BaseException as exc:
            await self._fail(writer, exc)
            raise

    async def _upload(self, writer: SegmentWriter, begin: Position, *, one_ledger: bool) -> None:
        """Entries from ``begin`` through the last closed ledger, cut at maxOffloadSegmentSizeInBytes
        (``one_ledger``: at the end of ``begin``'s ledger, Pulsar's one segment per ledger)."""
        budget = self.policy.maxOffloadSegmentSizeInBytes
        written = 0
        for info in self.host.offload_metadata().ledgers:
            if info.ledger_id < begin.ledger_id or info.offloaded or info.entries == 0:
                continue
            if not info.closed or (one_ledger and info.ledger_id != begin.ledger_id):
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
                    self.stats.offload_bytes += len(data)
                    if written >= budget and not one_ledger:
                        return

    # --- streaming ------------------------------------------------------------------------------------

    async def _stream_pass(self, manual: bool) -> list[OffloadSegment]:
        done: list[OffloadSegment] = []
        while True:
            if self._stream is None:
                begin = self._first_unoffloaded(self.host.offload_metadata(), include_open=True)
                if begin is None:
                    return done
                segment = await self._assign(begin)
                worker = self.host.block_worker()
                writer = SegmentWriter(
                    self.store,
                    self.policy.config,
                    uuid=segment.uuid,
                    block_size=self.policy.config.streaming_block_size,
                    staging=_HostStaging(self.host, worker) if worker is not None else None,
                )
                self._stream = _Stream(writer, segment, self._clock())
            stream = self._stream
            try:
                full = await self._feed(stream, _FRAME_BATCH_BYTES if manual else _STREAM_BATCH_BYTES, manual)
            except BaseException as exc:
                self._stream = None
                await self._fail(stream.writer, exc)
                raise
            age = self._clock() - stream.opened_at
            if stream.writer.last is not None and (
                full or manual or age >= self.policy.maxOffloadSegmentRolloverTimeInSeconds
            ):
                done.append(await self._close_stream())
                if full:
                    continue  # the next segment opens at once
            return done

    async def _close_stream(self) -> OffloadSegment:
        stream = self._stream
        assert stream is not None
        self._stream = None
        started = timeline.now()
        try:
            return await self._complete(stream.segment, stream.writer)
        except BaseException as exc:
            await self._fail(stream.writer, exc)
            raise
        finally:
            timeline.span("close", started)

    async def _feed(self, stream: _Stream, batch_bytes: int, manual: bool) -> bool:
        """Feed durable local entries from ``stream.next`` on; True when the segment is full (size
        reached and old enough to close).

        Batches are planned from the ledger's offset index alone (``local_payload_bytes``: no I/O):
        at most ``batch_bytes`` of framing, within the room left in the block being filled, so a
        block is cut between batches, and ending at the entry that fills the segment. The host's
        read-back worker process reads, checks and frames each batch; with a filesystem tier it also
        keeps the blocks and writes them (this process then handles no entry bytes), else this loop
        appends the buffer it returns.
        """
        host = self.host
        while True:
            await host.load_index(stream.next.ledger_id)  # a closed ledger's dense index: planning
            meta = host.offload_metadata()
            pos = stream.next
            info = meta.find(pos.ledger_id)
            if info is None or info.offloaded:
                raise OffloadRangeError(
                    f"streaming segment {stream.segment.uuid} of managed ledger {host.name!r} reached "
                    f"{pos}, which was trimmed meanwhile; the segment is retried from the first live entry"
                )
            available = host.confirmed_entries(pos.ledger_id)
            if pos.entry_id >= available:
                later = [i for i in meta.ledgers if i.ledger_id > pos.ledger_id]
                if info.closed and later:
                    host.release_index(pos.ledger_id)
                    stream.next = Position(later[0].ledger_id, 0)
                    continue
                return False
            ledger_id, first = pos.ledger_id, pos.entry_id
            count, full = self._plan_batch(stream, ledger_id, first, available - first, batch_bytes)
            behind = host.local_payload_bytes(ledger_id, first, available - first) > _CATCH_UP_BYTES
            stream.writer.sync_slice_bytes = streaming_slice_bytes(manual=manual, behind=behind)
            payload = host.local_payload_bytes(ledger_id, first, count)
            if stream.writer.stages:  # the worker frames, builds and writes the blocks
                await stream.writer.add_staged(ledger_id, first, count, payload)
            else:
                framed = await host.read_local_framed(ledger_id, first, count)
                await stream.writer.add_framed(ledger_id, first, count, framed, payload)
            stream.payload += payload
            self.stats.offload_bytes += payload
            stream.next = Position(ledger_id, first + count)
            if full:
                return True

    def _plan_batch(
        self, stream: _Stream, ledger_id: int, first: int, available: int, batch_bytes: int
    ) -> tuple[int, bool]:
        """How many entries from ``first`` the next read-back batch takes, and whether the last one
        fills the segment."""
        policy = self.policy
        host = self.host
        limit = min(available, _FRAME_BATCH_ENTRIES)

        def payload(n: int) -> int:
            return host.local_payload_bytes(ledger_id, first, n) if n else 0

        def framed_fits(room: int) -> Callable[[int], bool]:
            return lambda n: payload(n) + n * ENTRY_HEADER_SIZE <= room

        writer = stream.writer
        batch = min(batch_bytes, policy.config.streaming_buffer_size)
        count = _largest(limit, framed_fits(min(writer.block_room(ledger_id), batch)))
        if count == 0:  # the block being filled has no room for the next entry: it is cut first
            count = max(1, _largest(limit, framed_fits(min(writer.max_block_size, batch))))
        segment_room = policy.maxOffloadSegmentSizeInBytes - stream.payload
        if (
            payload(count) >= segment_room
            and self._clock() - stream.opened_at >= policy.minOffloadSegmentRolloverTimeInSeconds
        ):  # the segment ends with the entry that fills it
            return _largest(count, lambda n: payload(n) < segment_room) + 1, True
        return count, False

    # --- coverage and local deletion ------------------------------------------------------------------

    def _held_from_start(self, ledger_id: int, entries: int, meta: ManagedLedgerMetadata) -> int:
        """How many of the ledger's first entries Offloaded segments hold, from entry 0 on."""
        entry = 0
        while entry < entries:
            segment = next((s for s in meta.segments if s.holds(ledger_id, entry)), None)
            if segment is None or segment.end is None:
                break
            entry = segment.end.entry_id + 1 if segment.end.ledger_id == ledger_id else entries
        return min(entry, entries)

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


def _largest(limit: int, fits: Callable[[int], bool]) -> int:
    """The largest n in 0..limit with ``fits(n)``, for ``fits`` true up to some n and false after."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _set_status(meta: ManagedLedgerMetadata, uuid: str, status: str) -> None:
    for s in meta.segments:
        if s.uuid == uuid:
            s.status = status


def streaming_slice_bytes(*, manual: bool, behind: bool) -> int | None:
    """The fdatasync slice of a streamed block (None: the driver's own). Keeping up with producers,
    small slices, each started in a gap between group commits, so that a commit never waits long
    behind one; catching up, somewhat larger ones so the stream gains on producers while still
    fitting between commits; a manual offload (nobody producing into it) in the driver's."""
    if manual:
        return None
    return STREAMING_CATCH_UP_SLICE_BYTES if behind else STREAMING_WRITE_SLICE_BYTES
