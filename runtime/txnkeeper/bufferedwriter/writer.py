"""The PIP-160 buffered writer: many small log records, few durable ledger entries.

Records queue in memory and leave as one batched entry when the queue reaches maxRecords (checked
first), when its bytes reach maxSize, or at the next tick of a timer running every maxDelay. A record of at
least maxSize bytes flushes the queue and is then written alone as a plain entry; with batching off
(or maxRecords <= 1) every record is a plain entry. Every caller learns where its record landed.

Why it is shaped like this: the record path is the throughput limit, so a record costs one
serialization, one list append and one future; batches go to the ledger as appends made in flush
order (entry order equals flush order), settled by the ledger's callback in the step that confirms
the write where the ledger offers one (``add_entry_notify``: a future's callbacks would run a loop
turn later), and the next batch fills while the previous one is being fsync'd. At most one timer is
ever armed (see _arm_timer).

Flush modes (``BatchedWriteConfig.flush_mode``). "delay" is Pulsar's behaviour, byte for byte: a
partial batch waits for the timer tick. "adaptive" (the default) never holds a batch while the ledger
is idle, because a lone or sequential writer would otherwise pay maxDelay on every record: a record
that arrives while no batch entry of this writer is in flight leaves at once as its own batch (trigger
``idle``); records arriving while one is in flight accumulate, and leave together when that entry
settles (trigger ``idle``), or earlier on maxRecords/maxSize, and maxDelay still bounds their wait.
"When that entry settles" means at the end of that loop turn, after the entry's own callers woke: a
steady set of writers then puts all its records into one entry per ledger write instead of splitting
into two alternating halves (each half paid a whole ledger write, 0.6x of the unbatched log at 16
writers). For the same reason a record that finds the ledger idle leaves at the end of its loop turn,
not at the call: records written in one turn (a coordinator logs ADD_PARTITION and ADD_SUBSCRIPTION of
one request back to back) share one entry. Leaving at the call sent the first alone and made the second
wait for that entry's whole ledger write, where the unbatched log's group commit wrote both with one
fsync (at 1 transaction in flight that was a second fsync on every transaction's critical path). That
end-of-turn flush also asks the ledger to start the write at once (``start_queued_writes``) rather than
when its group-commit task first runs a turn later, so a lone writer's record reaches the disk as many
loop turns after its submit as an unbatched record does (one).
The byte format, the large-record rule, order, and close/fail semantics are the same in both modes.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Generic, NamedTuple, Protocol, TypeVar

from google.protobuf.message import EncodeError, Message

from txnkeeper.bufferedwriter.codec import (
    BATCH_HEADER,
    FRAME_PREFIX_CACHE_LIMIT,
    FRAME_PREFIXES,
    RecordCodec,
    frame_prefix,
)
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import BufferedWriterMetrics, FlushTrigger

R = TypeVar("R", bound=Message)


class LedgerPosition(Protocol):
    """What the ledger returns for an appended entry (``txnkeeper.ledger.Position`` satisfies it)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...


class EntryLog(Protocol):
    """The one ledger operation the writer needs (``txnkeeper.ledger.ManagedLedger`` satisfies it).

    A ledger may also offer (the managed ledger does) ``start_queued_writes()``, which the writer calls
    after its end-of-turn idle flush so the entry's write starts in that callback, not a turn later;
    and ``add_entry_notify(data, notify)``, which settles a batch by calling ``notify(position, error)``
    in the step that confirms the write instead of a loop turn later through a future's callback.
    """

    def add_entry(self, data: bytes) -> Awaitable[LedgerPosition]: ...


class WritePosition(NamedTuple):
    """Where a record landed: its entry, and its place in the batch (0/0 for a plain entry).

    A named tuple rather than a dataclass: one is built per record on the hot path, and a tuple is
    built several times faster. It is immutable, ordered by (ledger, entry, size, index), hashable.
    """

    ledger_id: int
    entry_id: int
    batch_size: int
    batch_index: int

    @property
    def batched(self) -> bool:
        """Whether the record sits inside a batched entry."""
        return self.batch_size > 0


# Where a record's outcome is appended when its entry settles: its position packed into one int (see
# pack_position), or FAILED. Ints, not WritePosition tuples: a store keeps these for every live record,
# and ints are invisible to the cyclic GC while tuple subclasses stay tracked (full collections of
# hundreds of thousands of retained positions were the writer's worst latency outliers).
PositionSink = list[int]
FAILED = -1
_FIELD_BITS = 32
_FIELD_MASK = (1 << _FIELD_BITS) - 1


