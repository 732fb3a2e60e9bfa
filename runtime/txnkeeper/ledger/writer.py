"""Group commit: many appends, one write and one fsync.

Appends are queued in order (their entry ids were assigned by the caller when queued). One flush task
takes everything queued for the same ledger, writes it with one pwrite and one fdatasync on an executor
thread (so the loop keeps queuing meanwhile; a lone small group inline, see below), and only then
resolves the appends' futures. Ordered
"barriers" (ledger rollovers) run between groups, so a new ledger's file exists before its first write.
With group_commit off every append is its own group: the fsync-per-append baseline.
``mark_written`` runs on the writing thread between a group's data pwrite and its fsync (the watermark's
written mark, which a process crash cannot lose); ``on_durable`` hears of every confirmed group (the
managed ledger counts entries and moves the watermark's confirmed value, whose write then runs on
the pool alongside later groups').

``start_now`` lets a caller that already gathered a loop turn's records (the buffered writer's
end-of-turn flush) have the write submitted within its own callback instead of when the flush task
first runs, a loop turn later. It acts only while no write is running, so it never splits a group:
appends queued while a write runs still join the next one.

An append may carry a ``notify`` callback instead of a future: it is called with (result, None) or
(None, error) inside the step that confirms the group, where a future's callbacks would only run a
loop turn later. The buffered writer settles its batches so: its callers, and the end-of-turn flush of
what accumulated behind the entry, then run one loop turn earlier.

The inline path (``inline_under_s``): a small group that finds the writer idle is written and
fsynced on the event loop's own thread, with no hand-off to the I/O pool and back. At one append
in flight that hand-off is most of an append's cost: submitting wakes a pool thread, which then
waits for the GIL, and its completion wakes the loop again, each a context switch on another vCPU,
while a small fdatasync takes a fraction of a millisecond. Blocking the loop is only worth it while
fsyncs are fast and nothing queues behind the write, so the path is adaptive: it is taken only
while the last write was fast and at most one of the last ``_WINDOW`` took ``inline_under_s`` or
longer, for a group of at most ``_INLINE_MAX_APPENDS`` appends and ``_INLINE_MAX_BYTES`` bytes
that is the first the flush task takes (appends queued behind a running write go to the pool, so
high concurrency keeps writing on the I/O thread while the loop gathers the next group). While slow
fsyncs keep it on the pool, every ``_PROBE_EVERY``-th eligible group is still written inline to
measure again: a pool thread's timing includes its wait for the GIL. The durability rules are the
pool's: the same ``write_and_sync`` (data pwrite, written mark, fdatasync, the cut on failure), and
the appends are resolved only after it returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any, TypeVar

from . import io_stats
from .errors import LedgerWriteError
from .ledger_file import GroupWriteFailed, LedgerFile

FailureHandler = Callable[[LedgerFile, GroupWriteFailed], LedgerWriteError]
T = TypeVar("T")
# Called once with (result, None) when the append is durable, or (None, error) when it failed.
Notify = Callable[[Any, BaseException | None], None]

log = logging.getLogger(__name__)

# The inline path's limits (see the module docstring). A group larger than this is not a lone
# append's: something queues, and the pool lets the loop gather the next group meanwhile.
_INLINE_MAX_APPENDS = 8
_INLINE_MAX_BYTES = 64 * 1024
_WINDOW = 16  # the recent writes whose durations decide
_PROBE_EVERY = 16


class _Group:
    """Appends queued for one ledger, contiguous in entry ids and file offsets."""

    __slots__ = (
        "buffers",
        "created",
        "data_bytes",
        "end",
        "futures",
        "ledger",
        "offsets",
        "results",
        "start",
    )

    def __init__(self, ledger: LedgerFile, start: int) -> None:
        self.ledger = ledger
        self.start = start
        self.created = time.perf_counter()  # when its first append was queued (io_stats.APPEND)
        self.end = start
        self.buffers: list[bytes] = []
        self.offsets: list[int] = []
        self.futures: list[asyncio.Future[Any] | Notify] = []
        self.results: list[object] = []
        self.data_bytes = 0


class _Barrier:
    __slots__ = ("action", "future")

    def __init__(self, action: Callable[[], Awaitable[Any]], future: asyncio.Future[Any]) -> None:
        self.action = action
        self.future = future


class GroupCommitWriter:
    def __init__(
        self,
        executor: Executor,
        *,
        group_commit: bool,
        sync: bool,
        on_failure: FailureHandler,
        on_durable: Callable[[LedgerFile, int], None] | None = None,
        mark_written: Callable[[int, int], Callable[[], None] | None] | None = None,
        inline_under_s: float | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_durable = on_durable
        self._mark_written = mark_written
        self._executor = executor
        self._group_commit = group_commit
        self._sync = sync
        self._on_failure = on_failure
        self._queue: deque[_Group | _Barrier] = deque()
        self._task: asyncio.Task[None] | None = None
        # The task exists but has not run its first step yet: start_now may take its first write.
        self._task_pending = False
        # A write start_now submitted, which the task completes first: its groups and the I/O future.
        self._head: tuple[list[_Group], asyncio.Future[float | None]] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.pending_appends = 0
        # The inline path: None (off) or the duration from which a write counts as slow; the slow
        # flags of the last _WINDOW writes (either path) and how many of them are set.
        self._inline_under = inline_under_s
        self._recent: deque[bool] = deque(maxlen=_WINDOW)
        self._recent_slow = 0
        self._since_probe = 0

    def append(
        self, ledger: LedgerFile, header: bytes, data: bytes, offset: int, result: T
    ) -> asyncio.Future[T]:
        """Queue one record at ``offset`` of ``ledger``; the future resolves to ``result`` once it is
        durable (the caller's position: one future per append, no wrapper awaiting it)."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._enqueue(ledger, header, data, offset, result=result, waiter=future)
        return future

    def append_notify(
        self, ledger: LedgerFile, header: bytes, data: bytes, offset: int, result: T, *, notify: Notify
    ) -> None:
        """``append``, but ``notify`` is called in the confirming step instead of resolving a future."""
        self._enqueue(ledger, header, data, offset, result=result, waiter=notify)

    def _enqueue(
        self,
        ledger: LedgerFile,
        header: bytes,
        data: bytes,
        offset: int,
        *,
        result: T,
        waiter: asyncio.Future[T] | Notify,
    ) -> None:
        queue = self._queue
        group = queue[-1] if queue else None
        if type(group) is not _Group or group.ledger is not ledger or not self._group_commit:
            group = _Group(ledger, offset)
            queue.append(group)
        group.buffers.append(header)
        group.buffers.append(data)
        group.offsets.append(offset)
        group.data_bytes += len(data)
        group.end = offset + len(header) + len(data)
        group.futures.append(waiter)
        group.results.append(result)
        self.pending_appends += 1
        if self._task is None:
            self._start()

    def barrier(self, action: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
        """Run ``action`` after everything queued so far and before anything queued later."""
        future: asyncio.Future[Any] = self._loop.create_future()
        self._queue.append(_Barrier(action, future))
        if self._task is None:
            self._start()
        return future

    def start_now(self) -> None:
        """Submit the queued write to the I/O thread now if no write is running or about to run.

        Only the first group(s) are taken, exactly those the flush task would take; everything else
        stays queued for the task, which completes this write first. A no-op while a write runs
        (appends then keep grouping behind it) or when a barrier is next.
        """
        queue = self._queue
        if not self._task_pending or self._head is not None or not queue or type(queue[0]) is not _Group:
            return
        if self._inline_under is not None and self._inline_ok(queue, probe=False):
            # The task writes it inline on its first step; taking it to the pool here would cost
            # the two hand-offs the inline path saves.
            return
        groups = self._take_groups()
        future = self._submit(groups)
        if future is not None:
            self._head = (groups, future)

    async def drain(self) -> None:
        """Wait until everything queued so far (and since) has completed."""
        await self._idle.wait()

    def _start(self) -> None:
        self._idle.clear()
        self._task_pending = True
        self._task = self._loop.create_task(self._run(), name="ledger-group-commit")

    def _take_groups(self) -> list[_Group]:
        # The queue's head is a group: it and (with group commit) the groups of the same ledger after it.
        queue = self._queue
        first = queue.popleft()
        assert type(first) is _Group
        groups = [first]
        if self._group_commit:
            while queue and type(queue[0]) is _Group and queue[0].ledger is first.ledger:
                groups.append(queue.popleft())  # type: ignore[arg-type]
        return groups

    async def _run(self) -> None:
        self._task_pending = False
        queue = self._queue
        try:
            head, self._head = self._head, None
            if head is not None:
                await self._complete(*head)
            elif (
                self._inline_under is not None
                and queue
                and type(queue[0]) is _Group
                and self._inline_ok(queue, probe=True)
            ):
                self._write_inline(self._take_groups())
            while queue:
                if type(queue[0]) is _Barrier:
                    barrier = queue.popleft()
                    assert type(barrier) is _Barrier
                    await self._run_barrier(barrier)
                    continue
                groups = self._take_groups()
                future = self._submit(groups)
                if future is not None:
                    await self._complete(groups, future)
        finally:
            self._task = None
            self._idle.set()

    async def _run_barrier(self, barrier: _Barrier) -> None:
        try:
            result = await barrier.action()
        except Exception as exc:
            if not barrier.future.done():
                barrier.future.set_exception(exc)
        else:
            if not barrier.future.done():
                barrier.future.set_result(result)

    def _inline_ok(self, queue: deque[_Group | _Barrier], *, probe: bool) -> bool:
        """Whether the group(s) at the head of ``queue`` (the writer is idle) go inline.

        ``probe``: this is the decision that counts an eligible group towards the next probe.
        """
        first = queue[0]
        assert type(first) is _Group
        if len(queue) > 1 and self._group_commit:
            # Several groups for one write (a rollover's or a barrier's neighbours): the pool
            return False
        if len(first.futures) > _INLINE_MAX_APPENDS or first.end - first.start > _INLINE_MAX_BYTES:
            return False
        recent = self._recent
        if len(recent) == _WINDOW and self._recent_slow <= 1 and not recent[-1]:
            return True
        if len(recent) < _WINDOW:
            return False  # not measured yet: the pool's writes fill the window first
        if probe:
            self._since_probe += 1
            if self._since_probe >= _PROBE_EVERY:
                self._since_probe = 0
                return True
        return False

    def _record(self, seconds: float) -> None:
        assert self._inline_under is not None
        slow = seconds >= self._inline_under
        recent = self._recent
        if len(recent) == _WINDOW and recent[0]:
            self._recent_slow -= 1
        recent.append(slow)
        if slow:
            self._recent_slow += 1

    def _write_args(
        self, groups: list[_Group]
    ) -> tuple[LedgerFile, list[bytes], int, Callable[[], Callable[[], None] | None] | None] | None:
        """The write of the taken groups, or None if they failed at once (already reported)."""
        ledger = groups[0].ledger
        count = sum(len(g.futures) for g in groups)
        self.pending_appends -= count
        if ledger.broken is not None:
            self._fail(groups, ledger.broken)
            return None
        buffers = groups[0].buffers if len(groups) == 1 else [b for g in groups for b in g.buffers]
        mark = None
        if self._mark_written is not None:
            mark = partial(self._mark_written, ledger.ledger_id, ledger.entries + count - 1)
        return ledger, buffers, groups[0].start, mark

    def _write_inline(self, groups: list[_Group]) -> None:
        """Write, fsync and confirm the groups on this (the loop's) thread, then resolve them."""
        args = self._write_args(groups)
        if args is None:
            return
        ledger, buffers, start, mark = args
        began = time.perf_counter()
        try:
            ledger.write_and_sync(buffers, start, self._sync, mark)
        except GroupWriteFailed as failure:
            self._fail(groups, self._on_failure(ledger, failure))
            return
        except Exception as exc:  # a bug or a closed fd: never leave an append hanging
            self._broken(groups, exc)
            return
        finally:
            self._record(time.perf_counter() - began)
        self._confirm(groups)

    def _timed_write(
        self,
        ledger: LedgerFile,
        buffers: list[bytes],
        start: int,
        mark: Callable[[], Callable[[], None] | None] | None,
    ) -> float:
        # On the I/O thread; what it returns includes any wait for the GIL (see the probes).
        began = time.perf_counter()
        ledger.write_and_sync(buffers, start, self._sync, mark)
        return time.perf_counter() - began

    def _submit(self, groups: list[_Group]) -> asyncio.Future[float | None] | None:
        """Hand the groups' write to the I/O thread; None if they failed at once (already reported)."""
        args = self._write_args(groups)
        if args is None:
            return None
        ledger, buffers, start, mark = args
        try:
            if self._inline_under is None:
                return self._loop.run_in_executor(
                    self._executor, ledger.write_and_sync, buffers, start, self._sync, mark
                )
            return self._loop.run_in_executor(self._executor, self._timed_write, ledger, buffers, start, mark)
        except Exception as exc:  # e.g. the executor was shut down: never leave an append hanging
            self._broken(groups, exc)
            return None

    def _broken(self, groups: list[_Group], exc: Exception) -> None:
        ledger = groups[0].ledger
        error = LedgerWriteError(f"append to ledger {ledger.ledger_id} failed unexpectedly: {exc!r}")
        ledger.broken = error
        self._fail(groups, error)

    async def _complete(self, groups: list[_Group], io: asyncio.Future[float | None]) -> None:
        """Wait for the submitted write, then confirm the groups and resolve their appends."""
        ledger = groups[0].ledger
        try:
            took = await io
        except GroupWriteFailed as failure:
            self._fail(groups, self._on_failure(ledger, failure))
            return
        except Exception as exc:  # a bug or a closed fd: never leave an append hanging
            self._broken(groups, exc)
            return
        if took is not None:
            self._record(took)
        self._confirm(groups)

    def _confirm(self, groups: list[_Group]) -> None:
        """The groups' write returned (fsynced): confirm them, then resolve their appends."""
        ledger = groups[0].ledger
        count = sum(len(g.futures) for g in groups)
        for group in groups:
            ledger.confirm(group.offsets, len(group.futures), group.data_bytes, group.end)
        if self._on_durable is not None:
            self._on_durable(ledger, count)  # e.g. the watermark: after confirm, before the acks
        now = time.perf_counter()
        for group in groups:
            # Every append of the group counted with its oldest append's wait: an upper bound.
            io_stats.APPEND.observe(now - group.created, len(group.futures))
            for future, result in zip(group.futures, group.results, strict=True):
                if not isinstance(future, asyncio.Future):
                    _notify(future, result, None)
                elif not future.done():
                    future.set_result(result)

    @staticmethod
    def _fail(groups: list[_Group], error: LedgerWriteError) -> None:
        for group in groups:
            for future in group.futures:
                if not isinstance(future, asyncio.Future):
                    _notify(future, None, error)
                elif not future.done():
                    future.set_exception(error)


def _notify(notify: Notify, result: object, error: BaseException | None) -> None:
    # A notify callback runs inside the flush task: its bug must not stop the appends behind it.
    try:
        notify(result, error)
    except Exception:
        log.exception("an append's settle callback failed; the ledger goes on with the next group")
