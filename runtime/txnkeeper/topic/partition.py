"""One topic partition: a managed ledger of messages and transaction markers, its transaction buffer
and its subscriptions.

Writes are acknowledged only once durable (the ledger group-commits them). A transaction ends on the
partition by a marker entry, written once (idempotent), so a restart replays the outcome; messages
for a transaction that already ended here are refused, which fences zombie producers.

Single-routing-key blocks (contracts §10) reuse that machinery: a block's events are written under a
store-local transaction and its commit marker, all queued in one event-loop turn (one group commit), so
readers see the block only whole; a block left without its marker by a crash is aborted by ``recover``.
The block's entries are placed in one ledger (``add_entries``), so its MessageIds are contiguous.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol, cast

from txnkeeper.aio import failure_of, resolved, settle
from txnkeeper.errors import DataUnreadableError, InvalidTxnStatusError, UnavailableError
from txnkeeper.ledger.errors import LedgerError, NoSuchEntryError
from txnkeeper.ledger.offload.errors import OffloadError
from txnkeeper.ledger.position import Entry, Position
from txnkeeper.ledger.retention import LedgerFacts, Retention
from txnkeeper.topic import snapshot as snapshots
from txnkeeper.topic.policies import HELD_CHECK_INTERVAL, NO_POLICIES, TopicPolicies
from txnkeeper.topic.policy_checks import PolicyChecks
from txnkeeper.topic.records import CorruptRecordError, decode, encode_data, encode_marker, publish_time_ms
from txnkeeper.topic.subscription import Subscription, after_text
from txnkeeper.topic.tailcache import TailCacheBudget
from txnkeeper.topic.txnbuffer import EndedTxn, TransactionBuffer, pack_ended
from txnkeeper.topic.txnfence import LateFence
from txnkeeper.topic.writers import (
    BLOCK_TXN_MOST,
    MAX_EVENT_NUMBER,
    Duplicate,
    InFlight,
    WaitFor,
    WriterFencedError,
    WriterStateLostError,
    WriterTable,
    in_range,
    shown,
    validate_writer_key,
)
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)
# How a ledger append settled: (position, None) once durable, (None, error) if the write failed.
WriteNotify = Callable[[Position | None, BaseException | None], None]

REPLAY_BATCH = 1000
HOUSEKEEPING_INTERVAL = 10.0  # seconds between policy checks (trims, TTL, backlog quota): the default
# A snapshot of the transaction buffer is taken once this many entries were written since the last one
# (and at housekeeping and close when anything was): a restart replays at most about this many entries
# plus one housekeeping interval of traffic. With more outcomes kept than SNAPSHOT_GROWTH times that,
# the next one waits for outcomes / SNAPSHOT_GROWTH entries instead (as the coordinator's txn-log
# snapshot does): a snapshot copies and writes every outcome (41 bytes each, txnbuffer.ENDED_ROW), so a
# topic whose outcomes are never trimmed (no subscription) would otherwise spend a share of its CPU and
# disk on snapshots that grows without bound, while a restart loads those outcomes anyway, so
# replaying a quarter as many entries more keeps recovery in the same order.
SNAPSHOT_EVERY_ENTRIES = 20_000
SNAPSHOT_GROWTH = 4
# Upper bounds of the txnkeeper_srk_block_bytes histogram's buckets.
BLOCK_BYTES_BUCKETS = (1024, 16 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class BlockResult:
    """What DataAppended answers: the writer's previous last event number, the block's first
    MessageId (None for a duplicate the store no longer remembers) and whether it was a duplicate."""

    previous: int
    first_message_id: Position | None
    duplicate: bool


@dataclass(slots=True)
class BlockStats:
    """Counters behind the txnkeeper_srk_* metrics of one partition."""

    commits: int = 0
    events: int = 0
    duplicate_blocks: int = 0
    duplicate_sends: int = 0
    orphan_aborts: int = 0
    block_bytes_sum: int = 0
    # one count per BLOCK_BYTES_BUCKETS bound, plus one for larger blocks
    block_bytes_counts: list[int] = field(default_factory=lambda: [0] * (len(BLOCK_BYTES_BUCKETS) + 1))

    def observe_block(self, size: int, events: int) -> None:
        self.commits += 1
        self.events += events
        self.block_bytes_sum += size
        for i, bound in enumerate(BLOCK_BYTES_BUCKETS):
            if size <= bound:
                self.block_bytes_counts[i] += 1
                return
        self.block_bytes_counts[-1] += 1


class PartitionLedger(Protocol):
    """The managed-ledger operations a partition uses (contracts §1)."""

    name: str

    def add_entry(self, data: bytes) -> Awaitable[Position]: ...

    def add_entries(self, datas: Sequence[bytes]) -> Sequence[Awaitable[Position]]: ...

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]: ...

    def ledger_ids(self) -> list[int]: ...

    def ledger_facts(self) -> list[LedgerFacts]: ...

    async def trim(
        self, retention: Retention | None = None, *, keep_from_ledger: int | None = None
    ) -> list[int]: ...

    def last_confirmed_entry(self) -> Position | None: ...


class Partition:
    """A partition and everything that reads from it."""

    def __init__(
        self,
        topic: str,
        ledger: PartitionLedger,
        snapshot_path: Path | None = None,
        *,
        snapshot_every: int = SNAPSHOT_EVERY_ENTRIES,
        writers: WriterTable | None = None,
        policies: Callable[[], TopicPolicies] | None = None,
        tail_cache: TailCacheBudget | None = None,
    ) -> None:
        self.topic = topic
        # The topic's retention, message TTL and backlog quota as they are now (looked up per check).
        self._policies = policies or (lambda: NO_POLICIES)
        self.writers = writers if writers is not None else WriterTable(topic)
        self.block_stats = BlockStats()
        # Blocks queued to the ledger whose marker's outcome the buffer has not applied yet.
        self._blocks: dict[TxnID, InFlight] = {}
        self._next_block_least = time.time_ns() // 1000
        self.ledger = ledger
        # The ledger's append settled by a callback (ManagedLedger's; test ledgers may lack it): one
        # future less per produced message than add_entry's.
        self._add_notify: Callable[[bytes, WriteNotify], None] | None = getattr(
            ledger, "add_entry_notify", None
        )
        self.buffer = TransactionBuffer()
        self.subscriptions: dict[str, Subscription] = {}
        # Readers (non-durable subscriptions, topic/readers.py): woken like subscriptions, but no
        # policy (retention, TTL, backlog quota) counts them.
        self.readers: set[Subscription] = set()
        # Message TTL and backlog quota checks; the quota's gate holds or refuses sends.
        self.checks = PolicyChecks(
            topic, self, ledger.ledger_facts, self.buffer.first_open_position, self.subscriptions
        )
        self.quota = self.checks.gate
        self.policy_stats = self.checks.stats
        self._ending: dict[TxnID, asyncio.Future[None]] = {}
        # Ended txns whose outcome was forgotten (trimmed) before their deadline: still refused.
        self.late_fence = LateFence()
        self.published_count = 0
        # Recently written entries: subscriptions that keep up read the tail from memory, not disk
        # (the process's budget bounds all topics' together; a partition alone gets its own).
        self._tail = (tail_cache or TailCacheBudget()).cache()
        # Transaction buffer snapshots (None: never taken, every restart replays all live entries).
        self._snapshot_path = snapshot_path
        self._snapshot_every = snapshot_every
        self._since_snapshot = 0
        self._snapshot_task: asyncio.Task[bool] | None = None
        self._snapshot_lock = asyncio.Lock()  # one writer of the file at a time, captures in order
        self._writing: asyncio.Future[None] | None = None
        self.replayed_entries = 0  # by the last recover(): what the snapshot did not cover
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this object serves on (the running one at first use)."""
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call per call on CPython
        # 3.11 (its fork check), and every transaction creates futures here.
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    def _load_snapshot(self) -> Position | None:
        """Restore the buffer from the snapshot; the position it covers, or None to replay everything."""
        if self._snapshot_path is None:
            return None
        try:
            loaded = snapshots.read(self._snapshot_path, self.topic)
        except snapshots.SnapshotError as exc:
            log.warning("%s; rebuilding it by a full replay of %s", exc, self.topic)
            return None
        if loaded is None:
            return None
        last = self.ledger.last_confirmed_entry()
        if last is None or loaded.covers > last:
            log.warning(
                "transaction buffer snapshot %s covers up to %s but the ledger of %s ends at %s; "
                "ignoring it and rebuilding it by a full replay",
                self._snapshot_path,
                loaded.covers,
                self.topic,
                last,
            )
            return None
        self.buffer.restore(loaded.ended, loaded.open)
        self._next_block_least = max(self._next_block_least, loaded.next_block_txn)
        for row in loaded.writers:
            writer_id, last_number, last_first, ledger_id, entry_id, active = row
            mid = Position(ledger_id, entry_id) if ledger_id >= 0 and entry_id >= 0 else None
            if not self.writers.restore_row(writer_id, last_number, last_first, mid, active):
                log.warning(
                    "transaction buffer snapshot %s: writer or producer %r of %s has last number %d, above"
                    " 2^63 - 1 (%d), which an older release accepted; its de-duplication state is ignored"
                    " (the name continues as a new one; its messages stay readable)",
                    self._snapshot_path,
                    writer_id,
                    self.topic,
                    last_number,
                    MAX_EVENT_NUMBER,
                )
        for txn_id in self.buffer.ended_ids():
            self._saw_block_txn(txn_id)
        live = self.ledger.ledger_ids()
        if live:  # outcomes whose markers were trimmed since the snapshot: forgotten, but still fenced
            for txn_id, deadline_ms in self.buffer.forget_before(Position(live[0], -1)):
                self.late_fence.add(txn_id, deadline_ms)
        return loaded.covers

    async def recover(self) -> None:
        """Rebuild the transaction buffer: from the snapshot if there is a usable one, then from the
        live entries after it (markers say how each txn ended)."""
        after = await asyncio.to_thread(self._load_snapshot)
        replayed = 0
        block_starts: dict[TxnID, Position] = {}  # a block's first entry, for its writer's state
        out_of_range: dict[str, list[tuple[Position, int]]] = {}  # producer -> its unusable sends
        while True:
            try:
                entries = await self.read_after(after, REPLAY_BATCH)
            except OffloadError as exc:
                # Never replayed around: a marker in the unreadable entries decides what may be read.
                raise DataUnreadableError(
                    f"topic {self.topic!r} cannot be opened: rebuilding its transaction state needs the "
                    f"entries {after_text(after)}, and reading them from the offload tier failed: {exc}"
                ) from exc
            if not entries:
                break
            replayed += len(entries)
            for position, data in entries:
                record = decode(data, self.topic, position)
                txn_id = record.txn_id
                if txn_id is not None:
                    if record.is_marker:
                        self.buffer.ended(txn_id, record.commit, position, record.deadline_ms)
                        start = block_starts.pop(txn_id, None)
                        if record.writer_id and record.commit:
                            # A block's events and marker are queued back to back in one ledger
                            # (append_block), so its first event is its count of entries before the
                            # marker: also when a snapshot covers some or all of them, which this
                            # replay then never sees (their first entry seen here would be wrong).
                            count = record.last_number - record.first_number + 1
                            if position.entry_id >= count:
                                start = Position(position.ledger_id, position.entry_id - count)
                            self.writers.observe(
                                record.writer_id, record.first_number, record.last_number, start
                            )
                    else:
                        if not self.buffer.is_open(txn_id):  # its first message: held back since then
                            self.buffer.message_written(txn_id, (publish_time_ms(data) or 0) / 1000 or None)
                        self.buffer.message_durable(txn_id, position)
                        if txn_id.most == BLOCK_TXN_MOST:
                            block_starts.setdefault(txn_id, position)
                            self._saw_block_txn(txn_id)
                elif record.writer_id:
                    if in_range(record.last_number):
                        self.writers.observe(
                            record.writer_id, record.first_number, record.last_number, position
                        )
                    else:
                        out_of_range.setdefault(record.writer_id, []).append((position, record.last_number))
                after = position
        self.replayed_entries = replayed
        for name, sends in out_of_range.items():
            position, number = sends[0]
            log.warning(
                "topic %s: producer %r has %d message(s) with a sequence id above 2^63 - 1 (%d), written by"
                " an older release that accepted them (the first: %d at %s); they stay readable, but"
                " de-duplication ignores them: the name continues from its last sequence id in range"
                " (%s)",
                self.topic,
                name,
                len(sends),
                MAX_EVENT_NUMBER,
                number,
                position,
                self.writers.queued_last(name) if name in self.writers.durable else "none",
            )
        await self._abort_orphan_blocks()
        self._since_snapshot = replayed
        if replayed >= self._snapshot_every:  # so that the next restart does not replay them again
            await self.write_snapshot()

    def _saw_block_txn(self, txn_id: TxnID) -> None:
        if txn_id.most == BLOCK_TXN_MOST and txn_id.least >= self._next_block_least:
            self._next_block_least = txn_id.least + 1

    async def _abort_orphan_blocks(self) -> None:
        """Abort every block whose events were written but whose commit marker was not (a crash
        between them): before the pod reports ready, so no reader waits on it and its writer
        retransmits it (its last event number never covered it)."""
        _, opened = self.buffer.export()
        for txn_id, _ in opened:
            if txn_id.most != BLOCK_TXN_MOST:
                continue
            log.warning(
                "aborting block %s on %s: its events were written without its commit marker",
                txn_id,
                self.topic,
            )
            await self.end_txn(txn_id, commit=False)
            self.block_stats.orphan_aborts += 1

    def capture_snapshot(self) -> snapshots.BufferSnapshot | None:
        """The buffer's state and the position it covers, or None while a marker is being written.

        Taken synchronously: every marker up to the last confirmed entry has been applied to the buffer
        when no end is in flight (an end applies its outcome in the same step it leaves ``_ending``)."""
        if self._ending:
            return None
        covers = self.ledger.last_confirmed_entry()
        if covers is None:
            return None
        ended, opened = self.buffer.export()
        # A block whose marker is durable (so covered) but whose completion has not run yet is
        # recorded as committed: a restart must not find it open and abort it.
        settled: list[EndedTxn] = []
        for txn_id, flight in self._blocks.items():
            done = flight.done
            if done.done() and not done.cancelled() and done.exception() is None:
                settled.append(EndedTxn(txn_id, True, done.result(), 0))
        if settled:
            ended += pack_ended(settled)
            gone = {txn.txn_id for txn in settled}
            opened = [(txn_id, first) for txn_id, first in opened if txn_id not in gone]
        return snapshots.BufferSnapshot(
            self.topic,
            covers,
            ended,
            opened,
            self.writers.snapshot_rows(),
            self._next_block_least,
        )

    async def write_snapshot(self) -> bool:
        """Persist a snapshot now if one can be captured; whether one was written."""
        path = self._snapshot_path
        if path is None:
            return False
        async with self._snapshot_lock:
            captured = self.capture_snapshot()
            if captured is None:
                return False
            written_before = self._since_snapshot
            if self._writing is not None and not self._writing.done():
                # A write whose waiter was cancelled still runs in its thread: never two at once.
                await asyncio.wait([self._writing])
            self._writing = asyncio.ensure_future(asyncio.to_thread(snapshots.write, path, captured))
            await asyncio.shield(self._writing)
            self._since_snapshot -= written_before
            return True

    def _count_written(self) -> None:
        self._since_snapshot += 1
        if (
            self._since_snapshot >= self._snapshot_every
            and self._since_snapshot * SNAPSHOT_GROWTH >= self.buffer.ended_count
            and self._snapshot_path is not None
            and (self._snapshot_task is None or self._snapshot_task.done())
            and not self._ending
        ):
            self._snapshot_task = asyncio.get_running_loop().create_task(self._snapshot_in_background())

    async def _snapshot_in_background(self) -> bool:
        try:
            return await self.write_snapshot()
        except Exception:  # the ledger still has everything: the next restart only replays more
            log.exception("writing the transaction buffer snapshot of %s failed; retrying later", self.topic)
            return False

    async def close(self) -> None:
        """Finish a background snapshot and take a last one, so a clean restart replays nothing."""
        self.quota.fail_held(UnavailableError(f"topic {self.topic} is closing; nothing was written, retry"))
        if self._snapshot_task is not None:
            await asyncio.gather(self._snapshot_task, return_exceptions=True)
        if self._writing is not None:
            await asyncio.wait([self._writing])
        if self._since_snapshot:
            await self._snapshot_in_background()
        self._tail.close()

    async def read_after(self, position: Position | None, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` durable entries after ``position`` (None: from the oldest live entry)."""
        if position is None:
            ledgers = self.ledger.ledger_ids()
            if not ledgers:
                return []
            start = Position(ledgers[0], 0)
        else:
            start = Position(position.ledger_id, position.entry_id + 1)
        tail = self._tail
        data = tail.get(start)
        if data is not None:
            cached: list[tuple[Position, bytes]] = []
            while data is not None and len(cached) < max_entries:
                cached.append((start, data))
                start = Position(start.ledger_id, start.entry_id + 1)
                data = tail.get(start)
            return cached
        last = self.ledger.last_confirmed_entry()
        if last is None or start > last:
            return []
        entries = await self.ledger.read_entries(start, max_entries)
        return [(e.position, e.data) for e in entries]

    async def open_session(self, writer_id: str, owner: str = "", resume: bool = False) -> tuple[int, int]:
        """A new session of writer ``writer_id`` (a single-key writer, or with ``owner`` the instance
        token of a named producer): its epoch, which fences every older session of the id, and the
        id's last durable event (sequence) number.

        The answer waits for the older sessions' blocks and sends already queued to the ledger and
        counts those written: the new session continues after them instead of reusing their numbers
        (the store would answer its blocks as their duplicates and drop them). Their blocks and sends
        not queued yet are refused from now on: ``append_block`` and ``publish_idempotent`` check the
        epoch in the event-loop turn that queues the write."""
        writers = self.writers
        epoch, _ = writers.setup(writer_id, owner=owner, resume=resume)
        pending = writers.in_flight_of(writer_id)
        if pending:
            await asyncio.wait(pending)
        return epoch, writers.settled_last(writer_id)

    async def publish_idempotent(
        self,
        payload: bytes | memoryview,
        key: str,
        producer_name: str,
        sequence_id: int,
        *,
        epoch: int | None = None,
        metadata: bytes = b"",
    ) -> BlockResult:
        """A non-transactional send deduplicated by (producer name, sequence id); with ``epoch``, only
        while that session of the name is its newest (checked right before queuing, with no await
        between the check and the queuing, so a newer session's ``open_session`` sees every send
        of an older one it must wait for). ``metadata``: Pulsar's MessageMetadata, stored with it."""
        writers = self.writers
        validate_writer_key(producer_name)
        if not self.quota.open:  # the backlog quota holds or refuses it (before it is decided)
            held = self.quota.wait(len(payload))
            if held is not None:
                await held
        while True:  # a retransmission waits for its first send, then is decided again
            if epoch is not None:
                writers.check_epoch(producer_name, epoch, producer=True)
            decision = writers.decide_send(producer_name, sequence_id)
            if isinstance(decision, WaitFor):
                await asyncio.wait([decision.future])
                continue
            break
        if isinstance(decision, Duplicate):
            if decision.first_message_id is not None:
                what = f"send with sequence id {sequence_id}"
                where = decision.first_message_id
                await self._check_duplicate(producer_name, what, "send", where, events=[payload], key=key)
            self.block_stats.duplicate_sends += 1
            return BlockResult(decision.previous, decision.first_message_id, True)
        previous = writers.queued_last(producer_name)
        data = encode_data(
            payload,
            key,
            None,
            int(time.time() * 1000),
            producer_name=producer_name,
            sequence_id=sequence_id,
            metadata=metadata,
        )
        future = self.ledger.add_entry(data)
        flight = InFlight(producer_name, sequence_id, sequence_id, _as_future(future), _as_future(future))
        writers.began(flight)
        try:
            position = await flight.done
        finally:
            writers.settled(flight)
        self._remember(position, data)
        self.published_count += 1
        self._count_written()
        self._notify()
        return BlockResult(previous, position, False)

    async def append_block(
        self,
        writer_id: str,
        first: int,
        events: list[bytes],
        key: str,
        size: int,
        *,
        epoch: int | None = None,
    ) -> BlockResult:
        """Write ``events`` as one block of ``writer_id`` starting at event number ``first``, whole
        or not at all; a block at or below the writer's last event number is answered unwritten. With
        ``epoch``, only while that session of the writer is its newest (checked in the loop turn that
        queues the block, as for ``publish_idempotent``)."""
        writers = self.writers
        last = first + len(events) - 1
        if not self.quota.open:  # the backlog quota holds or refuses it (before it is decided)
            held = self.quota.wait(size)
            if held is not None:
                await held
        while True:  # a retransmission waits for its block in flight, then is decided again
            if epoch is not None:
                writers.check_epoch(writer_id, epoch)
            decision = writers.decide(writer_id, first, last)
            if isinstance(decision, WaitFor):
                await asyncio.wait([decision.future])
                continue
            break
        if isinstance(decision, Duplicate):
            if decision.first_message_id is not None:
                what = f"block {first}..{last}"
                where = decision.first_message_id
                await self._check_duplicate(writer_id, what, "block", where, events=events, key=key)
            self.block_stats.duplicate_blocks += 1
            return BlockResult(decision.previous, decision.first_message_id, True)
        previous = writers.queued_last(writer_id)
        txn_id = TxnID(BLOCK_TXN_MOST, self._next_block_least)
        self._next_block_least += 1
        now = int(time.time() * 1000)
        self.buffer.message_written(txn_id)
        encoded = [encode_data(payload, key, txn_id, now) for payload in events]
        marker = encode_marker(txn_id, True, 0, (writer_id, first, last))
        # One call queues the events and the marker back to back in one ledger (a due rollover runs
        # before them, never inside): one group commit, and the events' MessageIds are the contiguous
        # entry ids first .. first + count - 1 that DataAppended and the writer's dedup answer imply.
        *futures, marker_future = [_as_future(f) for f in self.ledger.add_entries([*encoded, marker])]
        flight = InFlight(writer_id, first, last, marker_future, futures[0])
        writers.began(flight)
        self._blocks[txn_id] = flight
        try:
            positions = await asyncio.gather(*futures, marker_future)
        except BaseException:
            # The marker is not durable: the block stays unresolved (a reader never sees it) until
            # recovery aborts it; its writer retransmits (its last event number never moved).
            del self._blocks[txn_id]
            writers.settled(flight)
            raise
        marker_position = positions[-1]
        self.buffer.ended(txn_id, True, marker_position, 0)
        del self._blocks[txn_id]
        writers.settled(flight)
        for position, data in zip(positions, [*encoded, marker], strict=True):
            self._remember(position, data)
        self.published_count += len(events)
        self.block_stats.observe_block(size, len(events))
        for _ in positions:
            self._count_written()
        self._notify()
        return BlockResult(previous, positions[0], False)

    async def _check_duplicate(
        self,
        writer_id: str,
        what: str,
        kind: str,
        first_message_id: Position,
        *,
        events: Sequence[bytes | memoryview],
        key: str,
    ) -> None:
        """``what`` has the numbers of ``writer_id``'s last block (send), written at
        ``first_message_id``: it is that block's retransmission only if the entries there hold the
        same events. Numbers alone cannot tell: a session of the id that was cut off before its block
        reached the store, and came back after another session of the id wrote those numbers, would
        be answered with the other one's message ids and its own events never written. So other
        events are refused ``WRITER_FENCED``, and entries that cannot be read back (damaged, a tier
        that fails) ``WRITER_STATE_LOST`` (outcome unknown), never answered as applied. Entries trimmed
        since (every subscription acknowledged them and their ledger was deleted) cannot be compared:
        the retransmission is then answered from the writer state by its numbers, as before this
        check (the snapshot keeps that state across trimming; contracts §10 says what remains open)."""
        live = self.ledger.ledger_ids()
        if not live or first_message_id.ledger_id < live[0]:
            return
        try:
            held = await self._entries_at(first_message_id, len(events))
            records = [decode(data, self.topic, first_message_id) for data in held]
        except (LedgerError, OffloadError, DataUnreadableError, CorruptRecordError, OSError) as exc:
            raise WriterStateLostError(
                f"{what} of {shown(writer_id)} on topic {self.topic!r} has the numbers of the last {kind}"
                f" the store holds for this id (at {first_message_id.ledger_id}:{first_message_id.entry_id}),"
                f" whose entries cannot be read back to tell whether it is the same ({exc}); nothing was"
                " written and its outcome is unknown: read the topic, then continue with a new writer id"
                " (producer name)"
            ) from exc
        if any(r.is_marker or r.payload != e or r.key != key for r, e in zip(records, events, strict=True)):
            raise WriterFencedError(
                f"{what} of {shown(writer_id)} on topic {self.topic!r} has the numbers of the last {kind}"
                f" the store holds for this id (at {first_message_id.ledger_id}:{first_message_id.entry_id})"
                " but other events: another session with the same writer id (or producer name) wrote"
                " those numbers since this one sent them; nothing was written and this session is fenced"
                " (run one instance per writer id or producer name)"
            )

    async def _entries_at(self, start: Position, count: int) -> list[bytes]:
        """The ``count`` entries from ``start`` on in its ledger (the tail cache first)."""
        wanted = [Position(start.ledger_id, start.entry_id + i) for i in range(count)]
        cached = [self._tail.get(position) for position in wanted]
        if None not in cached:
            return cast(list[bytes], cached)
        entries = await self.ledger.read_entries(start, count)
        if [entry.position for entry in entries] != wanted:
            found = ", ".join(f"{e.position.ledger_id}:{e.position.entry_id}" for e in entries)
            raise NoSuchEntryError(
                f"entries {start.ledger_id}:{start.entry_id}..{start.entry_id + count - 1} are not in the"
                f" topic's ledgers (a read from there found {found or 'nothing'})"
            )
        return [entry.data for entry in entries]

    async def publish(self, payload: bytes, key: str, txn_id: TxnID | None) -> Position:
        return await self.publish_future(payload, key, txn_id)

    def publish_future(
        self, payload: bytes, key: str, txn_id: TxnID | None, metadata: bytes = b""
    ) -> asyncio.Future[Position]:
        """Write one message; the future resolves with its position once it is durable (refusals
        raise at the call)."""
        done: asyncio.Future[Position] = self._loop().create_future()
        self.publish_notify(payload, key, txn_id, partial(_settle_write, done), metadata=metadata)
        return done

    def publish_notify(
        self,
        payload: bytes | memoryview,
        key: str,
        txn_id: TxnID | None,
        notify: WriteNotify,
        *,
        metadata: bytes = b"",
    ) -> None:
        """Write one message; ``notify(position, None)`` once it is durable, ``notify(None, error)``
        if the write failed. Refusals raise at the call.

        A plain function, not a coroutine: every produce is one, and a coroutine per produce (plus the
        task the server wrapped it in) was a measurable part of a store pod's CPU. The message is
        queued at the call; what follows its write (tail cache, counts, waking dispatch, then
        ``notify``) runs in the step that confirms it, so a caller that answers from ``notify`` needs
        no future of its own.
        """
        if txn_id is not None:
            self._check_accepts(txn_id)
        if not self.quota.open and not self.quota.admit(
            # held: a copy, not a view that would keep the whole read it came in alive meanwhile
            len(payload),
            partial(self._resume_publish, (bytes(payload), key, metadata), txn_id, notify),
        ):
            return  # held by the backlog quota: written (or refused) by _resume_publish
        self._write_message(payload, key, txn_id, notify, metadata)

    def _check_accepts(self, txn_id: TxnID) -> None:
        if not self.buffer.accepts_message(txn_id) or self.late_fence.holds(txn_id):
            raise InvalidTxnStatusError(f"transaction {txn_id} already ended on {self.topic}")

    def _resume_publish(
        self,
        message: tuple[bytes, str, bytes],
        txn_id: TxnID | None,
        notify: WriteNotify,
        failure: BaseException | None,
    ) -> None:
        """A send the backlog quota held (``message``: payload, key, Pulsar metadata): written now (its
        transaction checked again: it may have ended meanwhile), or failed with ``failure``."""
        try:
            if failure is not None:
                raise failure
            if txn_id is not None:
                self._check_accepts(txn_id)
            payload, key, metadata = message
            self._write_message(payload, key, txn_id, notify, metadata)
        except Exception as exc:
            notify(None, exc)

    def _write_message(
        self,
        payload: bytes | memoryview,
        key: str,
        txn_id: TxnID | None,
        notify: WriteNotify,
        metadata: bytes = b"",
    ) -> None:
        if txn_id is not None:
            self.buffer.message_written(txn_id)
        data = encode_data(payload, key, txn_id, int(time.time() * 1000), metadata=metadata)
        written = partial(self._published, data, txn_id, notify)
        if self._add_notify is not None:
            self._add_notify(data, written)
        else:
            _as_future(self.ledger.add_entry(data)).add_done_callback(partial(notify_from_future, written))

    def _published(
        self,
        data: bytes,
        txn_id: TxnID | None,
        notify: WriteNotify,
        position: Position | None,
        failure: BaseException | None,
    ) -> None:
        if failure is not None or position is None:
            notify(None, failure or RuntimeError("the ledger settled a write without a position"))
            return
        self._remember(position, data)
        self.published_count += 1
        self._count_written()
        if txn_id is None:  # a transaction's message is dispatched only once its commit marker is written
            self._notify()
        else:
            self.buffer.message_durable(txn_id, position)
        notify(position, None)

    def end_txn(self, txn_id: TxnID, commit: bool, deadline_ms: int = 0) -> asyncio.Future[None]:
        """Write the transaction's marker (once) and let its messages be dispatched or dropped.

        ``deadline_ms`` (the txn's timeout deadline, in the marker) keeps it refusing the txn's late
        messages until then, even once its outcome is forgotten. A plain function returning a future
        (the marker's write finishes by a callback, whoever waits): no coroutine per end."""
        if self.buffer.is_ended(txn_id):
            committed = self.buffer.outcome(txn_id).value == "committed"
            if committed != commit:
                raise InvalidTxnStatusError(
                    f"transaction {txn_id} already ended the other way on {self.topic}"
                )
            return resolved(None)
        in_progress = self._ending.get(txn_id)
        if in_progress is not None:
            return asyncio.shield(in_progress)
        self.buffer.begin_end(txn_id)
        marker = encode_marker(txn_id, commit, deadline_ms)
        done: asyncio.Future[None] = self._loop().create_future()
        self._ending[txn_id] = done
        settled = partial(self._marker_written, (txn_id, commit, deadline_ms, marker), done)
        try:
            if self._add_notify is not None:  # settled in the step that confirms the write
                self._add_notify(marker, settled)
            else:
                _as_future(self.ledger.add_entry(marker)).add_done_callback(
                    partial(notify_from_future, settled)
                )
        except BaseException:
            del self._ending[txn_id]
            self.buffer.cancel_end(txn_id)
            raise
        return done

    def _marker_written(
        self,
        end: tuple[TxnID, bool, int, bytes],
        done: asyncio.Future[None],
        position: Position | None,
        failure: BaseException | None,
    ) -> None:
        txn_id, commit, deadline_ms, marker = end
        del self._ending[txn_id]
        if failure is not None or position is None:
            self.buffer.cancel_end(txn_id)
            settle(done, failure or RuntimeError("the ledger settled a marker without a position"), None)
            return
        self._remember(position, marker)
        self.buffer.ended(txn_id, commit, position, deadline_ms)
        settle(done, None, None)
        self._count_written()
        self._notify()

    async def housekeeping(self) -> None:
        """Apply the topic's policies (docs/contracts.md §6, "Topic policies"), in this order:
        forget the committed outcomes no ticket can need any more; acknowledge, on every subscription,
        what the message TTL expired; check the backlog quota (holding or refusing producers, or
        evicting the slowest subscriptions); snapshot the transaction buffer if anything was written;
        trim what every subscription is done with and retention lets go (never a ledger holding an open
        transaction's message), and forget the aborted outcomes whose markers went with it."""
        self.policy_stats.checks += 1
        self.writers.expire()
        self.buffer.expire()
        policies = self._policies()
        if self.subscriptions and policies.message_ttl_seconds > 0:
            await self.checks.expire_messages(policies.message_ttl_seconds)
        await self.checks.check_backlog(policies.backlog_quota)
        snapshotted = True
        if self._since_snapshot:
            snapshotted = await self._snapshot_in_background()
        await self._trim(policies.retention, snapshotted)

    async def _trim(self, retention: Retention | None, snapshotted: bool) -> None:
        if retention is None and not self.subscriptions:
            return  # no retention configured: retained messages wait for a future subscription
        if not snapshotted and self.writers.durable:
            # Writer state lives in the snapshot once its records are trimmed: trim next time.
            return
        first_open = self.buffer.first_open_position()
        trimmed = await self.ledger.trim(
            retention, keep_from_ledger=first_open.ledger_id if first_open is not None else None
        )
        self.policy_stats.trimmed_ledgers += len(trimmed)
        live = self.ledger.ledger_ids()
        if live:
            for txn_id, deadline_ms in self.buffer.forget_before(Position(live[0], -1)):
                self.late_fence.add(txn_id, deadline_ms)

    async def housekeeping_forever(self, interval: float = HOUSEKEEPING_INTERVAL) -> None:
        while True:
            # While the quota holds or refuses sends, a drained backlog lets them go within a second.
            await asyncio.sleep(interval if self.quota.open else min(interval, HELD_CHECK_INTERVAL))
            try:
                await self.housekeeping()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping of partition %s failed; retrying later", self.topic)

    def _remember(self, position: Position, data: bytes) -> None:
        self._tail.remember(position, data)

    def attach(self, subscription: Subscription) -> None:
        self.subscriptions[subscription.name] = subscription

    def _notify(self) -> None:
        for subscription in self.subscriptions.values():
            subscription.notify()
        for reader in self.readers:
            reader.notify()

    async def last_message_position(self, scan_limit: int = 4096) -> Position | None:
        """The newest entry that is a message, not a transaction marker (Pulsar's last message id),
        looked for among the last ``scan_limit`` entries of the newest ledger that has any; None if
        none is."""
        last = self.ledger.last_confirmed_entry()
        scanned = 0
        while last is not None and last.entry_id >= 0 and scanned < scan_limit:
            start = max(0, last.entry_id - 63)
            entries = await self.ledger.read_entries(
                Position(last.ledger_id, start), last.entry_id - start + 1
            )
            for entry in reversed(entries):
                if not decode(entry.data, self.topic, entry.position).is_marker:
                    return entry.position
            scanned += len(entries)
            last = Position(last.ledger_id, start - 1)
        return None


def notify_from_future(notify: WriteNotify, written: asyncio.Future[Position]) -> None:
    """A ledger future's outcome handed to an ``add_entry_notify``-style callback."""
    failure = failure_of(written)
    notify(None if failure is not None else written.result(), failure)


def _settle_write(
    done: asyncio.Future[Position], position: Position | None, failure: BaseException | None
) -> None:
    """A ``WriteNotify`` that settles ``done`` (unless its waiter gave up)."""
    if done.done():
        return
    if position is not None:
        done.set_result(position)
    else:
        done.set_exception(failure or RuntimeError("the ledger settled a write without a position"))
        done.exception()  # the waiter may be gone: never "exception was never retrieved"


def _as_future(awaitable: Awaitable[Position]) -> asyncio.Future[Position]:
    """The ledger's append as a future (ManagedLedger returns one already; test ledgers may not)."""
    return asyncio.ensure_future(awaitable)
