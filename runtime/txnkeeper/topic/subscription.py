"""A subscription: a durable cursor on a partition, shared consumers, plain and transactional acks.

Dispatch runs in one task per subscription, woken when something may have become deliverable (a
write, a transaction end, permits, a redelivery). It reads entries in order from the read position,
skips markers and aborted messages (acknowledging them so the cursor can advance), stops at the first
message of an unresolved transaction (the transaction buffer's order rule), and never hands out a
message that is deleted or pending in a transaction.

Memory: a message out with a consumer is remembered by its position only, never its payload; one that
must go out again (its consumer left, asked for redelivery, or the transaction that acked it aborted)
is read again from the partition. A subscription therefore holds a few dozen bytes per unacknowledged
message, not the message (a consumer that never read kept the whole topic in memory, issue 25). Pushes
go only to consumers that are ``ready`` (their connection is not backed up): dispatch waits for one,
and is woken by ``notify`` when one is.

A read that fails because the stored entries cannot be read (offloaded tier data damaged or
unreachable, a damaged local record) is never read around: dispatch stops at that position and
retries with backoff (0.1 s doubling to 5 s). After 4 failed reads in a row the connected consumers
are told (``Consumer.read_failed``, the wire's ConsumerError), and again after each later failed retry,
so a consumer waiting in ``receive`` gets an error naming the position within seconds instead of
waiting forever; delivery resumes by itself once a read succeeds. A redelivery's read that fails is
handled alike.

Batched entries (Pulsar's producer batching) may be acknowledged a batch index at a time
(``IndexAck``), plainly (the cursor keeps the indexes left) or in a transaction (pending per index).
Such an entry stays out with its consumer until every index is acknowledged or pending; when it goes
out again, the MESSAGE says which indexes are left (Pulsar's ack set), so a client never gets back a
message acknowledged already, and a transaction acknowledging an index that is acknowledged or
pending elsewhere fails with a conflict (it must abort): its output is never committed twice.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from typing import Any

from txnkeeper.aio import DeferredBatch, failure_of, resolved, settle
from txnkeeper.errors import BadRequestError, ConsumerBusyError, InvalidTxnStatusError, TxnConflictError
from txnkeeper.ledger.ackset import full_mask, lowest_index, mask_to_words, words_to_mask
from txnkeeper.ledger.errors import CorruptEntryError, NoSuchEntryError
from txnkeeper.ledger.offload.errors import OffloadError
from txnkeeper.ledger.position import Position
from txnkeeper.topic.pending_acks import PendingAcks, TxnAcks
from txnkeeper.topic.ports import (
    Consumer,
    Cursor,
    IndexAck,
    PartitionReader,
    PendingAckLog,
    RecoveredPendingAck,
)
from txnkeeper.topic.records import DecodedRecord, batch_size_of, decode
from txnkeeper.topic.txnbuffer import TransactionBuffer, TxnOutcome
from txnkeeper.topic.txnfence import LateFence
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)

# Pulsar's subscription types (CommandSubscribe.SubType), as add_consumer takes them.
EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = "Exclusive", "Shared", "Failover", "Key_Shared"
MODES = (EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED)
READ_BATCH = 256
# Bytes a dispatch pass reads at most, estimated from the sizes of the entries it last read (Pulsar's
# dispatcherMaxReadSizeBytes; its dispatcherMaxReadBatchSize is READ_BATCH's counterpart). Without it a
# topic of 10 KB entries read 2.5 MB per pass per subscription: 16 consumers subscribing together took
# a store's resident set up by ~12 MB for a moment in the memory soak, and what their connections could
# not take yet was read for nothing.
READ_BATCH_BYTES = 512 * 1024
BATCH_SIZES_REMEMBERED = 10_000  # batched entries whose size an index ack looked up (read once each)
SETTLE_INTERVAL = 0.05  # seconds between batched cursor updates / record deletions
ENDED_MEMORY = 100_000
# A failed read of the next entries (module docstring): retried after 0.1 s, doubling up to 5 s; the
# consumers are told after the 4th failure in a row (0.7 s of waits plus the reads' own time).
READ_RETRY_FIRST_SECONDS = 0.1
READ_RETRY_MAX_SECONDS = 5.0
READ_FAILURES_BEFORE_ERROR = 4
# What makes a read fail that no retry soon may cure, and that a consumer must hear of.
READ_FAILURES = (OffloadError, CorruptEntryError, NoSuchEntryError, OSError)


def after_text(position: Position | None) -> str:
    """A read position as users are told it: the entries after it (None: from the first)."""
    return f"after {position}" if position is not None else "from the topic's first entry"


@dataclass
class _ReadFailure:
    """The read of the entries after ``after`` failing, since ``since`` (loop time)."""

    after: Position | None
    since: float
    failures: int = 0
    # Until the retry timer fires. A flag, not a deadline compared with loop.time(): uvloop's timers
    # fire on a millisecond clock, up to a rounding before such a deadline, and a retry refused then
    # would wait for a wake that never comes.
    waiting: bool = False


# A committed transaction's acks, applied to the cursor in batches: (txn, entries, cumulative, indexes).
_Settled = tuple[TxnID, list[Position], Position | None, list[IndexAck]]


class Subscription:
    """One named subscription of one partition."""

    def __init__(
        self,
        topic: str,
        name: str,
        *,
        reader: PartitionReader,
        cursor: Cursor,
        buffer: TransactionBuffer,
        pending_log: PendingAckLog,
    ) -> None:
        self.topic = topic
        self.name = name
        self._reader = reader
        self._cursor = cursor
        self._buffer = buffer
        self._pending_log = pending_log
        self._pending = PendingAcks()
        self._entry_bytes = 0  # the mean size of the entries the last dispatch read (0: none read yet)
        # The consumers dispatch may deliver to (in Failover, only the active one).
        self._consumers: OrderedDict[int, Consumer] = OrderedDict()
        # Pulsar's subscription type while it has consumers (add_consumer): all of them share it.
        self._mode: str | None = None
        # Failover: the consumers waiting to become active, by (priority level, arrival).
        self._standby: list[tuple[int, int, Consumer]] = []
        self._active_rank = (0, 0)  # Failover: the active consumer's (priority, arrival)
        # Key_Shared: the consumers in arrival order (a key's consumer is crc32(key) mod their count),
        # and the messages out when they last changed: no new message goes out until those are
        # acknowledged or back, so a key that moved never overtakes its earlier messages.
        self._key_shared = False
        self._key_owners: list[int] = []
        self._key_fence: set[Position] = set()
        self._arrivals = 0
        self._permits: dict[int, int] = {}
        self._unacked: dict[Position, int] = {}  # message out -> the consumer id it went to
        self._redeliver: set[Position] = set()  # to go out again, read again from the partition
        self._redelivery_counts: dict[Position, int] = {}
        self._read_after: Position | None = cursor.mark_delete_position()
        self._ending: dict[TxnID, asyncio.Future[None]] = {}
        self._ended: OrderedDict[TxnID, bool] = OrderedDict()
        # Deadlines of ending/ended txns (when the end said it): what _ended forgets before its
        # deadline goes to the late fence, so a zombie's ack with a still-valid ticket is refused.
        self._end_deadlines: dict[TxnID, int] = {}
        self.late_fence = LateFence()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        where = f"subscription {topic}/{name}"
        # Cursor updates and record deletions are batched (see DeferredBatch): fewer metadata fsyncs.
        self._settler: DeferredBatch[_Settled] = DeferredBatch(
            f"{where} commit settlement", self._settle_commits, SETTLE_INTERVAL
        )
        self._auto_acks: DeferredBatch[Position] = DeferredBatch(
            f"{where} marker acks", self._cursor_delete, SETTLE_INTERVAL
        )
        self._record_deletions: DeferredBatch[TxnID] = DeferredBatch(
            f"{where} pending-ack deletion", self._delete_records, SETTLE_INTERVAL
        )
        self._closed = False
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._read_failure: _ReadFailure | None = None
        self._batch_sizes: OrderedDict[Position, int] = OrderedDict()

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this object serves on (the running one at first use)."""
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call per call on CPython
        # 3.11 (its fork check), and every transaction creates futures here.
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    # --- lifecycle ---------------------------------------------------------------------------------
    async def recover(self, recovered: list[RecoveredPendingAck]) -> None:
        """Re-adopt pending acks; finish the ends the log shows decided but maybe not applied."""
        for txn in recovered:
            if txn.ended is None:
                if txn.individual:
                    self._pending.reserve(txn.txn_id, txn.individual, cumulative=False)
                if txn.cumulative is not None:
                    self._pending.reserve(txn.txn_id, [txn.cumulative], cumulative=True)
                if txn.index_acks:
                    self._pending.reserve_indexes(txn.txn_id, txn.index_acks)
                continue
            if txn.ended:
                await self._apply_commit(txn.individual, txn.cumulative, txn.index_acks)
            self._remember_ended(txn.txn_id, txn.ended)
            await self._pending_log.delete_txn(txn.txn_id)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._dispatch_forever())
        self._wake.set()

    async def close(self) -> None:
        self._closed = True
        for batch in (self._settler, self._auto_acks, self._record_deletions):
            await batch.drain()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def notify(self) -> None:
        self._wake.set()

    # --- consumers ---------------------------------------------------------------------------------
    def add_consumer(
        self, consumer: Consumer, permits: int, *, mode: str = SHARED, priority: int = 0
    ) -> None:
        """``mode``: Pulsar's subscription type (txnkeeper's own consumers are Shared). Every consumer
        of a subscription has the same one; Exclusive admits one consumer. Failover delivers to one
        active consumer, the first by ``priority`` (lower first) then arrival; the others wait and
        the next one takes over, with whatever the previous one had not acknowledged, when it leaves."""
        consumer_id = consumer.consumer_id
        if consumer_id in self._consumers or any(c.consumer_id == consumer_id for _, _, c in self._standby):
            raise ConsumerBusyError(f"consumer id {consumer_id} already subscribed to {self.name}")
        if mode not in MODES:
            raise BadRequestError(f"subscription type {mode!r} is not one of {', '.join(MODES)}")
        current = self._mode
        if current == EXCLUSIVE:
            raise ConsumerBusyError(
                f"subscription {self.name!r} of {self.topic} has an exclusive consumer: use another"
                " subscription, or wait until that consumer closes"
            )
        if current is not None and mode != current:
            raise ConsumerBusyError(
                f"subscription {self.name!r} of {self.topic} is {current} while it has consumers: a"
                f" {mode} consumer cannot join it (use the same type, or another subscription)"
            )
        self._mode = mode
        self._permits[consumer_id] = permits
        self._arrivals += 1
        if mode == FAILOVER:
            self._standby.append((priority, self._arrivals, consumer))
            self._standby.sort(key=lambda waiting: waiting[:2])
            self._elect()
        else:
            self._consumers[consumer_id] = consumer
        if mode == KEY_SHARED:
            self._key_shared = True
            self._key_owners.append(consumer_id)
            self._key_fence = set(self._unacked)
        self._wake.set()

    def remove_consumer(self, consumer_id: int) -> None:
        """The consumer left: its unacknowledged messages go to the others."""
        standby = [w for w in self._standby if w[2].consumer_id != consumer_id]
        if len(standby) != len(self._standby):
            self._standby = standby
            self._permits.pop(consumer_id, None)
            self._forget_mode_if_empty()
            return
        if self._consumers.pop(consumer_id, None) is None:
            return
        self._permits.pop(consumer_id, None)
        if self._key_shared:
            self._key_owners.remove(consumer_id)
            self._key_fence = {p for p, c in self._unacked.items() if c != consumer_id}
        self._redeliver_where(consumer_id)
        if self._mode == FAILOVER:
            self._elect()
        self._forget_mode_if_empty()

    def _forget_mode_if_empty(self) -> None:
        if not self._consumers and not self._standby:
            self._mode = None
            self._key_shared = False
            self._key_fence.clear()

    def _elect(self) -> None:
        """Failover: the first waiting consumer becomes the active one if it ranks before the active
        one (or there is none); a replaced active consumer's unacknowledged messages go out again."""
        if not self._standby:
            return
        priority, arrival, first = self._standby[0]
        active = next(iter(self._consumers.values()), None)
        if active is not None:
            if self._active_rank <= (priority, arrival):
                return
            del self._consumers[active.consumer_id]
            self._redeliver_where(active.consumer_id)
            self._standby.append((*self._active_rank, active))
            self._standby.sort(key=lambda waiting: waiting[:2])
        self._standby.remove((priority, arrival, first))
        self._consumers[first.consumer_id] = first
        self._active_rank = (priority, arrival)
        self._wake.set()

    def consumer_ids(self) -> list[int]:
        """Every attached consumer, active or waiting (Failover)."""
        return [*self._consumers, *(c.consumer_id for _, _, c in self._standby)]

    def holds_transactions(self) -> bool:
        """Whether an open (or ending) transaction holds acks on this subscription."""
        return self._pending.txn_count > 0 or bool(self._ending)

    async def reset(self, mark_delete: Position) -> None:
        """Move the cursor to ``mark_delete`` (Pulsar's seek): what follows it is delivered again,
        acknowledged or not, what precedes it counts as acknowledged. Refused while a transaction
        holds acks here (its commit would apply to a cursor it never saw). What was out with
        consumers is forgotten; consumers that leave on a reset (Pulsar's: their clients subscribe
        again) are dropped, the others receive from the new position."""
        if self.holds_transactions():
            raise ConsumerBusyError(
                f"subscription {self.name!r} of {self.topic} holds acks of open transactions: end them"
                " before seeking"
            )
        # The consumers that leave go first, as Pulsar's broker disconnects them before it resets the
        # cursor: the cursor's new position is visible while it is written, and a message from there
        # pushed to a consumer whose client is about to subscribe again was taken by the client as
        # the old subscription's (it skipped its seek point and delivered the sought message).
        for consumer in [*self._consumers.values(), *(c for _, _, c in self._standby)]:
            if consumer.detach():
                self._standby = [w for w in self._standby if w[2] is not consumer]
                self._consumers.pop(consumer.consumer_id, None)
                self._permits.pop(consumer.consumer_id, None)
                if self._key_shared and consumer.consumer_id in self._key_owners:
                    self._key_owners.remove(consumer.consumer_id)
        self._forget_mode_if_empty()
        await self._cursor.reset(mark_delete)
        self._unacked.clear()
        self._redeliver.clear()
        self._redelivery_counts.clear()
        self._key_fence.clear()
        self._batch_sizes.clear()
        self._read_failure = None
        self._read_after = mark_delete
        self._wake.set()

    def flow(self, consumer_id: int, permits: int) -> None:
        if consumer_id in self._permits:
            self._permits[consumer_id] += permits
            self._wake.set()

    def redeliver_unacknowledged(self, consumer_id: int) -> None:
        self._redeliver_where(consumer_id)

    def redeliver(self, consumer_id: int, positions: list[Position]) -> None:
        """Those of ``positions`` out with ``consumer_id`` go out again (Pulsar's negative ack);
        others (acknowledged meanwhile, or out with another consumer) are left alone."""
        for position in positions:
            if self._unacked.get(position) == consumer_id:
                del self._unacked[position]
                self._redeliver.add(position)
                self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1
        self._wake.set()

    # --- acks --------------------------------------------------------------------------------------
    def ack(
        self,
        positions: list[Position],
        cumulative: bool,
        txn_id: TxnID | None,
        index_acks: list[IndexAck] | None = None,
    ) -> Awaitable[None]:
        """Acknowledge ``positions`` (and batch indexes: ``index_acks``, whose batch sizes come from
        ``batch_size``); the awaitable resolves once the ack is durable.

        A transactional ack is checked, reserved and its record queued at the call (a future, no
        coroutine: it is the hot path of every transaction); refusals raise at the call.
        """
        if cumulative and len(positions) != 1:
            raise TxnConflictError("a cumulative ack names exactly one message")
        cursor = self._cursor
        for position in [*positions, *(a.position for a in index_acks or ())]:
            if not cursor.holds(position) and not cursor.is_deleted(position):
                raise BadRequestError(
                    f"message {position} does not exist on {self.topic} (subscription {self.name!r}): "
                    "acknowledge the ids of messages received from it"
                )
        if txn_id is None:
            return self._plain_ack(positions, cumulative, index_acks or [])
        return self._txn_ack(txn_id, positions, cumulative, index_acks or [])

    async def batch_size(self, position: Position) -> int:
        """How many messages the entry at ``position`` holds (1 unless a Pulsar producer batched
        them): from memory when an index of it is pending or was looked up lately, else read."""
        known = self._pending.batch_size(position) or self._batch_sizes.get(position)
        if known is not None:
            return known
        entries = await self._reader.read_after(Position(position.ledger_id, position.entry_id - 1), 1)
        if not entries or entries[0][0] != position:
            raise BadRequestError(
                f"message {position} does not exist on {self.topic} (subscription {self.name!r}): "
                "acknowledge the ids of messages received from it"
            )
        size = batch_size_of(decode(entries[0][1], self.topic, position))
        self._batch_sizes[position] = size
        while len(self._batch_sizes) > BATCH_SIZES_REMEMBERED:
            self._batch_sizes.popitem(last=False)
        return size

    def _remaining(self, position: Position, batch_size: int) -> int:
        """The batch indexes of ``position`` the cursor has not deleted (0: the whole entry is)."""
        words = self._cursor.ack_set(position)
        if words is None:
            return full_mask(batch_size)
        return words_to_mask(words, batch_size) if words else 0

    async def _plain_ack(
        self, positions: list[Position], cumulative: bool, index_acks: list[IndexAck]
    ) -> None:
        conflict = self._pending.conflict_for_plain(positions, cumulative, index_acks)
        if conflict is not None:
            raise TxnConflictError(conflict)
        if cumulative:  # (a cumulative ack names no batch index: the Pulsar handler splits those)
            (position,) = positions
            await self._cursor_mark_delete(position)
            for done in [p for p in self._unacked if p <= position]:
                self._forget(done)
        else:
            await self._delete_indexes(positions, index_acks)

    def _txn_ack(
        self, txn_id: TxnID, positions: list[Position], cumulative: bool, index_acks: list[IndexAck]
    ) -> asyncio.Future[None]:
        if txn_id in self._ended or txn_id in self._ending or self.late_fence.holds(txn_id):
            raise InvalidTxnStatusError(f"transaction {txn_id} already ended on {self.topic}/{self.name}")
        for position in positions:
            if not cumulative and self._cursor.is_deleted(position):
                raise TxnConflictError(f"message {position} is already acknowledged on {self.name}")
        for ack in index_acks:
            gone = ack.acked & ~self._remaining(ack.position, ack.batch_size)
            if gone:
                raise TxnConflictError(
                    f"batch index {lowest_index(gone)} of message {ack.position} is already acknowledged"
                    f" on {self.name}"
                )
        new = self._pending.reserve(txn_id, positions, cumulative) if positions else []
        try:
            new_indexes = self._pending.reserve_indexes(txn_id, index_acks) if index_acks else []
        except BaseException:
            self._pending.unreserve(txn_id, new, cumulative)
            raise
        done: asyncio.Future[None] = self._loop().create_future()
        if not new and not new_indexes:
            done.set_result(None)
            return done
        try:
            logged = self._pending_log.log_ack(txn_id, new, cumulative, new_indexes or None)
        except BaseException:
            self._pending.unreserve(txn_id, new, cumulative, new_indexes)
            raise
        logged.add_done_callback(partial(self._ack_logged, txn_id, (new, cumulative, new_indexes), done))
        return done

    def _ack_logged(
        self,
        txn_id: TxnID,
        acked: tuple[list[Position], bool, list[IndexAck]],
        done: asyncio.Future[None],
        logged: asyncio.Future[Any],
    ) -> None:
        # Runs whether or not the caller still waits (``done`` may have been cancelled).
        new, cumulative, new_indexes = acked
        failure = failure_of(logged)
        if failure is not None:
            self._pending.unreserve(txn_id, new, cumulative, new_indexes)
            settle(done, failure, None)
            return
        if not cumulative:
            for position in new:
                # Pending in the transaction now: redelivered (read again) only if it aborts.
                self._unacked.pop(position, None)
                self._redeliver.discard(position)
        for ack in new_indexes:
            # Out until every index is acknowledged or pending (its consumer may still ack the rest).
            if not self._indexes_left(ack.position):
                self._unacked.pop(ack.position, None)
                self._redeliver.discard(ack.position)
        settle(done, None, None)

    def _indexes_left(self, position: Position) -> int:
        """The batch indexes of ``position`` neither deleted nor pending (assumes some are pending)."""
        size = self._pending.batch_size(position)
        if size is None:
            return 0 if self._cursor.is_deleted(position) else 1
        return self._remaining(position, size) & ~self._pending.index_mask(position)

    async def _delete_indexes(self, positions: list[Position], index_acks: list[IndexAck]) -> None:
        """Delete entries and batch indexes in one cursor write; forget entries now fully deleted."""
        rounds = [
            (a.position, a.batch_size, [i for i in range(a.batch_size) if (a.acked >> i) & 1])
            for a in index_acks
        ]
        await self._cursor.delete_round(positions, rounds)
        for position in positions:
            self._forget(position)
        for ack in index_acks:
            if self._cursor.is_deleted(ack.position):
                self._forget(ack.position)
                self._batch_sizes.pop(ack.position, None)

    # --- transaction end ---------------------------------------------------------------------------
    def end_txn(self, txn_id: TxnID, commit: bool, deadline_ms: int = 0) -> asyncio.Future[None]:
        """Apply (commit) or drop (abort) the transaction's acks; idempotent.

        The COMMIT/ABORT record is queued at the call and the future resolves once it is durable:
        from then on a replay applies the outcome, so the cursor update and the deletion of the
        records happen off the reply path. A plain function returning a future, so that a store
        ending a transaction on a partition and a subscription overlaps both without a task each.
        """
        ended = self._ended.get(txn_id)
        if ended is not None:
            if ended != commit:
                raise InvalidTxnStatusError(
                    f"transaction {txn_id} already ended the other way on {self.name}"
                )
            return resolved(None)
        in_progress = self._ending.get(txn_id)
        if in_progress is not None:
            return asyncio.shield(in_progress)
        if deadline_ms:
            self._end_deadlines[txn_id] = deadline_ms
        acks = self._pending.txn_acks(txn_id)
        if acks is None:
            self._remember_ended(txn_id, commit)
            return resolved(None)
        logged = self._pending_log.log_end(txn_id, commit)
        done: asyncio.Future[None] = self._loop().create_future()
        self._ending[txn_id] = done
        logged.add_done_callback(partial(self._end_logged, txn_id, commit, acks, done))
        # Not shielded (the store's request path never cancels): a cancelled first waiter cancels
        # only this shared future, never the end, which the callback finishes regardless.
        return done

    def _end_logged(
        self,
        txn_id: TxnID,
        commit: bool,
        acks: TxnAcks,
        done: asyncio.Future[None],
        logged: asyncio.Future[Any],
    ) -> None:
        del self._ending[txn_id]
        failure = failure_of(logged)
        if failure is not None:
            self._end_deadlines.pop(txn_id, None)
            settle(done, failure, None)
            return
        if commit:
            self._settler.add((txn_id, sorted(acks.individual), acks.cumulative, acks.index_acks()))
        else:
            self._pending.release(txn_id)
            for position in [*acks.individual, *acks.indexes]:
                self._schedule_redelivery(position)
            self._wake.set()
            self._record_deletions.add(txn_id)
        self._remember_ended(txn_id, commit)
        settle(done, None, None)

    async def _settle_commits(self, settled: list[_Settled]) -> None:
        # The positions stay pending (never dispatched, never ackable by others) until the cursor has
        # them deleted, so there is no instant where a committed ack is neither pending nor applied.
        individual = [p for _, positions, _, _ in settled for p in positions]
        cumulative = max((c for _, _, c, _ in settled if c is not None), default=None)
        index_acks = [a for _, _, _, acks in settled for a in acks]
        try:
            await self._apply_commit(individual, cumulative, index_acks)
        finally:
            for txn_id, _, _, _ in settled:
                self._pending.release(txn_id)
        for txn_id, _, _, _ in settled:
            self._record_deletions.add(txn_id)

    async def _delete_records(self, txn_ids: list[TxnID]) -> None:
        try:
            await self._pending_log.delete_txns(txn_ids)
        except Exception as exc:
            # Recorded durably (COMMIT/ABORT): a replay after a restart deletes them then.
            log.error(
                "deleting pending-ack records of %d transaction(s) on %s/%s failed: %s",
                len(txn_ids),
                self.topic,
                self.name,
                exc,
            )

    async def _apply_commit(
        self, individual: list[Position], cumulative: Position | None, index_acks: list[IndexAck]
    ) -> None:
        if individual or index_acks:
            await self._delete_indexes(individual, index_acks)
        if cumulative is not None:
            await self._cursor_mark_delete(cumulative)
            for done in [p for p in self._unacked if p <= cumulative]:
                self._forget(done)

    # --- moves on the subscription's behalf (message TTL, backlog eviction) ---------------------------
    def mark_delete_position(self) -> Position | None:
        return self._cursor.mark_delete_position()

    def is_acknowledged(self, position: Position) -> bool:
        return self._cursor.is_deleted(position)

    async def skip_through(self, position: Position) -> bool:
        """Acknowledge everything up to ``position`` for the subscription (Pulsar's expiry and backlog
        eviction mark-delete the cursor); whether the cursor moved. Messages out with consumers or
        queued for redelivery up to there are forgotten (a consumer's late ack of one is accepted);
        one pending in an open transaction stays deleted whatever that transaction does. The caller
        never passes the first message of an open transaction (``policies.capped``)."""
        current = self._cursor.mark_delete_position()
        if current is not None and position <= current:
            return False
        await self._cursor.mark_delete(position)
        for done in [p for p in self._unacked if p <= position]:
            self._forget(done)
        for done in [p for p in self._redeliver if p <= position]:
            self._forget(done)
        for done in [p for p in self._redelivery_counts if p <= position]:
            del self._redelivery_counts[done]
        if self._read_after is None or self._read_after < position:
            self._read_after = position  # dispatch goes on after it (it would skip them anyway)
        self._wake.set()
        return True

    # --- stats ---------------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        return {
            "consumers": len(self._consumers),
            "unackedMessages": len(self._unacked),
            "pendingAckTxns": self._pending.txn_count,
            "pendingAckMessages": self._pending.position_count,
            "markDeletePosition": str(self._cursor.mark_delete_position()),
            "readPosition": str(self._read_after),
        }

    # --- dispatch ----------------------------------------------------------------------------------
    async def _dispatch_forever(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            try:
                while self._has_permits() and await self._dispatch_once():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "dispatch on %s/%s failed; will retry on the next change", self.topic, self.name
                )
                await asyncio.sleep(0.1)
                self._wake.set()

    def _has_permits(self) -> bool:
        """Whether a consumer could take a message now (permits left, and ``ready``)."""
        permits = self._permits
        return any(permits.get(cid, 0) > 0 and c.ready for cid, c in self._consumers.items())

    def _ready_permits(self) -> int:
        permits = self._permits
        return sum(p for cid, c in self._consumers.items() if (p := permits.get(cid, 0)) > 0 and c.ready)

    async def _dispatch_once(self) -> bool:
        """Deliver what can be delivered now; True if another pass may deliver more."""
        failing = self._read_failure
        if failing is not None and failing.waiting:
            return False  # a timer wakes the retry: writes to the topic must not hurry it
        if self._redeliver:
            try:
                if not await self._dispatch_redeliveries():
                    return self._has_permits()  # queued again meanwhile: another pass
            except READ_FAILURES as exc:
                self._read_failed(exc)
                return False
        budget = min(READ_BATCH, self._ready_permits())
        if self._entry_bytes:
            budget = min(budget, max(1, READ_BATCH_BYTES // self._entry_bytes))
        if budget <= 0 or (self._key_fence and not self._fence_passed()):
            return False
        try:
            entries = await self._reader.read_after(self._read_after, budget)
        except READ_FAILURES as exc:
            self._read_failed(exc)
            return False
        if entries:
            self._entry_bytes = max(1, sum(len(data) for _, data in entries) // len(entries))
        if failing is not None:
            self._read_failure = None
            log.warning(
                "%s/%s: reading the entries %s succeeded again after %d failed read(s); delivery resumes",
                self.topic,
                self.name,
                after_text(failing.after),
                failing.failures,
            )
        if not entries:
            return False
        auto_ack: list[Position] = []
        progressed = False
        for position, data in entries:
            record = decode(data, self.topic, position)
            if record.is_marker:
                auto_ack.append(position)
            elif record.txn_id is not None:
                outcome = self._buffer.outcome(record.txn_id)
                if outcome is TxnOutcome.OPEN:
                    break
                if outcome is TxnOutcome.ABORTED:
                    auto_ack.append(position)
                elif self._fresh(position):
                    if not self._can_take(record):
                        break
                    self._deliver(position, record)
            elif self._fresh(position):
                if not self._can_take(record):
                    break
                self._deliver(position, record)
            self._read_after = position
            progressed = True
        for position in auto_ack:
            self._auto_acks.add(position)
        return progressed

    async def _dispatch_redeliveries(self) -> bool:
        """Deliver the messages queued to go out again, read again from the partition in runs of at
        most READ_BATCH entries (a run also spans the positions between them, which are skipped);
        True once none is left, False when no consumer can take more now."""
        queued = sorted(self._redeliver)
        index, count = 0, len(queued)
        while index < count:
            first = queued[index]
            if first not in self._redeliver:
                index += 1
                continue
            if not self._has_permits():
                return False
            last = index
            while (
                last + 1 < count
                and queued[last + 1].ledger_id == first.ledger_id
                and queued[last + 1].entry_id - first.entry_id < READ_BATCH
            ):
                last += 1
            span = queued[last].entry_id - first.entry_id + 1
            entries = await self._reader.read_after(Position(first.ledger_id, first.entry_id - 1), span)
            if not entries or entries[0][0] != first:
                # Not readable where it was (cannot happen to an unacknowledged message, whose ledger
                # is never trimmed): the ordinary read from before it decides what it is.
                log.warning(
                    "%s/%s: message %s to redeliver was not found where it was; reading again from it",
                    self.topic,
                    self.name,
                    first,
                )
                self._redeliver.discard(first)
                previous = Position(first.ledger_id, first.entry_id - 1)
                if self._read_after is not None and previous < self._read_after:
                    self._read_after = previous
                index += 1
                continue
            for position, data in entries:
                if position not in self._redeliver:
                    continue  # acknowledged, or pending in a transaction, since it was queued
                record = decode(data, self.topic, position)
                if not self._can_take(record):
                    return False
                self._redeliver.discard(position)
                if self._deliverable(position):
                    self._deliver(position, record)
            read_to = entries[-1][0]
            while index < count and queued[index] <= read_to:
                index += 1
        return not self._redeliver

    def _read_failed(self, exc: Exception) -> None:
        """Stop at the position that cannot be read, retry later, and tell the consumers once the
        failure has lasted (module docstring); never skip it."""
        loop = self._loop()
        now = loop.time()
        failure = self._read_failure
        if failure is None or failure.after != self._read_after:
            failure = self._read_failure = _ReadFailure(self._read_after, now)
        failure.failures += 1
        delay = min(READ_RETRY_FIRST_SECONDS * 2 ** (failure.failures - 1), READ_RETRY_MAX_SECONDS)
        failure.waiting = True
        loop.call_later(delay, self._retry_read, failure)
        what = "offloaded tier data" if isinstance(exc, OffloadError) else "stored data"
        if failure.failures == 1:
            log.warning(
                "%s/%s: reading the entries %s failed (%s unreadable), retrying: %s",
                self.topic,
                self.name,
                after_text(failure.after),
                what,
                exc,
            )
        if failure.failures < READ_FAILURES_BEFORE_ERROR:
            return
        message = (
            f"subscription {self.name!r} of {self.topic} cannot deliver the entries "
            f"{after_text(failure.after)}: the {what} is unreadable ({failure.failures} failed reads in "
            f"{now - failure.since:.0f} s): {exc}. Nothing after that position is delivered until it "
            "can be read (nothing is skipped or served wrongly); the store retries every "
            f"{READ_RETRY_MAX_SECONDS:g} s and resumes delivery by itself once it can"
        )
        if failure.failures == READ_FAILURES_BEFORE_ERROR:
            log.error("%s; its consumers are told", message)
        for consumer in self._consumers.values():
            consumer.read_failed(failure.after, message)  # pushed even to a backed-up connection: it is small

    def _retry_read(self, failure: _ReadFailure) -> None:
        failure.waiting = False
        self._wake.set()

    def _deliverable(self, position: Position) -> bool:
        if self._cursor.is_deleted(position) or self._pending.is_pending(position):
            return False
        return not self._pending.index_mask(position) or self._indexes_left(position) != 0

    def _ack_set(self, position: Position) -> list[int] | None:
        """The batch indexes of ``position`` still to deliver, as Pulsar's ack-set words (None: all)."""
        if not self._pending.index_mask(position):
            return self._cursor.ack_set(position)
        return mask_to_words(self._indexes_left(position))

    def _fresh(self, position: Position) -> bool:
        """Read from the ledger and not already out with a consumer or queued (a rewind re-reads)."""
        return (
            position not in self._unacked and position not in self._redeliver and self._deliverable(position)
        )

    def _can_take(self, record: DecodedRecord) -> bool:
        """Whether the next message can go out now: any consumer with permits, or in Key_Shared its
        key's consumer (else dispatch waits: a key's messages never overtake one another)."""
        if not self._key_shared:
            return self._has_permits()
        owner = self._key_owner(record.key)
        return self._permits.get(owner, 0) > 0 and self._consumers[owner].ready

    def _key_owner(self, key: str) -> int:
        owners = self._key_owners
        return owners[zlib.crc32(key.encode()) % len(owners)]

    def _fence_passed(self) -> bool:
        """Key_Shared: whether every message out when the consumers last changed is acknowledged or
        queued to go out again (then to its key's present consumer, before anything newer)."""
        fence = self._key_fence
        for position in [p for p in fence if p not in self._unacked]:
            fence.discard(position)
        return not fence

    def _deliver(self, position: Position, record: DecodedRecord) -> None:
        permits = self._permits
        if self._key_shared:
            owner = self._key_owner(record.key)
            permits[owner] -= 1
            self._unacked[position] = owner
            self._consumers[owner].deliver(
                position, record, self._redelivery_counts.get(position, 0), self._ack_set(position)
            )
            return
        # No copy of the consumers per message: the loop ends right after the one change it makes.
        for consumer_id, consumer in self._consumers.items():
            if permits.get(consumer_id, 0) > 0 and consumer.ready:
                permits[consumer_id] -= 1
                # round robin: the chosen consumer goes to the back
                self._consumers.move_to_end(consumer_id)
                self._unacked[position] = consumer_id
                consumer.deliver(
                    position, record, self._redelivery_counts.get(position, 0), self._ack_set(position)
                )
                return
        self._redeliver.add(position)

    def _schedule_redelivery(self, position: Position) -> None:
        """A message whose transactional ack was aborted goes out again (read again when it does)."""
        self._unacked.pop(position, None)
        self._redeliver.add(position)
        self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1

    def _redeliver_where(self, consumer_id: int) -> None:
        """Every message out with ``consumer_id`` goes out again (to whichever consumer is ready)."""
        for position in [p for p, c in self._unacked.items() if c == consumer_id]:
            del self._unacked[position]
            self._redeliver.add(position)
            self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1
        self._wake.set()

    def _forget(self, position: Position) -> None:
        self._unacked.pop(position, None)
        if self._key_fence:
            self._key_fence.discard(position)
            if not self._key_fence:
                self._wake.set()
        self._redeliver.discard(position)
        self._redelivery_counts.pop(position, None)

    def _remember_ended(self, txn_id: TxnID, commit: bool) -> None:
        self._ended[txn_id] = commit
        while len(self._ended) > ENDED_MEMORY:
            forgotten, _ = self._ended.popitem(last=False)
            deadline_ms = self._end_deadlines.pop(forgotten, 0)
            if deadline_ms:
                self.late_fence.add(forgotten, deadline_ms)

    async def _cursor_delete(self, positions: list[Position]) -> None:
        await self._cursor.delete(positions)

    async def _cursor_mark_delete(self, position: Position) -> None:
        current = self._cursor.mark_delete_position()
        if current is not None and position <= current:
            return
        await self._cursor.mark_delete(position)
