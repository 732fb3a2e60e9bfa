"""One transaction coordinator: owns the transactions whose TxnID.most is its id.

Every change is written to the transaction log before it is acknowledged; an end is decided by the
UPDATE(COMMITTING|ABORTING) record, delivered to every partition and subscription until each has
applied it (retried with backoff, idempotent on the store side), then sealed by UPDATE(COMMITTED|
ABORTED) and the transaction's records are deleted. After a restart ``recover`` resumes decided ends
and aborts expired open transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TypeVar, cast

from txnkeeper.aio import DeferredBatch, failure_of, resolved, settle
from txnkeeper.coordinator.ports import EndTxnSink, RecoveredTxn, TxnLog
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.coordinator.state import TERMINAL, TxnMeta, TxnStatus, check_transition, ending_status
from txnkeeper.coordinator.timeouts import TxnTimeoutPolicy
from txnkeeper.errors import (
    BadRequestError,
    InvalidTxnStatusError,
    NotServedHereError,
    TxnNotFoundError,
    UnavailableError,
)
from txnkeeper.ledger.io_stats import LatencyHistogram
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb
from txnkeeper.topicnames import name_problem
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)
_Items = TypeVar("_Items")
_Answer = TypeVar("_Answer")
_Entry = meta_pb.TransactionMetadataEntry
# Looked up once (each ``_Entry.X`` goes through the protobuf enum wrapper's __getattr__).
_NEW = _Entry.NEW
_ADD_PARTITION = _Entry.ADD_PARTITION
_ADD_SUBSCRIPTION = _Entry.ADD_SUBSCRIPTION
_UPDATE = _Entry.UPDATE
_OPEN = meta_pb.OPEN
# TxnStatus (an IntEnum numbered as Pulsar's) -> the log's enum value: a plain int, no conversion call.
_LOGGED_STATUS = {status: meta_pb.TxnStatus.ValueType(status.value) for status in TxnStatus}

ENDED_MEMORY = 100_000
# Transactions aborted by an admin request, remembered so that their owner is told why it cannot
# commit (at most this many; older ones are told only that the transaction is ABORTED).
ADMIN_ABORTS_MEMORY = 10_000
TICK_SECONDS = 0.1
# Pulsar's buckets of pulsar_txn_tc_execution_latency (10 ms .. 50 min), in seconds.
TXN_DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 1500.0, 3000.0)
RETRY_BACKOFF = (0.05, 2.0)
# Ends re-sent at once after store redirects (routes updated, or an end split per topic) before the
# usual backoff applies again: pods that disagree about placement must not be asked in a tight loop.
MAX_END_REDIRECTS = 8
DELETE_INTERVAL = 0.05  # seconds between batched deletions of ended transactions' records
# Seconds between rounds that log COMMITTED/ABORTED for the transactions ended since the last one and
# delete their records. Not needed for the outcome (the end is decided by the durable COMMITTING/
# ABORTING record, and answered once every participant applied it), so it need not be a log write
# per transaction: written one by one, it was a quarter of a coordinator's CPU per transaction at 1
# in flight. A crash before the round replays those transactions as COMMITTING/ABORTING and
# re-delivers their ends, which stores ignore (as for a crash before the record was durable).
SEAL_INTERVAL = 0.05


def _check_name(kind: str, name: str) -> None:
    """The stores' name rule, checked before a name is logged: an end naming something every store
    refuses would be retried for ever."""
    problem = name_problem(kind, name)
    if problem is not None:
        raise BadRequestError(problem)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _txn_id_itself(txn_id: TxnID, deadline_ms: int) -> TxnID:
    return txn_id


def _answer_begin(
    reply: tuple[asyncio.Future[_Answer], Callable[[TxnID, int], _Answer]],
    failure: BaseException | None,
    meta: TxnMeta,
) -> None:
    begun, answer = reply
    if begun.done():
        return  # the caller gave up
    if failure is None:
        try:
            value = answer(meta.txn_id, meta.start_time_ms + meta.timeout_ms)
        except Exception as exc:
            failure = exc
        else:
            begun.set_result(value)
            return
    settle(begun, failure, cast(_Answer, None))


def _relay(reply: asyncio.Future[None], done: asyncio.Future[None]) -> None:
    settle(reply, failure_of(done), None)


class TransactionCoordinator:
    """State machine + log + fan-out for one coordinator id."""

    def __init__(
        self,
        coordinator_id: int,
        txn_log: TxnLog,
        sequence: SequenceAllocator,
        routes: RouteTable,
        sink: EndTxnSink,
        *,
        clock: Callable[[], int] = _now_ms,
        timeouts: TxnTimeoutPolicy | None = None,
    ) -> None:
        self.coordinator_id = coordinator_id
        self.timeouts = timeouts or TxnTimeoutPolicy()
        self._log = txn_log
        self._sequence = sequence
        self._routes = routes
        self._sink = sink
        self._clock = clock
        self.state = "None"
        # The loop it serves on, set by recover() (requests are refused until then): asking asyncio
        # for the running loop costs a getpid() system call each time.
        self._loop: asyncio.AbstractEventLoop
        self._txns: dict[TxnID, TxnMeta] = {}
        self._ending: dict[TxnID, tuple[bool, asyncio.Future[None]]] = {}
        self._ended: OrderedDict[TxnID, TxnStatus] = OrderedDict()
        self._admin_aborts: OrderedDict[TxnID, None] = OrderedDict()
        # Timeout deadlines of open transactions: begun ones arrive in deadline order when their
        # timeouts are equal (the usual case), so they queue in order at O(1); one that would
        # break the order (a shorter timeout) goes to the heap, as do recovered ones.
        self._deadlines: list[tuple[int, TxnID]] = []
        self._deadlines_in_order: deque[tuple[int, TxnID]] = deque()
        self._background: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self.committed_count = 0
        self.aborted_count = 0
        self.timed_out_count = 0
        self.created_count = 0
        # Begin to end applied everywhere, of every committed or aborted txn (Pulsar's execution latency).
        self.durations = LatencyHistogram(TXN_DURATION_BUCKETS)
        self._deletions: DeferredBatch[TxnID] = DeferredBatch(
            f"coordinator {coordinator_id} record deletion", self._delete_many, DELETE_INTERVAL
        )
        self._seals: DeferredBatch[tuple[TxnMeta, bool]] = DeferredBatch(
            f"coordinator {coordinator_id} sealing", self._seal_many, SEAL_INTERVAL
        )

    # --- lifecycle ---------------------------------------------------------------------------------
    def recover(self, recovered: Iterable[RecoveredTxn]) -> None:
        """Adopt the replayed transactions and resume what they were doing; then start ticking."""
        self.state = "Initializing"
        self._loop = asyncio.get_running_loop()
        now = self._clock()
        for meta in recovered:
            if meta.status in TERMINAL:
                self._remember_ended(meta.txn_id, meta.status)
                self._deletions.add(meta.txn_id)
                continue
            self._txns[meta.txn_id] = meta
            if meta.status is TxnStatus.COMMITTING:
                self._spawn(self._resume_end(meta, commit=True))
            elif meta.status is TxnStatus.ABORTING:
                self._spawn(self._resume_end(meta, commit=False))
            elif meta.deadline_ms <= now:
                self._spawn(self._timeout_abort(meta.txn_id))
            else:
                self._deadlines.append((meta.deadline_ms, meta.txn_id))
        heapq.heapify(self._deadlines)  # once, not a push per recovered transaction
        self.state = "Ready"
        self._ticker = self._loop.create_task(self._tick_forever())

    async def quiesce(self, within: float) -> int:
        """Wait up to ``within`` seconds until no end is being delivered (a pod handing this
        coordinator id to another pod lets the ends it decided finish first, so that their callers
        hear the outcome); how many are still in progress then (the new owner resumes those from the
        log)."""
        deadline = time.monotonic() + within
        while self._ending:
            left = deadline - time.monotonic()
            pending = [done for _, done in self._ending.values() if not done.done()]
            if left <= 0 or not pending:
                break
            await asyncio.wait(pending, timeout=left)
        return len(self._ending)

    async def close(self) -> None:
        self.state = "Closed"
        await self._seals.drain()  # the log is still open: a graceful stop leaves nothing to resume
        await self._deletions.drain()
        if self._ticker is not None:
            self._ticker.cancel()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._ticker is not None:
            await asyncio.gather(self._ticker, return_exceptions=True)

    # --- requests ----------------------------------------------------------------------------------
    # new_txn, add_partitions and add_subscriptions are plain functions returning an awaitable:
    # checks and state changes happen at the call, and the usual case (an id left in the reserved
    # block, a store address already known) waits only for the log append's own future, so a pod
    # serves them without a coroutine or task each. Refusals raise at the call.
    def new_txn(
        self,
        timeout_ms: int,
        topics: list[str] | None = None,
        subscriptions: list[tuple[str, str]] | None = None,
        store_address: str = "",
    ) -> asyncio.Future[TxnID]:
        """Begin a transaction; the future resolves to its id once its NEW record is durable.

        ``topics`` / ``subscriptions`` (served by ``store_address``) are registered with the begin:
        their ADD records are appended right behind NEW, in the same loop turn, so they share its
        ledger write (one entry when batching, one group commit when not) and the client saves the
        AddToTxn round trip. The future then resolves once all of them are durable.
        """
        return self.begin(timeout_ms, topics, subscriptions, store_address, answer=_txn_id_itself)

    def begin(
        self,
        timeout_ms: int,
        topics: list[str] | None,
        subscriptions: list[tuple[str, str]] | None,
        store_address: str,
        *,
        answer: Callable[[TxnID, int], _Answer],
    ) -> asyncio.Future[_Answer]:
        """``new_txn`` whose future resolves to ``answer(txn id, deadline ms)``, called once the begin
        is durable and the transaction adopted (an exception it raises fails the future): a pod
        builds its reply there, so a begin costs one future and one callback, not a second of each
        to turn the id into the reply."""
        self._require_ready()
        self.timeouts.check_begin(timeout_ms)
        topics = topics or []
        subscriptions = subscriptions or []
        if topics or subscriptions:
            self.timeouts.check_topics(timeout_ms, [*topics, *(t for t, _ in subscriptions)])
            # Names checked and routes looked up in one pass (the usual begin names one of each).
            route = self._routes.get
            known = True
            for topic in topics:
                _check_name("topic", topic)
                known = known and route(topic) == store_address
            for topic, subscription in subscriptions:
                _check_name("topic", topic)
                _check_name("subscription", subscription)
                known = known and route(topic) == store_address
            if not store_address:
                raise BadRequestError("registering partitions or subscriptions at begin needs store_address")
            if not known:
                named = list(dict.fromkeys([*topics, *(t for t, _ in subscriptions)]))
                return asyncio.ensure_future(
                    self._begin_after_learning(
                        timeout_ms, (named, store_address), topics, subscriptions, answer
                    )
                )
        least = self._sequence.next_nowait()
        if least is None:
            return asyncio.ensure_future(
                self._new_txn_after_reserving(timeout_ms, topics, subscriptions, answer)
            )
        return self._begin(least, timeout_ms, topics, subscriptions, answer)

    async def _new_txn_after_reserving(
        self,
        timeout_ms: int,
        topics: list[str],
        subscriptions: list[tuple[str, str]],
        answer: Callable[[TxnID, int], _Answer],
    ) -> _Answer:
        least = await self._sequence.next()
        return await self._begin(least, timeout_ms, topics, subscriptions, answer)

    async def _begin_after_learning(
        self,
        timeout_ms: int,
        route: tuple[list[str], str],
        topics: list[str],
        subscriptions: list[tuple[str, str]],
        answer: Callable[[TxnID, int], _Answer],
    ) -> _Answer:
        """First sight of a topic (or a moved store): persist its route (the topics named and their
        store's address), then begin as usual."""
        await self._routes.learn(*route)
        self._require_ready()
        least = await self._sequence.next()
        return await self._begin(least, timeout_ms, topics, subscriptions, answer)

    def _begin(
        self,
        least: int,
        timeout_ms: int,
        topics: list[str],
        subscriptions: list[tuple[str, str]],
        answer: Callable[[TxnID, int], _Answer],
    ) -> asyncio.Future[_Answer]:
        txn_id = TxnID(self.coordinator_id, least)
        now = self._clock()
        meta = TxnMeta(txn_id, TxnStatus.OPEN, timeout_ms, now, now)
        # Filled in place with plain ints: keyword construction and the enum wrappers' attribute
        # lookups cost more than the record itself is worth (same bytes either way).
        entry = _Entry()
        entry.metadata_op = _NEW
        entry.txnid_most_bits = txn_id.most
        entry.txnid_least_bits = least
        entry.timeout_ms = timeout_ms
        entry.start_time = now
        entry.last_modification_time = now
        entry.max_local_txn_id = least
        entry.new_status = _OPEN
        begun: asyncio.Future[_Answer] = self._loop.create_future()
        if not topics and not subscriptions:
            written = asyncio.ensure_future(self._log.append(entry))
            written.add_done_callback(partial(self._begun, meta, (begun, answer)))
            return begun
        # Registered with the begin: the ADD records follow NEW in this turn (the writer's idle flush
        # or the ledger's group commit takes all three together); replay folds them in log order.
        # The routes were checked by new_txn (or learned), and the meta is fresh: every name is new.
        records = [entry]
        if topics:
            added = _Entry()
            added.metadata_op = _ADD_PARTITION
            # A fresh transaction: every name is new, only repeats within the request are dropped.
            meta.partitions = list(dict.fromkeys(topics)) if len(topics) > 1 else list(topics)
            added.partitions.extend(meta.partitions)
            records.append(added)
        if subscriptions:
            added = _Entry()
            added.metadata_op = _ADD_SUBSCRIPTION
            meta.subscriptions = (
                list(dict.fromkeys(subscriptions)) if len(subscriptions) > 1 else list(subscriptions)
            )
            for topic, subscription in meta.subscriptions:
                ref = added.subscriptions.add()  # added in place: passing built ones copies them
                ref.topic = topic
                ref.subscription = subscription
            records.append(added)
        for added in records[1:]:
            added.txnid_most_bits = txn_id.most
            added.txnid_least_bits = least
            added.last_modification_time = now
        writes = [
            write if isinstance(write, asyncio.Future) else asyncio.ensure_future(write)
            for write in self._log.append_all(records)
        ]
        # One callback on the last record (records settle in log order, so the others are settled by
        # then; _begun_all waits for any that are not), instead of a gather and a callback per record.
        writes[-1].add_done_callback(partial(self._begun_all, meta, (begun, answer), writes))
        return begun

    def _begun(
        self,
        meta: TxnMeta,
        reply: tuple[asyncio.Future[_Answer], Callable[[TxnID, int], _Answer]],
        written: asyncio.Future[object],
    ) -> None:
        failure = failure_of(written)
        if failure is None:
            self._adopt(meta)
        _answer_begin(reply, failure, meta)

    def _adopt(self, meta: TxnMeta) -> None:
        # Known (and subject to its timeout) only once its NEW record is durable.
        self._txns[meta.txn_id] = meta
        deadline = meta.deadline_ms
        in_order = self._deadlines_in_order
        if not in_order or in_order[-1][0] <= deadline:
            in_order.append((deadline, meta.txn_id))
        else:
            heapq.heappush(self._deadlines, (deadline, meta.txn_id))
        self.created_count += 1

    def _begun_all(
        self,
        meta: TxnMeta,
        reply: tuple[asyncio.Future[_Answer], Callable[[TxnID, int], _Answer]],
        writes: list[asyncio.Future[object]],
        settled: asyncio.Future[object],
    ) -> None:
        """The begin's NEW and ADD records: once all settled, adopt the transaction if NEW is durable
        (it then exists and times out whatever became of its ADD records) and answer."""
        for write in writes:
            if not write.done():
                write.add_done_callback(partial(self._begun_all, meta, reply, writes))
                return
        failures = [failure_of(write) for write in writes]  # every outcome retrieved
        if failures[0] is None:
            self._adopt(meta)
        failure = next((f for f in failures if f is not None), None)
        _answer_begin(reply, failure, meta)

    def add_partitions(self, txn_id: TxnID, topics: list[str], store_address: str) -> Awaitable[object]:
        meta = self._open_txn(txn_id)
        if not topics:
            raise BadRequestError("add-partition needs one or more topic names")
        for topic in topics:
            _check_name("topic", topic)
        self.timeouts.check_topics(meta.timeout_ms, topics)
        if not self._routes.knows(topics, store_address):
            return asyncio.ensure_future(
                self._learn_then(topics, store_address, self._add_partitions, meta, topics)
            )
        return self._add_partitions(meta, topics)

    def _add_partitions(self, meta: TxnMeta, topics: list[str]) -> Awaitable[object]:
        self._check_routed(topics)
        new = meta.add_partitions(topics)
        if not new:
            return resolved(None)
        entry = meta_pb.TransactionMetadataEntry(
            metadata_op=meta_pb.TransactionMetadataEntry.ADD_PARTITION, partitions=new
        )
        return self._log_change(meta, entry)

    def add_subscriptions(
        self, txn_id: TxnID, subscriptions: list[tuple[str, str]], store_address: str
    ) -> Awaitable[object]:
        meta = self._open_txn(txn_id)
        if not subscriptions:
            raise BadRequestError("add-subscription needs one or more (topic, subscription) pairs")
        for topic, subscription in subscriptions:
            _check_name("topic", topic)
            _check_name("subscription", subscription)
        topics = list(dict.fromkeys(t for t, _ in subscriptions))
        self.timeouts.check_topics(meta.timeout_ms, topics)
        if not self._routes.knows(topics, store_address):
            return asyncio.ensure_future(
                self._learn_then(topics, store_address, self._add_subscriptions, meta, subscriptions)
            )
        return self._add_subscriptions(meta, subscriptions)

    def _add_subscriptions(self, meta: TxnMeta, subscriptions: list[tuple[str, str]]) -> Awaitable[object]:
        self._check_routed([t for t, _ in subscriptions])
        new = meta.add_subscriptions(subscriptions)
        if not new:
            return resolved(None)
        entry = meta_pb.TransactionMetadataEntry(
            metadata_op=meta_pb.TransactionMetadataEntry.ADD_SUBSCRIPTION
        )
        for topic, subscription in new:  # added in place: passing built Subscriptions copies them
            added = entry.subscriptions.add()
            added.topic = topic
            added.subscription = subscription
        return self._log_change(meta, entry)

    async def _learn_then(
        self,
        topics: list[str],
        store_address: str,
        add: Callable[[TxnMeta, _Items], Awaitable[object]],
        meta: TxnMeta,
        items: _Items,
    ) -> None:
        """First sight of a topic (or a moved store): persist its route, then add as usual."""
        await self._routes.learn(topics, store_address)
        await add(meta, items)

    def _log_change(self, meta: TxnMeta, entry: meta_pb.TransactionMetadataEntry) -> Awaitable[object]:
        """Stamp a membership change with the txn id and modification time, then make it durable."""
        now = self._clock()
        meta.last_modification_ms = now
        entry.txnid_most_bits = meta.txn_id.most
        entry.txnid_least_bits = meta.txn_id.least
        entry.last_modification_time = now
        return self._log.append(entry)

    def end_txn(self, txn_id: TxnID, commit: bool) -> asyncio.Future[None]:
        """Commit or abort; idempotent (a retried end of an ended transaction succeeds).

        A plain function returning a future: checks and refusals happen at the call, and the usual
        end (every participant on one store pod, delivered at the first attempt) runs as callbacks:
        decision logged -> end delivered -> answered, without a task or a coroutine chain per
        transaction (they were a tenth of a coordinator's CPU per transaction at 256 in flight).
        """
        self._require_ready()
        self._check_owner(txn_id)
        final = ending_status(commit)[1]
        ended = self._ended.get(txn_id)
        if ended is not None:
            if ended is final:
                return resolved(None)
            raise InvalidTxnStatusError(f"transaction {txn_id} is already {ended.name}{self._why(txn_id)}")
        in_progress = self._ending.get(txn_id)
        if in_progress is not None:
            ending_commit, done = in_progress
            if ending_commit != commit:
                status = ending_status(ending_commit)[0]
                raise InvalidTxnStatusError(
                    f"transaction {txn_id} is {status.name}{self._why(txn_id)}; it cannot become {final.name}"
                )
            return asyncio.shield(done)
        meta = self._txns.get(txn_id)
        if meta is None:
            raise TxnNotFoundError(f"transaction {txn_id} not found (never existed or long ended)")
        return self._decide(meta, commit)

    def abort_by_admin(self, txn_id: TxnID) -> tuple[bool, asyncio.Future[None]]:
        """Abort ``txn_id`` for an operator (``txnkeeper admin transactions abort``; no owner token):
        whether it had already ended or was aborting, and the end's future (resolved once every
        participant applied it). Refusals raise as ``end_txn``'s: not found, or committing/committed."""
        self._require_ready()
        self._check_owner(txn_id)
        in_progress = self._ending.get(txn_id)
        already = self._ended.get(txn_id) is TxnStatus.ABORTED or (
            in_progress is not None and not in_progress[0]
        )
        meta = self._txns.get(txn_id)
        if not already and meta is not None and meta.status is TxnStatus.OPEN:
            log.warning(
                "coordinator %d: transaction %s aborted by an admin request (open %.1fs, timeout %d ms)",
                self.coordinator_id,
                txn_id,
                (self._clock() - meta.start_time_ms) / 1000,
                meta.timeout_ms,
            )
            self._admin_aborts[txn_id] = None
            while len(self._admin_aborts) > ADMIN_ABORTS_MEMORY:
                self._admin_aborts.popitem(last=False)
        return already, self.end_txn(txn_id, commit=False)

    def _why(self, txn_id: TxnID) -> str:
        return " (aborted by an admin request)" if txn_id in self._admin_aborts else ""

    def deadline_of(self, txn_id: TxnID) -> int:
        """The open transaction's timeout deadline (ms since the epoch, this pod's clock)."""
        return self._open_txn(txn_id).deadline_ms

    def status_of(self, txn_id: TxnID) -> str:
        meta = self._txns.get(txn_id)
        if meta is not None:
            return meta.status.name
        ended = self._ended.get(txn_id)
        return ended.name if ended is not None else "UNKNOWN"

    # --- stats ---------------------------------------------------------------------------------------
    @property
    def ongoing_count(self) -> int:
        return len(self._txns)

    @property
    def ending_count(self) -> int:
        """Transactions whose end was decided and is being delivered to their participants."""
        return len(self._ending)

    @property
    def least_sig_bits(self) -> int:
        return self._sequence.last

    # --- internals -----------------------------------------------------------------------------------
    def _require_ready(self) -> None:
        if self.state != "Ready":
            raise UnavailableError(f"coordinator {self.coordinator_id} is {self.state}")

    def _check_owner(self, txn_id: TxnID) -> None:
        if txn_id.most != self.coordinator_id:
            raise TxnNotFoundError(f"transaction {txn_id} belongs to coordinator {txn_id.most}")

    def _open_txn(self, txn_id: TxnID) -> TxnMeta:
        self._require_ready()
        self._check_owner(txn_id)
        meta = self._txns.get(txn_id)
        if meta is None:
            ended = self._ended.get(txn_id)
            if ended is not None:
                raise InvalidTxnStatusError(
                    f"transaction {txn_id} is already {ended.name}{self._why(txn_id)}"
                )
            raise TxnNotFoundError(f"transaction {txn_id} not found")
        if meta.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(
                f"transaction {txn_id} is {meta.status.name}{self._why(txn_id)}, not OPEN"
            )
        return meta

    def _check_routed(self, topics: list[str]) -> None:
        missing = [t for t in topics if self._routes.get(t) is None]
        if missing:
            raise BadRequestError(f"no store address known for {missing}; send store_address")

    async def _decide_and_end(self, meta: TxnMeta, commit: bool) -> None:
        await self._decide(meta, commit)

    def _decide(self, meta: TxnMeta, commit: bool) -> asyncio.Future[None]:
        """Log the decision (UPDATE COMMITTING|ABORTING), then deliver it; the future resolves once
        every participant applied it, or fails with why the decision could not be logged."""
        ending, _ = ending_status(commit)
        check_transition(meta.txn_id, meta.status, ending)
        loop = self._loop
        done: asyncio.Future[None] = loop.create_future()
        self._ending[meta.txn_id] = (commit, done)
        previous = meta.status
        meta.status = ending
        try:
            written = asyncio.ensure_future(self._write_update(meta, previous, ending))
        except BaseException as exc:
            self._undecided(meta, previous, done, exc)
            raise
        reply: asyncio.Future[None] = loop.create_future()
        written.add_done_callback(partial(self._decided, (meta, commit, previous), done, reply))
        return reply

    def _undecided(
        self, meta: TxnMeta, previous: TxnStatus, done: asyncio.Future[None], exc: BaseException
    ) -> None:
        meta.status = previous
        del self._ending[meta.txn_id]
        settle(done, UnavailableError(f"could not log the end of {meta.txn_id}: {exc}"), None)

    def _decided(
        self,
        decision: tuple[TxnMeta, bool, TxnStatus],
        done: asyncio.Future[None],
        reply: asyncio.Future[None],
        written: asyncio.Future[object],
    ) -> None:
        meta, commit, previous = decision
        failure = failure_of(written)
        if failure is not None:
            self._undecided(meta, previous, done, failure)
            settle(reply, failure, None)  # the caller hears the log's own error
            return
        # The usual case: one store pod, first attempt; anything else takes the retrying path. The
        # caller's reply is settled with the shared outcome directly on the usual path, and relayed
        # from it (one more callback) on the others.
        topics, subs = meta.partitions, meta.subscriptions
        if not topics and not subs:
            self._ended_everywhere(meta, commit, done)
            settle(reply, None, None)
            return
        try:
            address = self._single_store(topics, subs)
            if address is not None:
                self._sink.end_on_store_then(
                    address,
                    meta.txn_id,
                    commit,
                    (topics, subs, meta.deadline_ms),
                    partial(self._delivered, meta, commit, (done, reply)),
                )
                return
        except Exception as exc:
            log.warning("coordinator %d: ending %s: %s; retrying", self.coordinator_id, meta.txn_id, exc)
        done.add_done_callback(partial(_relay, reply))
        self._spawn(self._finish_end(meta, commit, done))

    def _single_store(self, topics: list[str], subs: list[tuple[str, str]]) -> str | None:
        """The store pod serving every partition and subscription, if it is one (the usual case)."""
        route = self._routes.get
        first = topics[0] if topics else subs[0][0]
        address = route(first)
        if address is None:
            raise RuntimeError(f"no store address recorded for topic {first}")
        for topic in topics:
            if route(topic) != address:
                return None
        for topic, _ in subs:
            if route(topic) != address:
                return None
        return address

    def _delivered(
        self,
        meta: TxnMeta,
        commit: bool,
        waiting: tuple[asyncio.Future[None], asyncio.Future[None]],
        failure: BaseException | None,
    ) -> None:
        done, reply = waiting
        if failure is None:
            self._ended_everywhere(meta, commit, done)
            settle(reply, None, None)
            return
        done.add_done_callback(partial(_relay, reply))
        if self.state == "Closed" or not isinstance(failure, Exception):
            # The decision stays logged; a restart (recover) resumes it.
            self._ending.pop(meta.txn_id, None)
            settle(done, UnavailableError(f"end of {meta.txn_id} interrupted: {failure}"), None)
            return
        log.warning(
            "coordinator %d: ending %s on its store failed (%s); retrying",
            self.coordinator_id,
            meta.txn_id,
            failure,
        )
        self._spawn(self._finish_end(meta, commit, done))

    async def _resume_end(self, meta: TxnMeta, commit: bool) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ending[meta.txn_id] = (commit, done)
        await self._finish_end(meta, commit, done)

    async def _finish_end(self, meta: TxnMeta, commit: bool, done: asyncio.Future[None]) -> None:
        try:
            await self._fan_out(meta, commit)
        except BaseException as exc:
            # The decision stays logged; a restart (recover) resumes it.
            self._ending.pop(meta.txn_id, None)
            if not done.done():
                done.set_exception(UnavailableError(f"end of {meta.txn_id} interrupted: {exc}"))
                done.exception()
            raise
        self._ended_everywhere(meta, commit, done)

    def _ended_everywhere(self, meta: TxnMeta, commit: bool, done: asyncio.Future[None]) -> None:
        # Every participant applied the end: the outcome is final, so the caller hears it now; the
        # COMMITTED/ABORTED record and the deletion follow off the reply path (a crash before them
        # replays the txn as COMMITTING/ABORTING and re-delivers the end, which stores ignore).
        final = ending_status(commit)[1]
        meta.status = final
        self._txns.pop(meta.txn_id, None)
        self._ending.pop(meta.txn_id, None)
        self._remember_ended(meta.txn_id, final)
        if commit:
            self.committed_count += 1
        else:
            self.aborted_count += 1
        self.durations.observe(max(0.0, (self._clock() - meta.start_time_ms) / 1000))
        settle(done, None, None)
        if self.state == "Closed":
            return  # ended after the last round was drained: sealed by the replay after the restart
        # Sealed in rounds (see SEAL_INTERVAL), not a log write per transaction.
        self._seals.add((meta, commit))

    async def _seal_many(self, ended: list[tuple[TxnMeta, bool]]) -> None:
        """Log COMMITTED/ABORTED for the transactions ended since the last round, then delete their
        records. The records are queued in one loop turn, so they share one batched entry (or one
        group commit); a record that failed leaves its transaction to the replay after a restart,
        which re-delivers the end (stores ignore it) and seals it then."""
        sealing: list[tuple[TxnID, TxnStatus, Awaitable[object]]] = []
        for meta, commit in ended:
            ending, final = ending_status(commit)
            try:
                sealing.append((meta.txn_id, final, self._write_update(meta, ending, final)))
            except Exception as exc:
                self._seal_failed(meta.txn_id, final, exc)
        # Awaited one by one, not gathered: they settle together, so each await finds its record
        # settled (no suspension, and no callback per record).
        sealed: list[TxnID] = []
        for txn_id, final, write in sealing:
            try:
                await write
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this round was cancelled (close), not the record's write
                self._seal_failed(txn_id, final, exc)
            except Exception as exc:
                self._seal_failed(txn_id, final, exc)
            else:
                sealed.append(txn_id)
        if sealed:
            await self._delete_many(sealed)

    def _seal_failed(self, txn_id: TxnID, final: TxnStatus, failure: BaseException) -> None:
        log.error(
            "coordinator %d: logging %s of %s failed: %s", self.coordinator_id, final.name, txn_id, failure
        )

    def _write_update(self, meta: TxnMeta, expected: TxnStatus, new: TxnStatus) -> Awaitable[object]:
        now = self._clock()
        meta.last_modification_ms = now
        entry = _Entry()
        entry.metadata_op = _UPDATE
        entry.txnid_most_bits = meta.txn_id.most
        entry.txnid_least_bits = meta.txn_id.least
        entry.expected_status = _LOGGED_STATUS[expected]
        entry.new_status = _LOGGED_STATUS[new]
        entry.last_modification_time = now
        return self._log.append(entry)

    async def _fan_out(self, meta: TxnMeta, commit: bool) -> None:
        """Deliver the end to every store pod of the transaction (one request per pod), retrying
        what failed with backoff until every partition and subscription has applied it.

        A store pod that does not serve a topic of the end any more (placement, contracts §12) refuses
        the whole end ``NOT_SERVED_HERE``, applying nothing. Its answer names one owner, not which topic
        moved, so from then on the end goes out as one end per topic; a topic's own refusal names its
        owner, which becomes the topic's route (durably, for later ends too) and gets the end at once.
        An owner-less refusal (being moved) is retried with backoff like any failure."""
        topics, subs = meta.partitions, meta.subscriptions
        if not topics and not subs:
            return
        txn_id = meta.txn_id
        delay = RETRY_BACKOFF[0]
        per_topic = False
        redirects = 0
        while True:
            try:
                # Routes are looked up again on every attempt: a store that moved is found there.
                groups = self._group_by_store(topics, subs, per_topic=per_topic)
                results = await asyncio.gather(
                    *(
                        self._sink.end_on_store(a, txn_id, commit, t, s, deadline_ms=meta.deadline_ms)
                        for a, t, s in groups
                    ),
                    return_exceptions=True,
                )
                outcomes = zip(groups, results, strict=True)
                errors = [(g, r) for g, r in outcomes if isinstance(r, BaseException)]
                if not errors:
                    return
                for _, error in errors:
                    if not isinstance(error, Exception):
                        raise error  # cancelled: stop, the logged decision is resumed by recovery
                # Retry only the ends that failed (ends are idempotent, so re-sending is safe too).
                topics = [t for (_, ts, _), _ in errors for t in ts]
                subs = [s for (_, _, ss), _ in errors for s in ss]
                moved = await self._follow_redirects(errors)
                if moved is not None:
                    per_topic = True
                    if moved and redirects < MAX_END_REDIRECTS:
                        redirects += 1
                        continue  # a route changed or the end was split: re-send now, not after a wait
                raise errors[0][1]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "coordinator %d: ending %s on its stores failed (%s); retrying in %.2fs",
                    self.coordinator_id,
                    txn_id,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_BACKOFF[1])

    async def _follow_redirects(
        self, errors: list[tuple[tuple[str, list[str], list[tuple[str, str]]], BaseException]]
    ) -> bool | None:
        """Placement refusals among the failed ends: None if there were none; else whether re-sending
        at once makes sense (a topic's route was updated to its owner, or a many-topic end must be
        split per topic to learn which topic moved)."""
        refused = False
        progress = False
        for (address, ts, ss), error in errors:
            if not isinstance(error, NotServedHereError):
                continue
            refused = True
            names = list(dict.fromkeys([*ts, *(t for t, _ in ss)]))
            owner = error.owner_address
            if len(names) > 1:
                progress = True  # split per topic on the next attempt
            elif owner and owner != address:
                log.info(
                    "coordinator %d: %s is served at %s now (was %s); ending there",
                    self.coordinator_id,
                    names[0],
                    owner,
                    address,
                )
                await self._routes.learn(names, owner)
                progress = True
        return progress if refused else None

    def _group_by_store(
        self, topics: list[str], subs: list[tuple[str, str]], *, per_topic: bool = False
    ) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
        """The end's parts by store address (by topic too when ``per_topic``)."""
        groups: dict[tuple[str, str], tuple[str, list[str], list[tuple[str, str]]]] = {}
        for topic in topics:
            address = self._route(topic)
            key = (address, topic if per_topic else "")
            groups.setdefault(key, (address, [], []))[1].append(topic)
        for topic, sub in subs:
            address = self._route(topic)
            key = (address, topic if per_topic else "")
            groups.setdefault(key, (address, [], []))[2].append((topic, sub))
        return list(groups.values())

    def _route(self, topic: str) -> str:
        address = self._routes.get(topic)
        if address is None:
            raise RuntimeError(f"no store address recorded for topic {topic}")
        return address

    async def _delete_many(self, txn_ids: list[TxnID]) -> None:
        try:
            await self._log.delete_txns(txn_ids)
        except Exception as exc:
            # Left in the log: a restart replays them as ended and deletes them then.
            log.error(
                "coordinator %d: deleting the records of %d ended transaction(s) failed: %s",
                self.coordinator_id,
                len(txn_ids),
                exc,
            )

    async def _timeout_abort(self, txn_id: TxnID) -> None:
        meta = self._txns.get(txn_id)
        if meta is None or meta.status is not TxnStatus.OPEN or txn_id in self._ending:
            return
        self.timed_out_count += 1
        log.info("coordinator %d: transaction %s timed out; aborting", self.coordinator_id, txn_id)
        with contextlib.suppress(InvalidTxnStatusError):
            await self._decide_and_end(meta, commit=False)

    def _expire(self) -> None:
        now = self._clock()
        due: list[TxnID] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            due.append(heapq.heappop(self._deadlines)[1])
        in_order = self._deadlines_in_order
        while in_order and in_order[0][0] <= now:
            due.append(in_order.popleft()[1])
        for txn_id in due:
            meta = self._txns.get(txn_id)
            if meta is not None and meta.status is TxnStatus.OPEN and txn_id not in self._ending:
                self._spawn(self._timeout_abort(txn_id))

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self._expire()

    def _remember_ended(self, txn_id: TxnID, status: TxnStatus) -> None:
        self._ended[txn_id] = status
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _spawn(self, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("coordinator %d: background work failed: %s", self.coordinator_id, task.exception())