def pack_position(ledger_id: int, entry_id: int, batch_size: int, batch_index: int) -> int:
    """One int holding a WritePosition (entry id, batch size and index must fit in 32 bits)."""
    if not (
        0 <= entry_id <= _FIELD_MASK and 0 <= batch_size <= _FIELD_MASK and 0 <= batch_index <= _FIELD_MASK
    ):
        raise ValueError(f"position {ledger_id}:{entry_id} batch {batch_index}/{batch_size} cannot be packed")
    return (((ledger_id << _FIELD_BITS | entry_id) << _FIELD_BITS | batch_size) << _FIELD_BITS) | batch_index


def unpack_position(packed: int) -> WritePosition:
    """The WritePosition :func:`pack_position` packed."""
    return WritePosition(
        packed >> (3 * _FIELD_BITS),
        (packed >> (2 * _FIELD_BITS)) & _FIELD_MASK,
        (packed >> _FIELD_BITS) & _FIELD_MASK,
        packed & _FIELD_MASK,
    )


class WriterState(enum.Enum):
    """Lifecycle of a writer (Pulsar's OPEN -> CLOSING -> CLOSED)."""

    OPEN = "OPEN"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class BufferedWriterClosedError(RuntimeError):
    """A record was written to, or still buffered in, a writer that is closing or closed."""


