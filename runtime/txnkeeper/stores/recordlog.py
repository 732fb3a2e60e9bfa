"""A log of records on one managed ledger: written through a buffered writer, recovered by replay,
deleted record by record through one cursor.

Both stores (transaction log, pending-ack log) are this plus their record semantics, so everything
format-related lives here once: the format-level rule (a level-1 runtime refuses a live batched entry
and cannot enable batching), replay of mixed batched/unbatched entries that skips records deleted at
batch-index level, batch-index-level deletes (PIP-160's ack set with every bit set but the index), the
live-entry census the downgrade verifier trusts, and LastBatchedLedger rollovers.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from txnkeeper.bufferedwriter.codec import EntryDecodeError, RecordCodec, is_batched
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import BufferedWriterMetrics
from txnkeeper.bufferedwriter.writer import (
    BufferedWriter,
    WritePosition,
    WriterState,
    pack_position,
)
from txnkeeper.ledger import (
    LedgerError,
    ManagedCursor,
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
    Position,
)
from txnkeeper.release import BATCHED_LEVEL, FormatLevel

R = TypeVar("R", bound=Message)

log = logging.getLogger(__name__)

# Entries read per ledger call during replay and census: large enough to amortize, small in memory.
_READ_CHUNK = 512
MAX_LISTED_BATCHED_POSITIONS = 20
# Minimum time between two cursor-persisting delete rounds (a rate limit, like Pulsar's markDeleteRate).
DELETE_ROUND_INTERVAL_S = 0.01
# Layout of a packed position (see bufferedwriter.writer.pack_position): ledger | entry | size | index.
_FIELD_BITS = 32
_FIELD_MASK = (1 << _FIELD_BITS) - 1
_ENTRY_SHIFT = 2 * _FIELD_BITS
# What deleted_checker knows of an entry: nothing of it deleted, all of it, some batch indexes.
_LIVE, _GONE, _SOME = 0, 1, 2


class FormatLevelError(RuntimeError):
    """A level-1 (unbatched-only) runtime met a live batched entry: it must not open this store."""

    def __init__(self, store: str, ledger_id: int, entry_id: int, format_level: int) -> None:
        super().__init__(
            f"store {store!r} holds a live batched entry at ledger {ledger_id} entry {entry_id}, but this"
            f" runtime runs at format level {format_level}, which reads unbatched entries only; run a"
            " release of format level 2 (2.x) until the batched entries are invalidated (disable batching,"
            " roll the ledger over, wait until the oldest live ledger passes the last batched one)"
        )
        self.store = store
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class BatchedWriteNotAllowedError(ValueError):
    """Batching was requested on a runtime whose format level cannot read batched entries."""


class StoreAlreadyOpenError(RuntimeError):
    """A second store was opened on a log this process already has open."""


# Logs open per factory (per data directory): one store per log, since each owns the log's writer.
_open_logs: weakref.WeakKeyDictionary[ManagedLedgerFactory, set[str]] = weakref.WeakKeyDictionary()


class ReplayError(RuntimeError):
    """A live entry of the log could not be decoded; the store refuses to open rather than skip it."""


@dataclass(frozen=True, slots=True)
class LiveRecord(Generic[R]):
    """A record that replay found live (not deleted), and where it is."""

    position: WritePosition
    record: R


@dataclass(slots=True)
class LiveEntryFormats:
    """Census of live entries by format (the admin API's liveEntries / liveBatchedPositions)."""

    batched: int = 0
    unbatched: int = 0
    batched_positions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "liveEntries": {"batched": self.batched, "unbatched": self.unbatched},
            "liveBatchedPositions": list(self.batched_positions),
        }


def check_format_level(format_level: int) -> None:
    if format_level not in set(FormatLevel):
        known = ", ".join(f"{int(level)} ({level.name})" for level in FormatLevel)
        raise ValueError(f"format level {format_level!r} is unknown; use one of {known}")


def check_batching_allowed(store: str, format_level: int, config: BatchedWriteConfig) -> None:
    if config.enabled and format_level < BATCHED_LEVEL:
        raise BatchedWriteNotAllowedError(
            f"cannot enable batched writes on store {store!r}: this runtime runs at format level"
            f" {format_level}, which writes unbatched entries only; upgrade every pod to a 2.x release"
            " first, then enable batching"
        )


