"""The managed ledger: a named log of entries on a directory, as a sequence of ledgers.

Appends get their position when queued and resolve after the group commit made them durable. Rollover
(by entries, bytes, age, or on demand) reserves the next ledger id at once and runs as an ordered step of
the writer, so appends never wait for it and never overtake it. Cursors and trimming live here because
trimming needs every cursor.

Write failures: the failed group's appends (and any queued behind them for the same ledger) fail with
LedgerWriteError; the partial write is cut, that ledger is closed at its last durable entry, and the next
append (or rollover()) starts a new ledger, so the managed ledger recovers by itself once the disk has
room again. Only if cutting the partial write also fails does it go to the failed state ("WriteFailed"):
every append then fails until it is closed and reopened (reopening cuts the partial write as a torn tail).

Offload (opt-in, ``config.offload``): an Offloader task streams durable entries (or, in ``ledger``
mode, closed ledgers) to a blob store and records segments in the metadata; a ledger whose local file
it deleted is read from the tier. The
ledger only hosts it (metadata changes, local reads, local deletes): see ``offload/offloader.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from .config import ManagedLedgerConfig
from .cursor import RESET_ACCEPTANCE_SUFFIX, CursorState, ManagedCursor
from .entry_format import FILE_HEADER, MAX_ENTRY_SIZE, RECORD_HEADER_SIZE, record_header
from .errors import LedgerClosedError, LedgerWriteError, MissingCursorError, NoSuchEntryError
from .fileio import FileIO
from .ledger_file import GroupWriteFailed, LedgerFile
from .lock import release_directory_lock
from .metadata import METADATA_FILE, LedgerInfo, ManagedLedgerMetadata, MetadataStore
from .names import encode_name
from .offload.offloader import Offloader, OffloadPolicy
from .position import Entry, Position
from .readback import ReadBackWorker, shared_worker
from .recovery import CURSORS_DIR, LEDGERS_DIR, Recovered, recover
from .retention import LedgerFacts, Retention, ledgers_to_trim
from .stats import LedgerStat, internal_stats
from .watermark import WatermarkKeeper
from .writer import GroupCommitWriter

log = logging.getLogger(__name__)


class _State(Enum):
    OPEN = "LedgerOpened"
    FAILED = "WriteFailed"
    CLOSING = "Closing"
    CLOSED = "Closed"


def _consume_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # an automatic rollover's failure is reported to the appends behind it


def _check_position(position: object) -> None:
    if not isinstance(position, Position):
        raise TypeError(
            f"expected a txnkeeper.ledger.Position, got {type(position).__name__} {position!r}; "
            "use Position(ledger_id, entry_id) or Position.parse('ledgerId:entryId')"
        )


class ManagedLedger:
    """See docs/contracts.md section 1. Create through ManagedLedgerFactory.open()."""

    def __init__(
        self,
        name: str,
        directory: Path,
        *,
        config: ManagedLedgerConfig,
        io: FileIO,
        executor: Executor,
        recovered: Recovered,
        on_close: Callable[[ManagedLedger], None],
    ) -> None:
        self.name = name
        self.directory = directory
        self.config = config
        self._io = io
        self._executor = executor
        self._on_close = on_close
        self._lock_fd = recovered.lock_fd
        self._ledgers_dir = directory / LEDGERS_DIR
        self._cursors_dir = directory / CURSORS_DIR
        self._store = MetadataStore(directory / METADATA_FILE, recovered.meta, io, executor)
        self._files = recovered.files
        self._indexed: LedgerFile | None = None  # the closed ledger whose dense index load_index loaded
        self._cur = recovered.current
        self._next_ledger_id = recovered.meta.next_ledger_id
        self._last_created = time.time()
        self._max_entries = config.max_entries_per_ledger
        self._max_bytes = config.max_size_per_ledger_bytes
        self._max_age = config.max_ledger_age_seconds
        self._state = _State.OPEN
        self._failure: LedgerWriteError | None = None
        self._entries_added = 0
        self._rollovers_in_flight = 0
        self._reads_in_flight = 0
        self._reads_done = asyncio.Event()
        self._reads_done.set()
        self._trim_lock = asyncio.Lock()
        self._cursor_lock = asyncio.Lock()
        self._closed_event = asyncio.Event()
        self.torn_tails_cut = recovered.torn_tails
        self._watermark = WatermarkKeeper(recovered.watermark, executor, name=name, enabled=config.fsync)
        self._writer = GroupCommitWriter(
            executor,
            group_commit=config.group_commit,
            sync=config.fsync,
            on_failure=self._on_write_failure,
            on_durable=self._count_added,
            mark_written=self._watermark.mark_written,
            inline_under_s=None if config.inline_sync_under_ms is None else config.inline_sync_under_ms / 1e3,
        )
        self._cursors: dict[str, ManagedCursor] = {
            cursor_name: ManagedCursor(cursor_name, path, state=state, layout=self, io=io, executor=executor)
            for cursor_name, (path, state) in recovered.cursors.items()
        }
        self._age_timer: asyncio.Task[None] | None = None
        if self._max_age is not None:
            self._age_timer = asyncio.get_running_loop().create_task(
                self._age_rollover_loop(self._max_age), name=f"ledger-age-rollover:{name}"
            )
        self.offloader: Offloader | None = None
        self._offload_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"offload-read:{name}")
        if config.offload is not None:
            self._start_offloader(config.offload)

    @classmethod
    async def open(
        cls,
        name: str,
        root: Path,
        *,
        config: ManagedLedgerConfig,
        io: FileIO,
        executor: Executor,
        on_close: Callable[[ManagedLedger], None],
    ) -> ManagedLedger:
        directory = root / encode_name(name)
        loop = asyncio.get_running_loop()
        recovered = await loop.run_in_executor(executor, recover, name, directory, io)
        return cls(
            name,
            directory,
            config=config,
            io=io,
            executor=executor,
            recovered=recovered,
            on_close=on_close,
        )

    # --- appends ------------------------------------------------------------------------------------

    def add_entry(self, data: bytes | bytearray | memoryview) -> asyncio.Future[Position]:
        """Append ``data`` now; the future resolves with its position once it is durable (fsync'd).

        A plain function returning the group commit's own future, not a coroutine: every produced
        message, marker and batch is one append, and a coroutine (plus the task callers wrapped it in)
        was a measurable part of a store pod's CPU. Refusals (closed or failed ledger, oversized
        entry, wrong type) raise at the call.
        """
        cur, entry_id, offset, data = self._assign(data)
        return self._writer.append(
            cur, record_header(entry_id, data), data, offset, Position(cur.ledger_id, entry_id)
        )

    def add_entry_notify(
        self,
        data: bytes | bytearray | memoryview,
        notify: Callable[[Position | None, BaseException | None], None],
    ) -> None:
        """``add_entry`` settled by a callback: ``notify(position, None)`` once durable, or
        ``notify(None, error)`` if the write failed, called in the step that confirms the write (a
        future's callbacks run a loop turn later). Refusals raise at the call, as for add_entry."""
        cur, entry_id, offset, payload = self._assign(data)
        self._writer.append_notify(
            cur,
            record_header(entry_id, payload),
            payload,
            offset,
            Position(cur.ledger_id, entry_id),
            notify=notify,
        )

    def _assign(self, data: bytes | bytearray | memoryview) -> tuple[LedgerFile, int, int, bytes]:
        # The checks and the entry id/offset assignment of one append (rolling over first if due).
        if self._state is not _State.OPEN:
            self._raise_not_writable()
        if type(data) is not bytes:
            data = self._coerce(data)
        size = len(data)
        if size > MAX_ENTRY_SIZE:
            raise ValueError(
                f"entry of {size} bytes is larger than the maximum {MAX_ENTRY_SIZE}; "
                "split it before appending"
            )
        cur = self._cur
        if (
            cur.assigned_entries >= self._max_entries
            or cur.assigned_bytes >= self._max_bytes
            or cur.broken is not None
            or (
                self._max_age is not None
                and cur.assigned_entries
                and time.monotonic() - cur.created_mono >= self._max_age
            )
        ):
            self._start_rollover()
            cur = self._cur
        entry_id = cur.assigned_entries
        cur.assigned_entries = entry_id + 1
        offset = cur.assigned_end
        cur.assigned_end = offset + RECORD_HEADER_SIZE + size
        cur.assigned_bytes += size
        return cur, entry_id, offset, data

    def start_queued_writes(self) -> None:
        """Start the write of what is queued now, in this callback, if the ledger is not writing.

        For a caller that has just appended everything one loop turn produced (the buffered writer's
        end-of-turn flush): the group-commit task would otherwise submit it a loop turn later. While
        a write runs this does nothing, so concurrent appends keep sharing the next write and fsync.
        """
        if self._state is _State.OPEN:
            self._writer.start_now()

    def add_entries(self, datas: Sequence[bytes]) -> list[asyncio.Future[Position]]:
        """Append ``datas`` as consecutive entries of one ledger; one future per entry, as add_entry.

        For records whose positions must be computable from the first one (a single-routing-key
        block: its events' MessageIds are contiguous entry ids). A rollover that is due, or that the
        group would make due by crossing the entry or size limit, runs before the first of them, never
        between them; a group larger than a whole ledger's limits is placed whole in a fresh ledger,
        which then exceeds them (the next append rolls over). Refusals (an oversized or mistyped entry,
        a closed ledger) raise before anything is queued.
        """
        if self._state is not _State.OPEN:
            self._raise_not_writable()
        if not datas:
            raise ValueError("add_entries needs at least one entry")
        payloads = [data if type(data) is bytes else self._coerce(data) for data in datas]
        total = 0
        for data in payloads:
            if len(data) > MAX_ENTRY_SIZE:
                raise ValueError(
                    f"entry of {len(data)} bytes is larger than the maximum {MAX_ENTRY_SIZE}; "
                    "split it before appending"
                )
            total += len(data)
        cur = self._cur
        if cur.broken is not None or (
            cur.assigned_entries  # an empty ledger takes the group whole, whatever its size
            and (
                cur.assigned_entries + len(payloads) > self._max_entries
                or cur.assigned_bytes + total > self._max_bytes
                or (self._max_age is not None and time.monotonic() - cur.created_mono >= self._max_age)
            )
        ):
            self._start_rollover()
            cur = self._cur
        futures: list[asyncio.Future[Position]] = []
        append = self._writer.append
        for data in payloads:
            entry_id = cur.assigned_entries
            cur.assigned_entries = entry_id + 1
            offset = cur.assigned_end
            cur.assigned_end = offset + RECORD_HEADER_SIZE + len(data)
            cur.assigned_bytes += len(data)
            futures.append(
                append(cur, record_header(entry_id, data), data, offset, Position(cur.ledger_id, entry_id))
            )
        return futures

    def _count_added(self, ledger: LedgerFile, entries: int) -> None:
        self._entries_added += entries
        self._watermark.note(ledger.ledger_id, ledger.entries - 1)
        if self.offloader is not None:
            self.offloader.notify_appended()  # streaming reads them back later, off this path

    @staticmethod
    def _coerce(data: object) -> bytes:
        if isinstance(data, bytearray | memoryview):
            return bytes(data)  # a private copy: the caller may reuse its buffer before the write
        raise TypeError(f"entry data must be bytes, bytearray or memoryview, not {type(data).__name__}")

    def _raise_not_writable(self) -> None:
        if self._state is _State.FAILED and self._failure is not None:
            raise LedgerWriteError(str(self._failure))
        raise LedgerClosedError(f"managed ledger {self.name!r} is {self._state.name.lower()}; reopen it")

    # --- rollover -------------------------------------------------------------------------------------

    async def rollover(self) -> int:
        """Close the current ledger and start a new one; returns the new ledger's id."""
        if self._state is not _State.OPEN:
            self._raise_not_writable()
        result: int = await self._start_rollover()
        return result

    def _start_rollover(self) -> asyncio.Future[int]:
        old = self._cur
        new = LedgerFile(self._io, self._ledgers_dir, self._next_ledger_id)
        self._next_ledger_id += 1
        self._cur = new
        self._rollovers_in_flight += 1
        future: asyncio.Future[int] = self._writer.barrier(lambda: self._complete_rollover(old, new))
        future.add_done_callback(_consume_exception)
        return future

    async def _complete_rollover(self, old: LedgerFile, new: LedgerFile) -> int:
        """Runs in the writer's order: every append to ``old`` has completed (or failed) by now."""
        loop = asyncio.get_running_loop()

        def add_ledger(meta: ManagedLedgerMetadata) -> None:
            for info in meta.ledgers:
                if not info.closed:
                    self._close_info(info)
            meta.ledgers.append(
                LedgerInfo(new.ledger_id, file_bytes=FILE_HEADER.size, created_at=time.time())
            )
            meta.next_ledger_id = self._next_ledger_id

        try:
            try:
                await self._store.update(add_ledger)
            except OSError as exc:
                raise self._rollover_failed(new, "could not record it in the metadata", exc) from exc
            self._files[new.ledger_id] = new
            try:
                await loop.run_in_executor(self._executor, new.create)
            except OSError as exc:
                raise self._rollover_failed(new, "could not create its file", exc) from exc
            if old.ledger_id in self._files:
                old.close_for_writes()
                old.seal_index()  # in the writer's order: every append to it is confirmed
            self._last_created = time.time()
            if self.offloader is not None:
                self.offloader.notify()
            return new.ledger_id
        except LedgerWriteError:
            raise
        except Exception as exc:  # never let appends queued for ``new`` write to a file that is not there
            error = LedgerWriteError(f"rollover of managed ledger {self.name!r} failed unexpectedly: {exc!r}")
            new.broken = error
            raise error from exc
        finally:
            self._rollovers_in_flight -= 1

    def _close_info(self, info: LedgerInfo) -> None:
        ledger = self._files[info.ledger_id]
        info.closed = True
        info.entries = ledger.entries
        info.size = ledger.data_bytes
        info.file_bytes = ledger.file_bytes

    def _rollover_failed(self, new: LedgerFile, what: str, exc: OSError) -> LedgerWriteError:
        error = LedgerWriteError(
            f"rollover of managed ledger {self.name!r} to ledger {new.ledger_id} failed: {what}: {exc}; "
            "appends queued for that ledger fail, entries acknowledged before are intact, and the next "
            "append retries with a new ledger; free disk space or check the volume"
        )
        new.broken = error
        return error

    async def _age_rollover_loop(self, max_age: float) -> None:
        # Appends also check the age; the timer covers a ledger that stops receiving appends.
        interval = min(max(max_age / 4, 0.01), 30.0)
        while True:
            await asyncio.sleep(interval)
            cur = self._cur
            if (
                self._state is _State.OPEN
                and cur.assigned_entries > 0
                and cur.broken is None
                and time.monotonic() - cur.created_mono >= max_age
            ):
                self._start_rollover()

    def _on_write_failure(self, ledger: LedgerFile, failure: GroupWriteFailed) -> LedgerWriteError:
        cause = failure.cause
        if failure.cut_failure is not None:
            error = LedgerWriteError(
                f"append to managed ledger {self.name!r} (ledger {ledger.ledger_id}) failed: {cause}, and "
                f"cutting the partial write failed too: {failure.cut_failure}; the managed ledger is now "
                "in the failed state: close and reopen it (reopening cuts the partial write) after freeing "
                "disk space; entries acknowledged before are intact"
            )
            self._state = _State.FAILED
            self._failure = error
        else:
            error = LedgerWriteError(
                f"append to managed ledger {self.name!r} (ledger {ledger.ledger_id}) failed: {cause}; "
                "nothing of the failed write was kept and entries acknowledged before are intact; the next "
                "append starts a new ledger, so retry once disk space is freed or the volume is fixed"
            )
        ledger.broken = error
        log.error("%s", error)
        return error

    # --- reads ----------------------------------------------------------------------------------------

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]:
        """Up to ``max_entries`` durable entries from ``start`` on (crossing ledgers; trimmed or
        empty ledgers are skipped). Empty when nothing exists at or after ``start``."""
        self._check_readable()
        _check_position(start)
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 (got {max_entries})")
        plan: list[tuple[int, int, int]] = []
        remaining = max_entries
        for ledger_id in self._store.ids[bisect_left(self._store.ids, start.ledger_id) :]:
            first = max(start.entry_id, 0) if ledger_id == start.ledger_id else 0
            count = min(self.confirmed_entries(ledger_id) - first, remaining)
            if count > 0:
                plan.append((ledger_id, first, count))
                remaining -= count
                if remaining == 0:
                    break
        if not plan:
            return []
        chunks = await self._read_through(plan)
        return [
            Entry(Position(ledger_id, first + i), data)
            for (ledger_id, first, _), datas in zip(plan, chunks, strict=True)
            for i, data in enumerate(datas)
        ]

    async def read_entry(self, position: Position) -> bytes:
        self._check_readable()
        _check_position(position)
        if not 0 <= position.entry_id < self.confirmed_entries(position.ledger_id):
            raise NoSuchEntryError(
                f"no entry at {position} in managed ledger {self.name!r} (live ledgers {self._store.ids}, "
                f"last confirmed entry {self.last_confirmed_entry()}); it was never written or was trimmed"
            )
        chunks = await self._read_through([(position.ledger_id, position.entry_id, 1)])
        return chunks[0][0]

    async def _read_through(self, plan: list[tuple[int, int, int]]) -> list[list[bytes]]:
        """Local files where they are read, the tier for offloaded ledgers (and, with read priority
        tiered-storage-first, for every fully offloaded one); results in plan order."""
        local: list[tuple[LedgerFile, int, int]] = []
        tier: dict[int, tuple[int, int, int]] = {}
        offloader = self.offloader
        meta = self._store.meta
        for n, (ledger_id, first, count) in enumerate(plan):
            ledger = self._files.get(ledger_id)
            info = meta.find(ledger_id)
            use_tier = ledger is None or (
                offloader is not None
                and info is not None
                and offloader.policy.managedLedgerDataReadPriority == "tiered-storage-first"
                and offloader.fully_offloaded(info, meta)
            )
            if use_tier:
                tier[n] = (ledger_id, first, count)
            elif ledger is not None:
                local.append((ledger, first, count))
        if tier and offloader is None:
            raise NoSuchEntryError(
                f"ledgers {sorted(t[0] for t in tier.values())} of managed ledger {self.name!r} were "
                "offloaded and their local files deleted, but offload is not configured; configure the "
                "same offload driver and location to read them"
            )
        local_chunks = iter(await self._read(local) if local else [])
        out: list[list[bytes]] = []
        for n in range(len(plan)):
            if n in tier:
                assert offloader is not None
                out.append(await offloader.read(*tier[n]))
            else:
                out.append(next(local_chunks))
        return out

    async def _read(
        self, plan: list[tuple[LedgerFile, int, int]], *, pool: Executor | None = None
    ) -> list[list[bytes]]:
        """``pool`` None: the ledger I/O pool; offload passes another so its reads never queue in
        front of a group commit's write and fsync."""
        for ledger, _, _ in plan:
            ledger.begin_read()
        self._reads_in_flight += 1
        self._reads_done.clear()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                pool or self._executor, lambda: [ledger.read(first, count) for ledger, first, count in plan]
            )
        finally:
            for ledger, _, _ in plan:
                ledger.end_read()
            self._reads_in_flight -= 1
            if self._reads_in_flight == 0:
                self._reads_done.set()

    def _check_readable(self) -> None:
        if self._state is _State.CLOSED:
            raise LedgerClosedError(f"managed ledger {self.name!r} is closed; reopen it")

    # --- layout (also what cursors see) ---------------------------------------------------------------

    def ledger_ids(self) -> list[int]:
        """Live (not trimmed) ledgers, ascending, including the current one."""
        return list(self._store.ids)

    def confirmed_entries(self, ledger_id: int) -> int:
        ledger = self._files.get(ledger_id)
        if ledger is not None:
            return ledger.entries
        info = self._store.meta.find(ledger_id)
        return info.entries if info is not None and info.offloaded else 0

    def current_ledger_id(self) -> int:
        """The ledger new appends go to."""
        return self._cur.ledger_id

    def last_confirmed_entry(self) -> Position | None:
        """The newest durable entry still live (None if no live ledger holds an entry)."""
        for ledger_id in reversed(self._store.ids):
            entries = self.confirmed_entries(ledger_id)
            if entries:
                return Position(ledger_id, entries - 1)
        return None

    # --- cursors and trimming ------------------------------------------------------------------------

    async def open_cursor(self, name: str) -> ManagedCursor:
        """Reopen a persisted cursor, or create it at the earliest live position."""
        if self._state in (_State.CLOSING, _State.CLOSED):
            self._raise_not_writable()
        async with self._cursor_lock:
            cursor = self._cursors.get(name)
            if cursor is not None:
                return cursor
            path = self._cursors_dir / f"{encode_name(name, 'cursor')}.json"
            state = CursorState(Position(self._store.ids[0], -1))
            cursor = ManagedCursor(name, path, state=state, layout=self, io=self._io, executor=self._executor)
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, cursor.persist_blocking)
            except OSError as exc:
                raise LedgerWriteError(
                    f"could not create cursor {name!r} of managed ledger {self.name!r} at {path}: {exc}; "
                    "free disk space or check the volume, then retry"
                ) from exc
            self._cursors[name] = cursor
            return cursor

    async def reopen_cursor(self, name: str, *, owner: str) -> ManagedCursor:
        """Reopen a cursor its owner knows was created before (``owner`` says who, for the message).

        Unlike ``open_cursor``, a cursor whose file is gone is not created afresh: starting it again
        at the earliest entry would read every entry it had deleted as not deleted. That is refused
        (``MissingCursorError``, naming the file and how to accept the reset) unless the operator
        accepted it with the cursor's acceptance file, which is then taken once (removed).
        """
        if self._state in (_State.CLOSING, _State.CLOSED):
            self._raise_not_writable()
        encoded = encode_name(name, "cursor")
        path = self._cursors_dir / f"{encoded}.json"
        acceptance = self._cursors_dir / f"{encoded}{RESET_ACCEPTANCE_SUFFIX}"
        loop = asyncio.get_running_loop()
        accepted = await loop.run_in_executor(self._executor, acceptance.is_file)
        cursor = self._cursors.get(name)
        if cursor is None and not accepted:
            raise MissingCursorError(path, owner, acceptance)
        if cursor is None:
            log.warning(
                "cursor file %s of %s is missing and %s accepts the reset: it starts again from the "
                "earliest retained entry (every entry it had deleted is read again)",
                path,
                owner,
                acceptance,
            )
            cursor = await self.open_cursor(name)
        elif accepted:
            # Left over (the cursor was restored after all): it must not accept a later loss silently.
            log.warning("%s is not needed (cursor file %s exists) and is removed", acceptance, path)
        if accepted:
            await loop.run_in_executor(self._executor, self._remove_acceptance, acceptance)
        return cursor

    async def delete_cursor(self, name: str) -> None:
        """Close the cursor and remove its file durably (its subscription is deleted: Pulsar's
        unsubscribe); the entries it held back become trimmable. A cursor that is not open is a
        no-op, whether or not a file is left: the file is removed then too."""
        async with self._cursor_lock:
            cursor = self._cursors.pop(name, None)
            if cursor is not None:
                await cursor.close()
            path = self._cursors_dir / f"{encode_name(name, 'cursor')}.json"
            await asyncio.get_running_loop().run_in_executor(self._executor, self._unlink_synced, path)

    def _unlink_synced(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return  # the usual case (every new subscription asks): no directory fsync then
        self._io.sync_dir(path.parent)

    async def destroy(self) -> None:
        """Close, then remove the managed ledger's directory (every ledger, cursor and its metadata)
        for good: a deleted subscription's pending-ack log."""
        await self.close()
        await asyncio.get_running_loop().run_in_executor(None, self._remove_directory)

    def _remove_directory(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=False)
        self._io.sync_dir(self.directory.parent)

    def _remove_acceptance(self, acceptance: Path) -> None:
        acceptance.unlink(missing_ok=True)
        self._io.sync_dir(acceptance.parent)

    def cursors(self) -> dict[str, ManagedCursor]:
        return dict(self._cursors)

    async def trim(
        self, retention: Retention | None = None, *, keep_from_ledger: int | None = None
    ) -> list[int]:
        """Delete the closed ledgers every cursor is done with; returns their ids.

        The current ledger is never deleted, nor any from ``keep_from_ledger`` on. Without
        ``retention``: every such ledger, and with no cursor nothing (nobody has said the data is
        consumed). With ``retention`` (a topic's policy, ``ledger/retention.py``): Pulsar's rule, only
        those outside retention, and with no cursor every closed ledger counts as consumed.
        """
        if self._state in (_State.CLOSING, _State.CLOSED):
            self._raise_not_writable()
        async with self._trim_lock:
            if not self._trimmable(self._store.meta, retention, keep_from_ledger):
                return []
            victims: list[int] = []

            def drop_consumed(meta: ManagedLedgerMetadata) -> None:
                # decided again here, under the metadata lock: a rollover may have closed a ledger since
                victims.extend(self._trimmable(meta, retention, keep_from_ledger))
                meta.ledgers = [i for i in meta.ledgers if i.ledger_id not in victims]

            try:
                await self._store.update(drop_consumed)
            except OSError as exc:
                raise LedgerWriteError(
                    f"trimming ledgers {victims} of managed ledger {self.name!r} failed: could not write "
                    f"the metadata: {exc}; nothing was deleted, retry later"
                ) from exc
            if not victims:
                return []
            paths = []
            for ledger_id in victims:
                ledger = self._files.pop(ledger_id, None)
                if ledger is not None:  # None: offloaded, its local file already gone
                    ledger.retire()
                    paths.append(ledger.path)
            await asyncio.get_running_loop().run_in_executor(self._executor, self._unlink_all, paths)
            if self.offloader is not None:
                self.offloader.notify()  # segments whose ledgers are all trimmed lose their objects
            return victims

    def _trimmable(
        self, meta: ManagedLedgerMetadata, retention: Retention | None, keep_from: int | None
    ) -> list[int]:
        if not self._cursors and retention is None:
            return []
        bound: float = float("inf")
        for cursor in self._cursors.values():
            first = cursor.first_undeleted_position()
            if first is not None:
                bound = min(bound, first.ledger_id)
        return ledgers_to_trim(self._facts(meta), bound, retention, time.time(), keep_from)

    def ledger_facts(self) -> list[LedgerFacts]:
        """Every live ledger's entries, payload bytes and when it was closed (for retention, TTL and
        backlog estimates)."""
        return self._facts(self._store.meta)

    def _facts(self, meta: ManagedLedgerMetadata) -> list[LedgerFacts]:
        infos = meta.ledgers
        facts = []
        for i, info in enumerate(infos):
            ledger = self._files.get(info.ledger_id)
            entries, size = (
                (ledger.entries, ledger.data_bytes) if ledger is not None else (info.entries, info.size)
            )
            # Closed when the next ledger was created (a restart closes it earlier: later is safe).
            following = infos[i + 1].created_at if i + 1 < len(infos) else 0.0
            closed_at = max(following, info.created_at) if info.closed and following > 0 else None
            facts.append(LedgerFacts(info.ledger_id, entries, size, info.closed, closed_at))
        return facts

    def _unlink_all(self, paths: list[Path]) -> None:
        # The metadata no longer lists these ledgers; a file left behind is removed on the next open.
        try:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    self._io.unlink(path)
            self._io.sync_dir(self._ledgers_dir)
        except OSError as exc:
            log.warning("managed ledger %s: could not remove trimmed ledger files: %s", self.name, exc)

    # --- stats and lifecycle --------------------------------------------------------------------------

    def internal_stats(self) -> dict[str, Any]:
        """Pulsar's ManagedLedgerInternalStats shape (docs/reference.md)."""
        cur = self._cur
        state = self._state.value
        if self._state is _State.OPEN and self._rollovers_in_flight:
            state = "CreatingLedger"
        return internal_stats(
            entries_added=self._entries_added,
            ledgers=[self._ledger_stat(info) for info in self._store.meta.ledgers],
            current=LedgerStat(cur.ledger_id, cur.entries, cur.data_bytes),
            last_confirmed=self.last_confirmed_entry(),
            state=state,
            pending_adds=self._writer.pending_appends,
            last_ledger_created=datetime.fromtimestamp(self._last_created, UTC).isoformat(),
            cursors={name: cursor.stats() for name, cursor in sorted(self._cursors.items())},
        )

    def _ledger_stat(self, info: LedgerInfo) -> LedgerStat:
        ledger = self._files.get(info.ledger_id)
        offloaded = self.offloader is not None and self.offloader.fully_offloaded(info, self._store.meta)
        if ledger is None:
            return LedgerStat(info.ledger_id, info.entries, info.size, offloaded=True)
        return LedgerStat(info.ledger_id, ledger.entries, ledger.data_bytes, offloaded=offloaded)

    # --- offload host (what the Offloader may do to this ledger) --------------------------------------

    def offload_metadata(self) -> ManagedLedgerMetadata:
        return self._store.meta

    async def update_offload_metadata(self, change: Callable[[ManagedLedgerMetadata], None]) -> None:
        await self._store.update(change)

    async def read_local(self, ledger_id: int, first: int, count: int) -> list[bytes]:
        ledger = self._files.get(ledger_id)
        if ledger is None or first + count > ledger.entries:
            raise NoSuchEntryError(
                f"entries {ledger_id}:{first}..{first + count - 1} of managed ledger {self.name!r} are not "
                "in a local file (trimmed or offloaded meanwhile)"
            )
        return (await self._read([(ledger, first, count)], pool=self._offload_pool))[0]

    def _local_file(self, ledger_id: int, first: int, count: int) -> LedgerFile:
        ledger = self._files.get(ledger_id)
        if ledger is None or first + count > ledger.entries:
            raise NoSuchEntryError(
                f"entries {ledger_id}:{first}..{first + count - 1} of managed ledger {self.name!r} are not "
                "in a local file (trimmed or offloaded meanwhile)"
            )
        return ledger

    async def load_index(self, ledger_id: int) -> None:
        """Load the dense offset index of a closed local ledger the offloader reads back, so that
        ``local_payload_bytes`` needs no I/O; the ledger loaded before it is sealed again (at most one
        closed ledger of a managed ledger holds a dense index)."""
        ledger = self._files.get(ledger_id)
        previous = self._indexed
        if previous is not None and previous is not ledger:
            previous.seal_index()
            self._indexed = None
        if ledger is None or ledger.offsets is not None:
            return
        await asyncio.get_running_loop().run_in_executor(self._offload_pool, ledger.load_index)
        if not ledger.retired:
            self._indexed = ledger

    def release_index(self, ledger_id: int) -> None:
        """The offloader is done with ``ledger_id``: seal its index again if it was loaded for it."""
        ledger = self._indexed
        if ledger is not None and ledger.ledger_id == ledger_id:
            ledger.seal_index()
            self._indexed = None

    def index_bytes(self) -> int:
        """Memory the offset indexes of this managed ledger's local ledgers take."""
        return sum(ledger.index_bytes() for ledger in self._files.values())

    def local_payload_bytes(self, ledger_id: int, first: int, count: int) -> int:
        """Payload bytes of durable local entries first..first+count-1 (from the offset index: no I/O
        once ``load_index`` has run for a closed ledger)."""
        start, end = self._local_file(ledger_id, first, count).span(first, count)
        return end - start - count * RECORD_HEADER_SIZE

    async def read_local_framed(
        self, ledger_id: int, first: int, count: int, *, into: int | None = None
    ) -> bytearray:
        """Durable local entries first..first+count-1, checked and framed for an offload block by the
        read-back worker process (see readback.py: the per-entry work never holds this process's GIL);
        ``into``: appended to that block staged in the worker instead (an empty buffer returned)."""
        ledger = self._local_file(ledger_id, first, count)

        def frame() -> bytearray:
            start, end = ledger.span(first, count)  # here: a sealed ledger's span reads its file
            return shared_worker().frame(
                ledger.path, ledger_id, first, count, start=start, end=end, into=into
            )

        self._reads_in_flight += 1
        self._reads_done.clear()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._offload_pool, frame)
        finally:
            self._reads_in_flight -= 1
            if self._reads_in_flight == 0:
                self._reads_done.set()

    def set_offload_policy(self, policy: OffloadPolicy) -> None:
        """Start offloading, or change the policy of a running offloader (admin API; see
        Offloader.set_policy for what may not change live)."""
        if self._state in (_State.CLOSING, _State.CLOSED):
            self._raise_not_writable()
        if self.offloader is None:
            self._start_offloader(policy)
        else:
            self.offloader.set_policy(policy)

    def _start_offloader(self, policy: OffloadPolicy) -> None:
        self.offloader = Offloader(self, policy)
        self.offloader.start()
        self._offload_pool.submit(shared_worker().start)  # its start-up off the first read-back

    def block_worker(self) -> ReadBackWorker:
        """The read-back worker, which also stages and writes blocks for a filesystem tier."""
        return shared_worker()

    def local_bytes(self, ledger_id: int) -> int:
        ledger = self._files.get(ledger_id)
        return ledger.data_bytes if ledger is not None else 0

    async def drop_local(self, ledger_id: int) -> None:
        """Delete a fully offloaded ledger's local file: recorded first, so a crash leaves at most a
        file the next open removes, never a ledger without its entries."""
        async with self._trim_lock:
            if ledger_id == self._cur.ledger_id or ledger_id not in self._files:
                return

            def mark(meta: ManagedLedgerMetadata) -> None:
                info = meta.find(ledger_id)
                if info is not None and info.closed:
                    info.offloaded = True

            await self._store.update(mark)
            info = self._store.meta.find(ledger_id)
            if info is None or not info.offloaded:
                return
            ledger = self._files.pop(ledger_id)
            ledger.retire()
            await asyncio.get_running_loop().run_in_executor(self._executor, self._unlink_all, [ledger.path])

    async def _close_current_ledger(self) -> None:
        # Recorded as closed, the ledger is checked strictly on the next open: after a clean shutdown
        # a damaged tail is corruption, not a torn write. An empty one stays open, to be reused.
        cur = self._cur
        if cur.entries == 0 or cur.broken is not None or cur.ledger_id not in self._store.ids:
            return

        def close_open(meta: ManagedLedgerMetadata) -> None:
            for info in meta.ledgers:
                if not info.closed:
                    self._close_info(info)

        try:
            await self._store.update(close_open)
        except OSError as exc:  # still safe: the next open recovers it as the open ledger
            log.warning(
                "managed ledger %s: could not record ledger %d as closed: %s", self.name, cur.ledger_id, exc
            )

    @property
    def state(self) -> str:
        return self._state.value

    async def close(self) -> None:
        """Finish queued appends (they complete normally), close the current ledger in the metadata,
        persist cursors, release the directory."""
        if self._state is _State.CLOSED:
            return
        if self._state is _State.CLOSING:
            await self._closed_event.wait()
            return
        failed = self._state is _State.FAILED
        self._state = _State.CLOSING
        try:
            if self.offloader is not None:
                await self.offloader.close()  # an upload cut short here is an orphan the next open removes
            await self._writer.drain()
            if not failed:
                await self._close_current_ledger()
            await self._watermark.close()
            if self._age_timer is not None:
                self._age_timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._age_timer
            async with self._cursor_lock, self._trim_lock:  # no cursor creation or trim half done
                for cursor in self._cursors.values():
                    await cursor.close()
            await self._reads_done.wait()
        finally:
            for ledger in self._files.values():
                ledger.close()
            self._cur.close()
            self._offload_pool.shutdown(wait=False)  # idle by now: reads in flight were awaited above
            self._watermark.release()
            release_directory_lock(self._lock_fd)
            self._state = _State.CLOSED
            self._closed_event.set()
            self._on_close(self)