class BufferedWriter(Generic[R]):
    """Batches records of one log into PIP-160 entries on one ledger."""

    def __init__(
        self,
        ledger: EntryLog,
        codec: RecordCodec[R],
        config: BatchedWriteConfig,
        metrics: BufferedWriterMetrics | None = None,
    ) -> None:
        if not isinstance(config, BatchedWriteConfig):
            raise TypeError(f"config must be a BatchedWriteConfig, got {type(config).__name__}")
        self._ledger = ledger
        self._start_writes: Callable[[], None] | None = getattr(ledger, "start_queued_writes", None)
        self._add_notify: (
            Callable[[bytes, Callable[[LedgerPosition | None, BaseException | None], None]], None] | None
        ) = getattr(ledger, "add_entry_notify", None)
        self._codec = codec
        self._serialize = codec.serialize
        self._record_type = codec.record_type
        self._metrics = metrics
        self._state = WriterState.OPEN
        self._loop: asyncio.AbstractEventLoop | None = None
        # Starts with the batch header so a flush is one join, one copy.
        self._framed: list[bytes] = [BATCH_HEADER]
        self._waiters: list[asyncio.Future[WritePosition]] = []
        self._sinks: list[PositionSink | None] = []
        self._progress: asyncio.Future[None] | None = None
        self._pending_bytes = 0
        self._oldest_at = 0.0
        self._epoch: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Future[LedgerPosition]] = set()
        # Batched entries (not plain ones) handed to the ledger and not yet settled: adaptive mode
        # flushes at once only when this is zero.
        self._batches_in_flight = 0
        # (ledger id, entry id) of the last entry whose records were settled: entries settle in
        # ledger order, so every sink already holds the position of every record up to it (what a
        # store snapshot may claim to cover).
        self._last_settled: tuple[int, int] | None = None
        self._idle_flush_scheduled = False
        self._closed = asyncio.Event()
        self._apply(config)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def config(self) -> BatchedWriteConfig:
        """The settings in force."""
        return self._config

    @property
    def state(self) -> WriterState:
        """OPEN, CLOSING or CLOSED."""
        return self._state

    @property
    def pending_records(self) -> int:
        """Records buffered and not yet handed to the ledger."""
        return len(self._waiters)

    @property
    def flush_deadline(self) -> float | None:
        """Loop time of the next timer tick (``None`` when no timer is armed).

        Armed whenever records wait on the timer. In delay mode one armed for a batch that left earlier
        (on maxRecords or maxSize) may still tick once and find nothing, as Pulsar's periodic timer
        does; the adaptive mode cancels it whenever a flush leaves nothing waiting.
        """
        return self._timer.when() if self._timer is not None else None

    @property
    def last_settled_entry(self) -> tuple[int, int] | None:
        """(ledger id, entry id) of the newest entry whose records' sinks were given their positions."""
        return self._last_settled

    async def write(self, record: R) -> WritePosition:
        """Write one record; resolves once its entry is durable."""
        return await self.submit(record)

    def submit(self, record: R, sink: PositionSink | None = None) -> asyncio.Future[WritePosition]:
        """Queue one record now and return the future of its position (``write`` without a coroutine).

        ``sink``, if given, receives the record's packed position (or ``FAILED``) when its entry
        settles, even if the returned future was cancelled: that is how a store learns every position
        without doing any work per record after the write. Cancelling the future never unwrites it.
        """
        if self._state is not WriterState.OPEN:
            self._check_open()
        if type(record) is self._record_type:
            try:
                data = record.SerializeToString()
            except EncodeError:
                data = self._serialize(record)  # raises the explanatory error
        else:
            data = self._serialize(record)  # checks the type
        return self.submit_serialized(data, sink)

    def submit_serialized(
        self, data: bytes, sink: PositionSink | None = None
    ) -> asyncio.Future[WritePosition]:
        """Queue a record the caller already serialized with this writer's codec."""
        if self._state is not WriterState.OPEN:
            self._check_open()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if not self._batching:
            return self._write_plain(loop, data, sink)
        size = len(data)
        if size >= self._max_size:
            # Pulsar: flush what is pending first so order is kept, then the big record goes alone.
            if self._waiters:
                self._flush(FlushTrigger.LARGE_DATA)
            return self._write_plain(loop, data, sink)
        fut: asyncio.Future[WritePosition] = loop.create_future()
        waiters = self._waiters
        waiters.append(fut)
        self._sinks.append(sink)
        # Prefix and body go in separately: the batch join copies them once, so no per-record concat.
        framed = self._framed
        framed.append(FRAME_PREFIXES[size] if size < FRAME_PREFIX_CACHE_LIMIT else frame_prefix(size))
        framed.append(data)
        self._pending_bytes += size
        if len(waiters) >= self._max_records:
            self._flush(FlushTrigger.MAX_RECORDS)
        elif self._pending_bytes >= self._max_size:
            self._flush(FlushTrigger.MAX_SIZE)
        elif len(waiters) == 1:
            self._oldest_at = now = loop.time()
            if self._adaptive and not self._batches_in_flight:
                self._schedule_idle_flush(loop)
            elif self._timer is None:
                self._arm_timer(loop, now)
        return fut

    async def configure(self, config: BatchedWriteConfig) -> None:
        """Change settings while running; turning batching off flushes the pending batch first.

        When batching is turned off this returns only once every batched entry already handed to the
        ledger is durable or failed: "disabled" then means no batched entry can appear any more, which
        is what the downgrade procedure's rollover relies on.
        """
        if not isinstance(config, BatchedWriteConfig):
            raise TypeError(f"config must be a BatchedWriteConfig, got {type(config).__name__}")
        self._check_open()
        was_batching = self._batching
        self._apply(config)
        if was_batching and not self._batching:
            if self._waiters:
                self._flush(FlushTrigger.FORCED)
            batched_in_flight = set(self._in_flight)
            if batched_in_flight:
                await asyncio.wait(batched_in_flight)
            return
        if not self._waiters:
            return
        if not self._batching:
            self._flush(FlushTrigger.FORCED)
        elif len(self._waiters) >= self._max_records:
            self._flush(FlushTrigger.MAX_RECORDS)
        elif self._pending_bytes >= self._max_size:
            self._flush(FlushTrigger.MAX_SIZE)
        elif self._adaptive and not self._batches_in_flight:
            self._flush(FlushTrigger.IDLE)
        else:
            # The pending batch follows the new delay, on a tick grid that starts now.
            if self._timer is not None:
                self._timer.cancel()
            assert self._loop is not None  # records are pending, so a loop was seen
            self._epoch = now = self._loop.time()
            self._arm_timer(self._loop, now)

    async def flush(self) -> None:
        """Hand the pending batch to the ledger now and wait until every entry so far has settled.

        Failures are reported to the writers of the affected records, not raised here.
        """
        if self._waiters:
            self._flush(FlushTrigger.FORCED)
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))

    async def close(self) -> None:
        """OPEN -> CLOSING -> CLOSED: fail buffered records, let entries already written complete."""
        if self._state is WriterState.CLOSED:
            return
        if self._state is WriterState.CLOSING:
            await self._closed.wait()
            return
        self._state = WriterState.CLOSING
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, sinks = self._waiters, self._sinks
        self._waiters, self._sinks, self._framed, self._pending_bytes = [], [], [BATCH_HEADER], 0
        if waiters:
            error = BufferedWriterClosedError(
                f"buffered writer closed before {len(waiters)} buffered record(s) were flushed;"
                " they were not written: write them again to a new writer"
            )
            self._settle_failed(waiters, sinks, error)
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))
        self._state = WriterState.CLOSED
        self._closed.set()
        self._signal_progress()

    async def wait_for_progress(self) -> None:
        """Return once some buffered or in-flight record settles (at once if there is none)."""
        if not self._waiters and not self._in_flight:
            return
        progress = self._progress
        if progress is None:
            assert self._loop is not None  # records exist, so a loop was seen
            progress = self._progress = self._loop.create_future()
        await asyncio.shield(progress)

    # -- internals ----------------------------------------------------------------------------------

    def _apply(self, config: BatchedWriteConfig) -> None:
        self._config = config
        self._batching = config.batching
        self._max_records = config.max_records
        self._max_size = config.max_size_bytes
        self._delay_s = config.max_delay_millis / 1000.0
        self._adaptive = config.flush_mode == "adaptive"
        if self._metrics is not None:
            self._metrics.set_flush_mode(config.flush_mode)

    def _check_open(self) -> None:
        if self._state is not WriterState.OPEN:
            raise BufferedWriterClosedError(
                f"buffered writer closed (state {self._state.value}): nothing was written;"
                " reopen the store to write again"
            )

    def _arm_timer(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        # Pulsar's timer ticks every maxDelay and flushes whatever is queued. Ticking while idle would
        # wake every writer 1000 times a second for nothing, so the timer is armed only while records
        # wait, for the next tick of the same grid: flushes happen exactly when Pulsar's would.
        delay = self._delay_s
        if self._epoch is None:
            self._epoch = now
        when = now if delay <= 0 else self._epoch + (math.floor((now - self._epoch) / delay) + 1) * delay
        self._timer = loop.call_at(when, self._on_timer)

    def _schedule_idle_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        # Adaptive mode with the ledger idle: flush at the end of this loop turn rather than at once,
        # so every record written in the same turn (writers woken together) shares the entry.
        if not self._idle_flush_scheduled:
            self._idle_flush_scheduled = True
            loop.call_soon(self._idle_flush)

    def _idle_flush(self) -> None:
        self._idle_flush_scheduled = False
        if not self._waiters or self._state is not WriterState.OPEN or not self._batching:
            return
        if self._adaptive and not self._batches_in_flight:
            self._flush(FlushTrigger.IDLE)
        elif self._timer is None:  # a batch left meanwhile (maxRecords/maxSize): maxDelay bounds the rest
            assert self._loop is not None
            self._arm_timer(self._loop, self._loop.time())

    def _on_timer(self) -> None:
        self._timer = None
        if self._waiters and self._state is WriterState.OPEN:
            self._flush(FlushTrigger.MAX_DELAY)

    def _flush(self, trigger: FlushTrigger) -> None:
        waiters, sinks, framed, size = self._waiters, self._sinks, self._framed, self._pending_bytes
        self._waiters, self._sinks, self._framed, self._pending_bytes = [], [], [BATCH_HEADER], 0
        loop = self._loop
        assert loop is not None
        if self._adaptive and self._timer is not None:
            # Nothing waits any more. Pulsar's timer (delay mode) ticks on regardless; the adaptive
            # mode arms one whenever records queue behind an in-flight batch (at 1 transaction in
            # flight: every transaction), and its empty tick was a wasted loop wake-up each time.
            self._timer.cancel()
            self._timer = None
        if self._metrics is not None:
            self._metrics.on_flush(trigger, len(waiters), size, loop.time() - self._oldest_at)
        self._batches_in_flight += 1
        if self._add_notify is not None:
            # Settled by the ledger in the step that confirms the write; ``tracker`` only lets
            # flush() and close() wait for it (nothing is attached to it on this path).
            tracker: asyncio.Future[LedgerPosition] = loop.create_future()
            self._in_flight.add(tracker)
            try:
                self._add_notify(b"".join(framed), partial(self._batch_settled, waiters, sinks, tracker))
            except Exception as exc:  # refused at the call (closed or failed ledger): the entry failed
                self._batch_settled(waiters, sinks, tracker, None, exc)
        else:
            task = self._start_entry(loop, b"".join(framed))
            self._in_flight.add(task)
            task.add_done_callback(partial(self._on_batch_written, waiters, sinks))
        if trigger is FlushTrigger.IDLE and self._start_writes is not None:
            # The idle flush runs at the end of a loop turn and nothing of this writer is in flight:
            # the turn's records are all in this entry, so waiting another turn for the ledger's
            # flush task to submit it only adds latency (it was the batched log's one extra turn).
            self._start_writes()

    def _start_entry(self, loop: asyncio.AbstractEventLoop, data: bytes) -> asyncio.Future[LedgerPosition]:
        # The ledger's append is a future (no task needed); a refusal at the call (closed or failed
        # ledger) becomes that entry's failure, reported to its records like a failed write.
        try:
            appended = self._ledger.add_entry(data)
            if isinstance(appended, asyncio.Future):
                return appended  # the managed ledger's own future: ensure_future's checks cost more
            return asyncio.ensure_future(appended, loop=loop)
        except Exception as exc:
            failed: asyncio.Future[LedgerPosition] = loop.create_future()
            failed.set_exception(exc)
            return failed

    def _on_batch_written(
        self,
        waiters: list[asyncio.Future[WritePosition]],
        sinks: list[PositionSink | None],
        task: asyncio.Future[LedgerPosition],
    ) -> None:
        self._in_flight.discard(task)
        error = _failure(task)
        self._settle_batch(waiters, sinks, None if error is not None else task.result(), error)

    def _batch_settled(
        self,
        waiters: list[asyncio.Future[WritePosition]],
        sinks: list[PositionSink | None],
        tracker: asyncio.Future[LedgerPosition],
        position: LedgerPosition | None,
        error: BaseException | None,
    ) -> None:
        self._in_flight.discard(tracker)
        self._settle_batch(waiters, sinks, position, error)
        if error is not None:
            tracker.set_exception(error)
            tracker.exception()  # retrieved: flush() and close() only wait for it
        else:
            tracker.set_result(position)  # type: ignore[arg-type]

    def _settle_batch(
        self,
        waiters: list[asyncio.Future[WritePosition]],
        sinks: list[PositionSink | None],
        position: LedgerPosition | None,
        error: BaseException | None,
    ) -> None:
        self._batches_in_flight -= 1
        if error is not None or position is None:
            if error is None:
                error = BufferedWriterClosedError("the ledger settled a batch without a position or an error")
            if self._metrics is not None:
                self._metrics.on_failed(len(waiters))
            self._settle_failed(waiters, sinks, error)
            self._after_batch()
            return
        ledger_id, entry_id, size = position.ledger_id, position.entry_id, len(waiters)
        if self._metrics is not None:
            self._metrics.on_written(size, batched=True)
        self._last_settled = (ledger_id, entry_id)
        packed = pack_position(ledger_id, entry_id, size, 0)
        for index, waiter in enumerate(waiters):
            if not waiter.done():
                waiter.set_result(WritePosition(ledger_id, entry_id, size, index))
            sink = sinks[index]
            if sink is not None:
                sink.append(packed + index)
        self._after_batch()

    def _after_batch(self) -> None:
        if self._waiters and self._adaptive and not self._batches_in_flight and self._batching:
            # The ledger just went idle: what accumulated meanwhile leaves at the end of this loop
            # turn, together with the records this entry's callers write as soon as they wake (their
            # wake-ups were queued just above, so before the flush). Flushing before they woke split a
            # steady set of writers into two alternating halves, each paying a ledger write.
            assert self._loop is not None
            self._schedule_idle_flush(self._loop)
        self._signal_progress()

    @staticmethod
    def _settle_failed(
        waiters: list[asyncio.Future[WritePosition]], sinks: list[PositionSink | None], error: BaseException
    ) -> None:
        for waiter, sink in zip(waiters, sinks, strict=True):
            if not waiter.done():
                waiter.set_exception(error)
            if sink is not None:
                sink.append(FAILED)

    def _signal_progress(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None and not progress.done():
            progress.set_result(None)

    def _write_plain(
        self, loop: asyncio.AbstractEventLoop, data: bytes, sink: PositionSink | None
    ) -> asyncio.Future[WritePosition]:
        # The caller gets its own future: cancelling the caller must never cancel a ledger write.
        out: asyncio.Future[WritePosition] = loop.create_future()
        task = self._start_entry(loop, data)
        self._in_flight.add(task)
        task.add_done_callback(partial(self._on_plain_written, out, sink))
        return out

    def _on_plain_written(
        self,
        out: asyncio.Future[WritePosition],
        sink: PositionSink | None,
        task: asyncio.Future[LedgerPosition],
    ) -> None:
        self._in_flight.discard(task)
        error = _failure(task)
        if error is not None:
            if self._metrics is not None:
                self._metrics.on_failed(1)
            self._settle_failed([out], [sink], error)
        else:
            position = task.result()
            if self._metrics is not None:
                self._metrics.on_written(1, batched=False)
            if not out.done():
                out.set_result(WritePosition(position.ledger_id, position.entry_id, 0, 0))
            if sink is not None:
                sink.append(pack_position(position.ledger_id, position.entry_id, 0, 0))
            self._last_settled = (position.ledger_id, position.entry_id)
        self._signal_progress()


def _failure(task: asyncio.Future[LedgerPosition]) -> BaseException | None:
    if task.cancelled():
        return BufferedWriterClosedError(
            "the ledger write was cancelled (the ledger is shutting down); the record may not be durable"
        )
    return task.exception()