class RecordLog(Generic[R]):
    """One managed ledger of ``R`` records, its buffered writer and its deletion cursor."""

    def __init__(
        self,
        store: str,
        ledger: ManagedLedger,
        cursor: ManagedCursor,
        codec: RecordCodec[R],
        *,
        config: BatchedWriteConfig,
        format_level: int,
        metrics: BufferedWriterMetrics | None,
    ) -> None:
        self.store = store
        self.format_level = format_level
        self._ledger = ledger
        self._cursor = cursor
        self._codec = codec
        self._metrics = metrics
        self.writer: BufferedWriter[R] = BufferedWriter(ledger, codec, config, metrics)
        self._delete_queue: list[tuple[list[int], asyncio.Future[None]]] = []
        self._deleter: asyncio.Task[None] | None = None
        self._last_round = float("-inf")
        self._trimmer: asyncio.Task[None] | None = None
        self._trim_wanted = False
        self._open_in: set[str] = set()

    @classmethod
    async def open(
        cls,
        factory: ManagedLedgerFactory,
        ledger_name: str,
        cursor_name: str,
        codec: RecordCodec[R],
        *,
        config: BatchedWriteConfig,
        format_level: int,
        metrics: Callable[[], BufferedWriterMetrics] | None = None,
        ledger_config: ManagedLedgerConfig | None = None,
    ) -> RecordLog[R]:
        """Open (or create) the ledger and cursor; check the settings against the format level.

        ``metrics`` is called for the writer's metrics only once the log is reserved for this store, so
        a refused open never touches the series of a store that is already open.
        """
        check_format_level(format_level)
        if not isinstance(config, BatchedWriteConfig):
            raise TypeError(f"config must be a BatchedWriteConfig, got {type(config).__name__}")
        check_batching_allowed(ledger_name, format_level, config)
        open_here = _open_logs.setdefault(factory, set())
        if ledger_name in open_here:
            raise StoreAlreadyOpenError(
                f"store {ledger_name!r} is already open in this process: two writers on one log would"
                " corrupt it; use the open store, or close it before opening it again"
            )
        open_here.add(ledger_name)
        writer_metrics = metrics() if metrics is not None else None
        try:
            ledger = await factory.open(ledger_name, ledger_config)
            try:
                cursor = await ledger.open_cursor(cursor_name)
            except BaseException:
                await ledger.close()
                raise
        except BaseException:
            open_here.discard(ledger_name)
            if writer_metrics is not None:
                writer_metrics.unregister()
            raise
        log = cls(
            ledger_name,
            ledger,
            cursor,
            codec,
            config=config,
            format_level=format_level,
            metrics=writer_metrics,
        )
        log._open_in = open_here
        return log

    # -- reading ------------------------------------------------------------------------------------

    async def replay(self, after: Position | None = None) -> list[LiveRecord[R]]:
        """Every live record in log order (only those after ``after`` if given); at format level 1 a
        live batched entry is refused."""
        live: list[LiveRecord[R]] = []
        cursor = self._cursor
        async for position, data in self._entries_after_mark_delete(after):
            if cursor.is_deleted(position):
                continue
            decoded = self._decode(position, data)
            lid, eid = position.ledger_id, position.entry_id
            if not decoded.batched:
                live.append(LiveRecord(WritePosition(lid, eid, 0, 0), decoded.records[0]))
                continue
            size = len(decoded.records)
            for index, record in enumerate(decoded.records):
                if not cursor.is_batch_index_deleted(position, index):
                    live.append(LiveRecord(WritePosition(lid, eid, size, index), record))
        return live

    def _decode(self, position: Position, data: bytes) -> Any:
        if is_batched(data) and self.format_level < BATCHED_LEVEL:
            raise FormatLevelError(self.store, position.ledger_id, position.entry_id, self.format_level)
        try:
            return self._codec.decode_entry(data)
        except EntryDecodeError as exc:
            raise ReplayError(
                f"store {self.store!r}: entry {position} cannot be read: {exc}; the store refuses to"
                " open rather than skip acknowledged data: look at the entry with `txnkeeper inspect"
                f" --log {self.store} --position {position}`, then run a release that reads it or"
                " restore the data directory"
            ) from exc

    async def records_at(self, packed: list[int]) -> list[R]:
        """The records at these packed positions (read entry by entry: for the rare rebuild of one
        transaction whose deletion a crash interrupted)."""
        records: list[R] = []
        for p in packed:
            entry = p >> _ENTRY_SHIFT
            position = Position(entry >> _FIELD_BITS, entry & _FIELD_MASK)
            decoded = self._decode(position, await self._ledger.read_entry(position))
            index = p & _FIELD_MASK
            if index >= len(decoded.records):
                raise ReplayError(
                    f"store {self.store!r}: entry {position} holds {len(decoded.records)} record(s), but"
                    f" a snapshot names record {index} of it; delete the snapshot file to replay the log"
                )
            records.append(decoded.records[index])
        return records

    def last_confirmed(self) -> Position | None:
        """The newest durable entry of the log (None: empty)."""
        return self._ledger.last_confirmed_entry()

    def touched_entries(self, entries: Iterable[int]) -> set[int]:
        """Those of ``entries`` (packed positions shifted right by 64: ledger and entry id) that some
        deletion on the cursor reaches (wholly or some batch index)."""
        cursor = self._cursor
        touched = set()
        for entry in entries:
            position = Position(entry >> _FIELD_BITS, entry & _FIELD_MASK)
            if cursor.is_deleted(position) or cursor.ack_set(position) is not None:
                touched.add(entry)
        return touched

    def deleted_checker(self) -> Callable[[int], bool]:
        """A function telling whether the record at a packed position is deleted on the cursor.

        Checked per entry once (a snapshot's records share few entries), per record only in an entry
        some of whose batch indexes are deleted.
        """
        cursor = self._cursor
        entries: dict[int, int] = {}  # entry -> _LIVE, _GONE or _SOME

        def deleted(packed: int) -> bool:
            entry = packed >> _ENTRY_SHIFT
            kind = entries.get(entry)
            if kind is None:
                position = Position(entry >> _FIELD_BITS, entry & _FIELD_MASK)
                if cursor.is_deleted(position):
                    kind = _GONE
                else:
                    kind = _LIVE if cursor.ack_set(position) is None else _SOME
                entries[entry] = kind
            if kind == _SOME:
                position = Position(entry >> _FIELD_BITS, entry & _FIELD_MASK)
                return cursor.is_batch_index_deleted(position, packed & _FIELD_MASK)
            return kind == _GONE

        return deleted

    async def live_entry_formats(self) -> LiveEntryFormats:
        """Count live entries (not deleted at entry level, some batch index left) by format, from disk."""
        census = LiveEntryFormats()
        async for position, data in self._entries_after_mark_delete():
            if self._cursor.is_deleted(position):
                continue
            if is_batched(data):
                census.batched += 1
                if len(census.batched_positions) < MAX_LISTED_BATCHED_POSITIONS:
                    census.batched_positions.append(f"{position.ledger_id}:{position.entry_id}")
            else:
                census.unbatched += 1
        return census

    async def _entries_after_mark_delete(
        self, after: Position | None = None
    ) -> AsyncIterator[tuple[Position, bytes]]:
        """Yield (position, data) of every durable entry after the cursor's mark-delete position
        (and after ``after``, if given)."""
        ids = self._ledger.ledger_ids()
        if not ids:
            return
        md = self._cursor.mark_delete_position()
        if md is None or md.ledger_id < ids[0]:
            start = Position(ids[0], 0)
        else:
            start = Position(md.ledger_id, md.entry_id + 1)
        if after is not None and after >= start:
            start = Position(after.ledger_id, after.entry_id + 1)
        last = self._ledger.last_confirmed_entry()
        if last is None:
            return
        while start <= last:
            if start.ledger_id not in ids:
                following = [i for i in ids if i > start.ledger_id]
                if not following:
                    return
                start = Position(following[0], 0)
                continue
            entries = await self._ledger.read_entries(start, _READ_CHUNK)
            if not entries:
                following = [i for i in ids if i > start.ledger_id]
                if not following:
                    return
                start = Position(following[0], 0)
                continue
            for entry in entries:
                yield entry.position, entry.data
            tail = entries[-1].position
            start = Position(tail.ledger_id, tail.entry_id + 1)

    # -- writing and deleting -----------------------------------------------------------------------

    async def delete(self, positions: Iterable[WritePosition]) -> None:
        """Delete records: plain entries whole, batched ones by batch index (the entry goes with its last).

        Deletes from concurrent callers are merged into rounds, one cursor call per entry per round:
        when thousands of transactions end at once their records share a few batched entries, and
        the cursor persists its whole state per call.
        """
        await self.delete_packed([pack_position(*p) for p in positions])

    async def delete_packed(self, packed: list[int]) -> None:
        """:meth:`delete` for positions as the writer reports them (``pack_position`` ints).

        The stores keep every position packed, so this is their path: nothing is built per record
        until the round groups them by entry. The caller's cancellation does not cancel the delete:
        the round skips a cancelled caller's future but still deletes its records.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._delete_queue.append((packed, done))
        if self._deleter is None or self._deleter.done():
            self._deleter = loop.create_task(self._delete_rounds())
        await done

    async def _delete_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        while self._delete_queue:
            # Rounds start at most every DELETE_ROUND_INTERVAL_S: the cursor rewrites its whole state
            # (two fsyncs) per round, so back-to-back rounds would take the disk from the appends.
            wait = self._last_round + DELETE_ROUND_INTERVAL_S - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_round = loop.time()
            round_, self._delete_queue = self._delete_queue, []
            plain: list[Position] = []
            # entry (packed ledger/entry) -> [batch size, indexes]
            batched: dict[int, tuple[int, list[int]]] = {}
            for positions, _ in round_:
                for packed in positions:
                    entry = packed >> _ENTRY_SHIFT
                    size = (packed >> _FIELD_BITS) & _FIELD_MASK
                    if size == 0:
                        plain.append(Position(entry >> _FIELD_BITS, entry & _FIELD_MASK))
                        continue
                    group = batched.get(entry)
                    if group is None:
                        group = batched[entry] = (size, [])
                    group[1].append(packed & _FIELD_MASK)
            before = self._cursor.mark_delete_position()
            # One cursor call, so one state write, for the whole round (a call per batched entry
            # wrote the state twice per round: the first call alone, then all the others).
            error: BaseException | None = None
            try:
                await self._cursor.delete_round(
                    plain,
                    [
                        (Position(entry >> _FIELD_BITS, entry & _FIELD_MASK), size, indexes)
                        for entry, (size, indexes) in batched.items()
                    ],
                )
            except Exception as exc:
                error = exc
            for _, done in round_:
                if done.done():
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)
            if self._cursor.mark_delete_position() != before:
                self._request_trim()

    def _request_trim(self) -> None:
        # Ledgers become trimmable only when the mark-delete position moves; one trimmer at a time,
        # re-run if more deletes arrived while it worked, so the last delete is never left untrimmed.
        self._trim_wanted = True
        if self._trimmer is None or self._trimmer.done():
            self._trimmer = asyncio.get_running_loop().create_task(self._trim_while_wanted())

    async def _trim_while_wanted(self) -> None:
        while self._trim_wanted:
            self._trim_wanted = False
            try:
                await self._ledger.trim()
            except LedgerError as exc:
                log.warning("store %s: trimming failed (%s); retried on the next delete", self.store, exc)
                return

    async def configure(self, config: BatchedWriteConfig) -> None:
        """Apply new settings to the writer (refused at format level 1 if batching is asked for)."""
        if not isinstance(config, BatchedWriteConfig):
            raise TypeError(f"config must be a BatchedWriteConfig, got {type(config).__name__}")
        check_batching_allowed(self.store, self.format_level, config)
        await self.writer.configure(config)

    async def rollover(self) -> int:
        """Flush, roll the ledger over, trim; return the largest ledger id before the rollover."""
        await self.writer.flush()
        ids = self._ledger.ledger_ids()
        last_batched = max([*ids, self._ledger.current_ledger_id()])
        await self._ledger.rollover()
        await self.trim()
        return last_batched

    async def trim(self) -> list[int]:
        """Delete ledgers wholly behind the cursor now."""
        return await self._ledger.trim()

    # -- inspection ---------------------------------------------------------------------------------

    @property
    def ledger_name(self) -> str:
        return self._ledger.name

    @property
    def config(self) -> BatchedWriteConfig:
        return self.writer.config

    def ledger_ids(self) -> list[int]:
        return self._ledger.ledger_ids()

    def current_ledger_id(self) -> int:
        return self._ledger.current_ledger_id()

    def batched_write_stat(self) -> dict[str, Any]:
        return self.writer.config.to_stat()

    def internal_stats(self) -> dict[str, Any]:
        return {
            "managedLedgerName": self._ledger.name,
            "managedLedgerInternalStats": self._ledger.internal_stats(),
        }

    # -- lifecycle ----------------------------------------------------------------------------------

    async def destroy(self) -> None:
        """Close, and remove the log's managed ledger for good (its owner is deleted)."""
        await self.close()
        await self._ledger.destroy()

    async def close(self, *, flush: bool = True) -> None:
        """Close writer then ledger; ``flush=False`` fails buffered records (what a crash loses)."""
        try:
            if flush and self.writer.state is WriterState.OPEN:
                await self.writer.flush()
            await self.writer.close()
            if self._deleter is not None and not self._deleter.done():
                await asyncio.wait({self._deleter})
            if self._trimmer is not None and not self._trimmer.done():  # a last round may have started one
                await asyncio.wait({self._trimmer})
        finally:
            if self._metrics is not None:
                self._metrics.unregister()
            try:
                await self._ledger.close()
            finally:
                self._open_in.discard(self.store)
