"""A subscription: a durable cursor on a partition, shared consumers, plain and transactional acks.

Dispatch runs in one task per subscription, woken when something may have become deliverable (a
write, a transaction end, permits, a redelivery). It reads entries in order from the read position,
skips markers and aborted messages (acknowledging them so the cursor can advance), stops at the first
message of an unresolved transaction (the transaction buffer's order rule), and never hands out a
message that is deleted or pending in a transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

from txnkeeper.aio import DeferredBatch, failure_of, resolved, settle
from txnkeeper.errors import BadRequestError, ConsumerBusyError, InvalidTxnStatusError, TxnConflictError
from txnkeeper.ledger.position import Position
from txnkeeper.topic.pending_acks import PendingAcks, TxnAcks
from txnkeeper.topic.ports import Consumer, Cursor, PartitionReader, PendingAckLog, RecoveredPendingAck
from txnkeeper.topic.records import decode
from txnkeeper.topic.txnbuffer import TransactionBuffer, TxnOutcome
from txnkeeper.topic.txnfence import LateFence
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)

READ_BATCH = 256
SETTLE_INTERVAL = 0.05  # seconds between batched cursor updates / record deletions
ENDED_MEMORY = 100_000


class _Unacked(NamedTuple):
    """A message out with a consumer (one per delivered message: a tuple is the cheapest to build)."""

    consumer_id: int
    payload: bytes
    key: str


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
        self._consumers: OrderedDict[int, Consumer] = OrderedDict()
        self._permits: dict[int, int] = {}
        self._unacked: dict[Position, _Unacked] = {}
        self._redeliver: dict[Position, tuple[bytes, str]] = {}
        # Messages acknowledged inside a still-open transaction, kept to redeliver them on abort.
        self._in_txn: dict[Position, tuple[bytes, str]] = {}
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
        self._settler: DeferredBatch[tuple[TxnID, list[Position], Position | None]] = DeferredBatch(
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
                continue
            if txn.ended:
                await self._apply_commit(txn.individual, txn.cumulative)
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
    def add_consumer(self, consumer: Consumer, permits: int) -> None:
        if consumer.consumer_id in self._consumers:
            raise ConsumerBusyError(f"consumer id {consumer.consumer_id} already subscribed to {self.name}")
        self._consumers[consumer.consumer_id] = consumer
        self._permits[consumer.consumer_id] = permits
        self._wake.set()

    def remove_consumer(self, consumer_id: int) -> None:
        """The consumer left: its unacknowledged messages go to the others."""
        if self._consumers.pop(consumer_id, None) is None:
            return
        self._permits.pop(consumer_id, None)
        self._redeliver_where(lambda u: u.consumer_id == consumer_id)

    def flow(self, consumer_id: int, permits: int) -> None:
        if consumer_id in self._permits:
            self._permits[consumer_id] += permits
            self._wake.set()

    def redeliver_unacknowledged(self, consumer_id: int) -> None:
        self._redeliver_where(lambda u: u.consumer_id == consumer_id)

    # --- acks --------------------------------------------------------------------------------------
    def ack(self, positions: list[Position], cumulative: bool, txn_id: TxnID | None) -> Awaitable[None]:
        """Acknowledge ``positions``; the awaitable resolves once the ack is durable.

        A transactional ack is checked, reserved and its record queued at the call (a future, no
        coroutine: it is the hot path of every transaction); refusals raise at the call.
        """
        if cumulative and len(positions) != 1:
            raise TxnConflictError("a cumulative ack names exactly one message")
        cursor = self._cursor
        for position in positions:
            if not cursor.holds(position) and not cursor.is_deleted(position):
                raise BadRequestError(
                    f"message {position} does not exist on {self.topic} (subscription {self.name!r}): "
                    "acknowledge the ids of messages received from it"
                )
        if txn_id is None:
            return self._plain_ack(positions, cumulative)
        return self._txn_ack(txn_id, positions, cumulative)

    async def _plain_ack(self, positions: list[Position], cumulative: bool) -> None:
        conflict = self._pending.conflict_for_plain(positions, cumulative)
        if conflict is not None:
            raise TxnConflictError(conflict)
        if cumulative:
            (position,) = positions
            await self._cursor_mark_delete(position)
            for done in [p for p in self._unacked if p <= position]:
                self._forget(done)
        else:
            await self._cursor_delete(positions)
            for position in positions:
                self._forget(position)

    def _txn_ack(self, txn_id: TxnID, positions: list[Position], cumulative: bool) -> asyncio.Future[None]:
        if txn_id in self._ended or txn_id in self._ending or self.late_fence.holds(txn_id):
            raise InvalidTxnStatusError(f"transaction {txn_id} already ended on {self.topic}/{self.name}")
        for position in positions:
            if not cumulative and self._cursor.is_deleted(position):
                raise TxnConflictError(f"message {position} is already acknowledged on {self.name}")
        new = self._pending.reserve(txn_id, positions, cumulative)
        done: asyncio.Future[None] = self._loop().create_future()
        if not new:
            done.set_result(None)
            return done
        try:
            logged = self._pending_log.log_ack(txn_id, new, cumulative)
        except BaseException:
            self._pending.unreserve(txn_id, new, cumulative)
            raise
        logged.add_done_callback(partial(self._ack_logged, txn_id, new, cumulative, done))
        return done

    def _ack_logged(
        self,
        txn_id: TxnID,
        new: list[Position],
        cumulative: bool,
        done: asyncio.Future[None],
        logged: asyncio.Future[Any],
    ) -> None:
        # Runs whether or not the caller still waits (``done`` may have been cancelled).
        failure = failure_of(logged)
        if failure is not None:
            self._pending.unreserve(txn_id, new, cumulative)
            settle(done, failure, None)
            return
        if not cumulative:
            for position in new:
                unacked = self._unacked.pop(position, None)
                if unacked is not None:
                    self._in_txn[position] = (unacked.payload, unacked.key)
                self._redeliver.pop(position, None)
        settle(done, None, None)

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
            self._settler.add((txn_id, sorted(acks.individual), acks.cumulative))
        else:
            self._pending.release(txn_id)
            for position in acks.individual:
                self._schedule_redelivery(position)
            self._wake.set()
            self._record_deletions.add(txn_id)
        self._remember_ended(txn_id, commit)
        settle(done, None, None)

    async def _settle_commits(self, settled: list[tuple[TxnID, list[Position], Position | None]]) -> None:
        # The positions stay pending (never dispatched, never ackable by others) until the cursor has
        # them deleted, so there is no instant where a committed ack is neither pending nor applied.
        individual = [p for _, positions, _ in settled for p in positions]
        cumulative = max((c for _, _, c in settled if c is not None), default=None)
        try:
            await self._apply_commit(individual, cumulative)
        finally:
            for txn_id, _, _ in settled:
                self._pending.release(txn_id)
        for txn_id, _, _ in settled:
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

    async def _apply_commit(self, individual: list[Position], cumulative: Position | None) -> None:
        if individual:
            await self._cursor_delete(individual)
            for position in individual:
                self._forget(position)
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
        return any(p > 0 for p in self._permits.values())

    async def _dispatch_once(self) -> bool:
        """Deliver what can be delivered now; True if another pass may deliver more."""
        if self._redeliver:
            for position in sorted(self._redeliver):
                if not self._has_permits():
                    return False
                payload, key = self._redeliver.pop(position)
                if self._deliverable(position):
                    self._deliver(position, payload, key)
        budget = min(READ_BATCH, sum(p for p in self._permits.values() if p > 0))
        if budget <= 0:
            return False
        entries = await self._reader.read_after(self._read_after, budget)
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
                    if not self._has_permits():
                        break
                    self._deliver(position, record.payload, record.key)
            elif self._fresh(position):
                if not self._has_permits():
                    break
                self._deliver(position, record.payload, record.key)
            self._read_after = position
            progressed = True
        for position in auto_ack:
            self._auto_acks.add(position)
        return progressed

    def _deliverable(self, position: Position) -> bool:
        return not self._cursor.is_deleted(position) and not self._pending.is_pending(position)

    def _fresh(self, position: Position) -> bool:
        """Read from the ledger and not already out with a consumer or queued (a rewind re-reads)."""
        return (
            position not in self._unacked and position not in self._redeliver and self._deliverable(position)
        )

    def _deliver(self, position: Position, payload: bytes, key: str) -> None:
        permits = self._permits
        # No copy of the consumers per message: the loop ends right after the one change it makes.
        for consumer_id, consumer in self._consumers.items():
            if permits.get(consumer_id, 0) > 0 and consumer.connected:
                permits[consumer_id] -= 1
                # round robin: the chosen consumer goes to the back
                self._consumers.move_to_end(consumer_id)
                self._unacked[position] = _Unacked(consumer_id, payload, key)
                consumer.deliver(position, payload, key, self._redelivery_counts.get(position, 0))
                return
        self._redeliver[position] = (payload, key)

    def _schedule_redelivery(self, position: Position) -> None:
        held = self._in_txn.pop(position, None)
        unacked = self._unacked.pop(position, None)
        if unacked is not None:
            held = (unacked.payload, unacked.key)
        if held is not None:
            self._redeliver[position] = held
            self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1
            return
        # Not cached (e.g. after a restart): re-read by rewinding the read position.
        self._rewind_to(position)

    def _rewind_to(self, position: Position) -> None:
        previous = Position(position.ledger_id, position.entry_id - 1)
        if self._read_after is None or previous < self._read_after:
            self._read_after = previous
        self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1

    def _redeliver_where(self, predicate: Callable[[_Unacked], bool]) -> None:
        for position in [p for p, u in self._unacked.items() if predicate(u)]:
            unacked = self._unacked.pop(position)
            self._redeliver[position] = (unacked.payload, unacked.key)
            self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1
        self._wake.set()

    def _forget(self, position: Position) -> None:
        self._unacked.pop(position, None)
        self._in_txn.pop(position, None)
        self._redeliver.pop(position, None)
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
