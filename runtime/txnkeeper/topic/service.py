"""The store role's topic service: opens partitions and subscriptions on demand and after a restart.

Partitions and subscriptions are created on first use; a small durable registry (topic -> its
subscriptions) lets a restarted pod reopen every subscription's cursor and pending-ack store before it
reports ready, so pending acks are known before any consumer can be served. A topic whose recovery
cannot read its entries (offloaded tier data damaged or unreachable) is left closed instead of
keeping the pod from starting: its requests are refused DATA_UNREADABLE naming why, and it is opened
again at a later use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from txnkeeper.aio import SingleFlight
from txnkeeper.errors import (
    BadRequestError,
    ConsumerBusyError,
    DataUnreadableError,
    InvalidTxnStatusError,
    UnavailableError,
)
from txnkeeper.ledger.cursor import LedgerLayout
from txnkeeper.ledger.position import Position
from txnkeeper.topic.partition import (
    HOUSEKEEPING_INTERVAL,
    BlockResult,
    Partition,
    PartitionLedger,
    WriteNotify,
    notify_from_future,
)
from txnkeeper.topic.policies import NO_POLICIES, TopicPolicies, newest_older_than
from txnkeeper.topic.ports import Cursor, PendingAckLog, RecoveredPendingAck
from txnkeeper.topic.readers import ReaderAcks, ReaderCursor
from txnkeeper.topic.records import sent_time_ms
from txnkeeper.topic.registry import load_registry, save_registry
from txnkeeper.topic.settled import first_failure
from txnkeeper.topic.snapshot import snapshot_path
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.tailcache import TailCacheBudget
from txnkeeper.topic.txnfence import FENCE_GRACE_MS
from txnkeeper.topic.txnfence import now_ms as _now_ms
from txnkeeper.topic.writers import SingleKeySettings
from txnkeeper.topicnames import name_problem
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)

SNAPSHOT_DIR = "txnbuffer-snapshots"  # next to the registry: one snapshot file per topic
# A topic whose recovery could not read its entries is tried again at a use at most this often.
REOPEN_UNREADABLE_SECONDS = 5.0
T = TypeVar("T")


class TopicLedger(PartitionLedger, Protocol):
    async def open_cursor(self, name: str) -> Cursor: ...

    # A cursor created before: its missing file is refused, never read as "nothing acknowledged".
    async def reopen_cursor(self, name: str, *, owner: str) -> Cursor: ...

    async def delete_cursor(self, name: str) -> None: ...


class PendingAckHandle(PendingAckLog, Protocol):
    """A subscription's opened pending-ack store as the topic service uses it."""

    async def recovered(self) -> list[RecoveredPendingAck]: ...

    async def close(self) -> None: ...

    async def destroy(self) -> None: ...  # close, and remove the log for good


LedgerOpener = Callable[[str], Awaitable[TopicLedger]]
PendingAckOpener = Callable[[str, str], Awaitable[PendingAckHandle]]
# How long a txn ended on a topic or subscription this pod does not hold stays fenced out of it when the
# end did not say the txn's deadline (an old coordinator or a bare EndTxnOnPartition): the longest timeout.
UNKNOWN_DEADLINE_FENCE_MS = 24 * 3600 * 1000


def validate_name(kind: str, name: str) -> None:
    problem = name_problem(kind, name)
    if problem is not None:
        raise BadRequestError(problem)


class TopicService:
    """All partitions and subscriptions of one store pod."""

    def __init__(
        self,
        registry_path: Path,
        open_ledger: LedgerOpener,
        open_pending_ack: PendingAckOpener,
        ledger_exists: Callable[[str], bool] | None = None,
        *,
        clock_ms: Callable[[], int] = _now_ms,
        single_key: SingleKeySettings | None = None,
        policies: Callable[[str], TopicPolicies] | None = None,
        check_interval: float = HOUSEKEEPING_INTERVAL,
        stored_topics: Callable[[], list[str]] | None = None,
        tail_cache: TailCacheBudget | None = None,
        gate: Callable[[str], None] | None = None,
    ) -> None:
        self._registry_path = registry_path
        # Raises NotServedHereError for a topic this pod does not serve now (its shard is owned by
        # another pod or fenced for a move, server/shard_moves.py); None: every topic is served. Asked
        # only where a topic is opened or a transaction is ended on a topic not open: an open topic
        # is served (a fence closes the shard's topics first).
        self._gate = gate
        # Every partition's recently written entries draw on this one budget (topic/tailcache.py).
        self.tail_cache = tail_cache or TailCacheBudget()
        # A topic's retention, message TTL and backlog quota now (server/topic_policies.py merges them).
        self._policies = policies or (lambda _topic: NO_POLICIES)
        self._check_interval = check_interval
        # The topics with a managed ledger on disk (None: unknown): after a restart, those under a
        # retention policy are opened too, so that retention trims them without waiting for a write.
        self._stored_topics = stored_topics
        self._opening_stored: asyncio.Task[None] | None = None
        self.single_key = single_key or SingleKeySettings()
        # Whether a topic's managed ledger exists on disk (without creating it); None: assume it does.
        self._ledger_exists = ledger_exists
        self._clock_ms = clock_ms
        # (topic, subscription or "", txn) -> until when (ms): ends applied to a topic or subscription
        # this pod did not hold. Nothing was there to end, so nothing is created for them, but a later
        # produce or ack of that txn (a zombie holding a still-valid ticket) must still be refused.
        self._fences: dict[tuple[str, str, TxnID], int] = {}
        self._open_ledger = open_ledger
        self._open_pending_ack = open_pending_ack
        self._partitions: dict[str, Partition] = {}
        self._ledgers: dict[str, TopicLedger] = {}
        self._subscriptions: dict[tuple[str, str], Subscription] = {}
        self._pending_acks: dict[tuple[str, str], PendingAckHandle] = {}
        self._opening: SingleFlight[object, object] = SingleFlight()
        self._registry: dict[str, list[str]] = {}
        self._registry_lock = asyncio.Lock()
        self._deleting: set[tuple[str, str]] = set()  # subscriptions being unsubscribed
        self._housekeepers: dict[str, asyncio.Task[None]] = {}
        # Transaction ends applied per topic since start: the txn/s a shard's listing reports.
        self.txn_ends: dict[str, int] = {}
        self.recovered = False
        # Topics whose recovery could not read their entries: (monotonic time to try again, refusal).
        self._unopenable: dict[str, tuple[float, DataUnreadableError]] = {}

    async def recover(self) -> None:
        self._registry = load_registry(self._registry_path)
        for topic, subs in self._registry.items():
            if not self._served(topic):
                continue  # its shard is another pod's or being moved: opened when it is served here
            try:
                await self.partition(topic)
                for sub in subs:
                    await self.subscription(topic, sub)
            except DataUnreadableError as exc:
                # One topic whose offloaded entries cannot be read must not keep the pod's other
                # topics down: it stays closed, its requests are refused naming why, and it is opened
                # again at its next use.
                log.error("%s (left closed at start)", exc)
        self.recovered = True
        if self._stored_topics is not None:  # after readiness: nothing waits for these
            self._opening_stored = asyncio.get_running_loop().create_task(self._open_retained())

    async def _open_retained(self) -> None:
        """Open the topics on disk that no subscription or writer registered but a retention policy
        covers (a topic nobody subscribed to is trimmed under retention, also after a restart)."""
        assert self._stored_topics is not None
        for topic in await asyncio.to_thread(self._stored_topics):
            if topic in self._partitions or name_problem("topic", topic) is not None:
                continue
            if not self._served(topic):
                continue
            if self._policies(topic).retention is None:
                continue
            try:
                await self.partition(topic)
            except DataUnreadableError as exc:  # stays closed, as a registered topic would (recover)
                log.error("%s (left closed: its retention is applied once it opens)", exc)
            except Exception:  # the topic stays as it is on disk; a write to it opens it again
                log.exception("opening topic %s to apply its retention failed", topic)

    async def close(self) -> None:
        if self._opening_stored is not None:
            self._opening_stored.cancel()
            await asyncio.gather(self._opening_stored, return_exceptions=True)
        for task in self._housekeepers.values():
            task.cancel()
        await asyncio.gather(*self._housekeepers.values(), return_exceptions=True)
        for partition in self._partitions.values():
            await partition.close()
        for subscription in self._subscriptions.values():
            await subscription.close()
        for handle in self._pending_acks.values():
            await handle.close()

    # --- shards moving between pods (server/shard_moves.py) ------------------------------------------
    def _served(self, topic: str) -> bool:
        if self._gate is None:
            return True
        try:
            self._gate(topic)
        except Exception:
            return False
        return True

    def check_served(self, topic: str) -> None:
        """Raise the redirect (NotServedHereError) unless this pod serves ``topic`` now."""
        if self._gate is not None:
            self._gate(topic)

    def registered_topics(self) -> list[str]:
        """Topics of the subscription registry (with or without subscriptions)."""
        return list(self._registry)

    def open_topics(self) -> list[str]:
        return list(self._partitions)

    async def close_topics(self, topics: set[str]) -> None:
        """Close these topics (their partitions, readers, subscriptions and pending-ack logs), as a
        pod close does, and forget them: the next use opens them again if they are served then. Taken
        out of the lookups first, so that a request arriving meanwhile opens, and is refused by the
        gate, instead of writing to what is closing; queued writes finish inside ``close``."""
        partitions = [(t, self._partitions.pop(t)) for t in list(self._partitions) if t in topics]
        subscriptions = [(k, self._subscriptions.pop(k)) for k in list(self._subscriptions) if k[0] in topics]
        handles = [self._pending_acks.pop(k) for k in list(self._pending_acks) if k[0] in topics]
        for topic in topics:
            self._ledgers.pop(topic, None)
            self._unopenable.pop(topic, None)
        tasks = [self._housekeepers.pop(t) for t in list(self._housekeepers) if t in topics]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, partition in partitions:
            for reader in list(partition.readers):
                await reader.close()
            partition.readers.clear()
            await partition.close()
        for _, subscription in subscriptions:
            await subscription.close()
        for handle in handles:
            await handle.close()

    def registry_rows(self, topics: Iterable[str]) -> dict[str, list[str]]:
        return {t: list(self._registry[t]) for t in topics if t in self._registry}

    async def merge_registry(self, rows: dict[str, list[str]]) -> None:
        """Add topics and subscriptions received from another pod (a shard moved here)."""
        async with self._registry_lock:
            updated = {t: list(s) for t, s in self._registry.items()}
            for topic, subs in rows.items():
                held = updated.setdefault(topic, [])
                held.extend(s for s in subs if s not in held)
            if updated != self._registry:
                await asyncio.to_thread(save_registry, self._registry_path, updated)
            self._registry = updated

    async def drop_registry(self, topics: set[str]) -> None:
        """Forget these topics' rows (their shard moved away and its copy is deleted)."""
        async with self._registry_lock:
            updated = {t: list(s) for t, s in self._registry.items() if t not in topics}
            if updated != self._registry:
                await asyncio.to_thread(save_registry, self._registry_path, updated)
            self._registry = updated

    async def open_registered(self, topics: Iterable[str]) -> None:
        """Open these registered topics and their subscriptions now (what ``recover`` does at start),
        e.g. a received shard once this pod owns it: pending acks are known before a consumer comes."""
        for topic in topics:
            try:
                await self.partition(topic)
                for sub in list(self._registry.get(topic, [])):
                    await self.subscription(topic, sub)
            except Exception as exc:  # opened again at its next use, which reports the same failure
                log.error("opening received topic %s failed: %s", topic, exc)

    # --- lookup/creation ---------------------------------------------------------------------------
    async def partition(self, topic: str) -> Partition:
        existing = self._partitions.get(topic)
        if existing is not None:
            return existing
        validate_name("topic", topic)
        if self._gate is not None:
            self._gate(topic)
        refused = self._unopenable.get(topic)
        if refused is not None and time.monotonic() < refused[0]:
            raise refused[1]  # tried moments ago: not every request replays up to the damage again
        return await self._single_flight(("p", topic), lambda: self._create_partition(topic))

    async def subscription(self, topic: str, name: str, *, from_latest: bool = False) -> Subscription:
        """The subscription ``name`` of ``topic``, created if it does not exist: then it starts at the
        topic's first message, or with ``from_latest`` after its last entry (Pulsar's initial position
        Latest). An existing subscription keeps its position either way."""
        existing = self._subscriptions.get((topic, name))
        if existing is not None:
            return existing
        if (topic, name) in self._deleting:
            raise UnavailableError(f"subscription {name!r} of {topic} is being deleted: subscribe again")
        validate_name("subscription", name)
        if self._gate is not None:
            self._gate(topic)
        return await self._single_flight(
            ("s", topic, name), lambda: self._create_subscription(topic, name, from_latest)
        )

    async def open_reader(
        self, topic: str, name: str, after: Position | None, *, from_latest: bool = False
    ) -> Subscription:
        """A reader (non-durable subscription, topic/readers.py) of ``topic`` delivering what comes
        after ``after`` (None: from the first entry), or with ``from_latest`` what is written from now."""
        validate_name("subscription", name)
        partition = self._partitions.get(topic) or await self.partition(topic)
        layout = cast(LedgerLayout, partition.ledger)
        if from_latest:
            after = partition.ledger.last_confirmed_entry()
        if after is None:
            ids = layout.ledger_ids()
            after = Position(ids[0] if ids else 0, -1)
        subscription = Subscription(
            topic,
            name,
            reader=partition,
            cursor=ReaderCursor(layout, after),
            buffer=partition.buffer,
            pending_log=ReaderAcks(),
        )
        partition.readers.add(subscription)
        subscription.start()
        return subscription

    async def close_reader(self, reader: Subscription) -> None:
        partition = self._partitions.get(reader.topic)
        if partition is not None:
            partition.readers.discard(reader)
        await reader.close()

    async def seek_target(
        self, topic: str, *, message: Position | None = None, publish_time_ms: int | None = None
    ) -> Position:
        """Where a seek moves a subscription's cursor (its new mark-delete position) so that the
        next message delivered is ``message`` (or, with ``publish_time_ms``, the first message
        published at or after it). A message before the topic's first live entry seeks to the
        start, one past its last entry to the end; None for both: the start."""
        partition = self._partitions.get(topic) or await self.partition(topic)
        ledger = partition.ledger
        layout = cast(LedgerLayout, ledger)
        ids = ledger.ledger_ids()
        start = Position(ids[0] if ids else 0, -1)
        last = ledger.last_confirmed_entry()
        if last is None:
            return start
        if publish_time_ms is not None:
            # Compared with the producer's publish time, as Pulsar's seek does: the store's write
            # time is later by the send's latency, which moved the seek past messages it must deliver.
            found = await newest_older_than(
                partition, ledger.ledger_facts(), start, publish_time_ms - 1, None, time_of=sent_time_ms
            )
            return found or start
        if message is None or message <= start:
            return start
        if message > last:
            return last
        if message.ledger_id not in ids:  # between live ledgers: from the next one's start
            return Position(min(i for i in ids if i > message.ledger_id), -1)
        entry = min(message.entry_id, layout.confirmed_entries(message.ledger_id))
        return Position(message.ledger_id, entry - 1)

    async def last_message_position(self, topic: str) -> Position | None:
        partition = self._partitions.get(topic) or await self.partition(topic)
        return await partition.last_message_position()

    def partitions(self) -> dict[str, Partition]:
        return self._partitions

    def pending_ack_handles(self) -> dict[tuple[str, str], PendingAckHandle]:
        return self._pending_acks

    async def _single_flight(self, key: object, make: Callable[[], Awaitable[T]]) -> T:
        return cast(T, await self._opening.run(key, make))

    async def _create_partition(self, topic: str) -> Partition:
        ledger = await self._open_ledger(topic)
        self._ledgers[topic] = ledger
        snapshot = snapshot_path(self._registry_path.parent / SNAPSHOT_DIR, topic)
        partition = Partition(
            topic,
            ledger,
            snapshot,
            writers=self.single_key.table(topic),
            policies=partial(self._policies, topic),
            tail_cache=self.tail_cache,
        )
        try:
            await partition.recover()
        except DataUnreadableError as exc:
            refusal = DataUnreadableError(
                f"{exc}; the pod's other topics are served, and this one is opened again at its next "
                f"use (at most every {REOPEN_UNREADABLE_SECONDS:g} s) once the data can be read"
            )
            self._unopenable[topic] = (time.monotonic() + REOPEN_UNREADABLE_SECONDS, refusal)
            raise refusal from exc
        self._unopenable.pop(topic, None)
        if not self._served(topic):  # fenced while it was opening: the fence closes what it finds
            await partition.close()
            assert self._gate is not None
            self._gate(topic)
        self._partitions[topic] = partition
        self._housekeepers[topic] = asyncio.get_running_loop().create_task(
            partition.housekeeping_forever(self._check_interval)
        )
        return partition

    async def _create_subscription(self, topic: str, name: str, from_latest: bool) -> Subscription:
        partition = await self.partition(topic)
        ledger = self._ledgers[topic]
        if name in self._registry.get(topic, []):
            owner = f"subscription {name!r} of topic {topic!r} (listed in {self._registry_path})"
            cursor = await ledger.reopen_cursor(name, owner=owner)
            handle = await self._open_pending_ack(topic, name)
        else:
            # Cursor and pending-ack log first, the registry entry last: a registered subscription
            # always has its cursor file, so a missing one is a loss to refuse, not a crash between.
            # A cursor file of an unregistered name is a leftover (an unsubscribe or a creation cut
            # short by a crash: nothing was acknowledged through it since): it starts afresh.
            await ledger.delete_cursor(name)
            cursor = await ledger.open_cursor(name)
            last = ledger.last_confirmed_entry() if from_latest else None
            start = cursor.mark_delete_position()
            if last is not None and (start is None or start < last):
                await cursor.mark_delete(last)
            handle = await self._open_pending_ack(topic, name)
            try:
                await self._register(topic, name)
            except BaseException:
                await handle.close()  # a retried subscribe opens it again
                raise
        subscription = Subscription(
            topic, name, reader=partition, cursor=cursor, buffer=partition.buffer, pending_log=handle
        )
        await subscription.recover(await handle.recovered())
        if not self._served(topic):  # fenced while it was opening
            await subscription.close()
            await handle.close()
            assert self._gate is not None
            self._gate(topic)
        self._pending_acks[(topic, name)] = handle
        self._subscriptions[(topic, name)] = subscription
        partition.attach(subscription)
        subscription.start()
        return subscription

    async def unsubscribe(self, topic: str, name: str, consumer_id: int) -> None:
        """Delete the durable subscription ``name`` (Pulsar's UNSUBSCRIBE) on behalf of its consumer
        ``consumer_id``: refused while another consumer is attached or a transaction holds acks on
        it. The registry entry goes first (a restart never reopens it), then its cursor (the entries
        it held back become trimmable) and its pending-ack log; a crash between leaves files that the
        next subscription of that name replaces."""
        key = (topic, name)
        subscription = self._subscriptions.get(key)
        if subscription is None:
            raise BadRequestError(f"subscription {name!r} of {topic} is not open on this pod")
        others = [c for c in subscription.consumer_ids() if c != consumer_id]
        if others:
            raise ConsumerBusyError(
                f"subscription {name!r} of {topic} has {len(others)} other consumer(s): close them first"
            )
        if subscription.holds_transactions():
            raise ConsumerBusyError(
                f"subscription {name!r} of {topic} holds acks of open transactions: end them first"
            )
        self._deleting.add(key)
        try:
            del self._subscriptions[key]
            partition = self._partitions.get(topic)
            if partition is not None and partition.subscriptions.get(name) is subscription:
                del partition.subscriptions[name]
            handle = self._pending_acks.pop(key, None)
            await subscription.close()
            async with self._registry_lock:
                updated = {
                    t: [n for n in subs if n != name or t != topic] for t, subs in self._registry.items()
                }
                await asyncio.to_thread(save_registry, self._registry_path, updated)
                self._registry = updated
            await self._ledgers[topic].delete_cursor(name)
            if handle is not None:
                await handle.destroy()
        finally:
            self._deleting.discard(key)

    async def register_topic(self, topic: str) -> None:
        """Remember ``topic`` durably so a restart opens (and recovers) it before the pod reports
        ready: a single-routing-key block left without its marker is aborted then."""
        if topic in self._registry:
            return
        async with self._registry_lock:
            if topic in self._registry:
                return
            updated = {t: list(s) for t, s in self._registry.items()}
            updated[topic] = []
            await asyncio.to_thread(save_registry, self._registry_path, updated)
            self._registry = updated

    async def _register(self, topic: str, name: str) -> None:
        if name in self._registry.get(topic, []):
            return
        async with self._registry_lock:
            updated = {t: list(s) for t, s in self._registry.items()}
            subs = updated.setdefault(topic, [])
            if name not in subs:
                subs.append(name)
                await asyncio.to_thread(save_registry, self._registry_path, updated)
            self._registry = updated

    # --- operations ----------------------------------------------------------------------------------
    # The lookups below try the dict first: an open partition (the usual case) then costs no
    # coroutine of its own on the produce and end paths.
    async def publish(self, topic: str, payload: bytes, key: str, txn_id: TxnID | None) -> Position:
        if txn_id is not None and self._fences:
            self.check_fence(topic, "", txn_id)
        partition = self._partitions.get(topic) or await self.partition(topic)
        return await partition.publish_future(payload, key, txn_id)

    def publish_notify(
        self,
        topic: str,
        payload: bytes | memoryview,
        key: str,
        txn_id: TxnID | None,
        notify: WriteNotify,
        *,
        metadata: bytes = b"",
    ) -> None:
        """``publish`` settled by a callback (``Partition.publish_notify``): an open partition (the
        usual case) queues the message at the call and costs no coroutine, task or future; refusals
        then raise at the call. A partition not open yet is opened by a task, which reports its
        refusals to ``notify``. ``metadata``: Pulsar's MessageMetadata of a message sent over Pulsar's
        protocol, stored with it."""
        partition = self._partitions.get(topic)
        if partition is None:
            # a copy while the partition opens: a view would keep the whole read it came in alive
            message = (bytes(payload), key, metadata)
            opening = asyncio.ensure_future(self._open_then_publish(topic, message, txn_id))
            opening.add_done_callback(partial(notify_from_future, notify))
            return
        if txn_id is not None:
            self.check_fence(topic, "", txn_id)
        partition.publish_notify(payload, key, txn_id, notify, metadata=metadata)

    async def _open_then_publish(
        self, topic: str, message: tuple[bytes, str, bytes], txn_id: TxnID | None
    ) -> Position:
        if txn_id is not None and self._fences:
            self.check_fence(topic, "", txn_id)
        partition = await self.partition(topic)
        payload, key, metadata = message
        return await partition.publish_future(payload, key, txn_id, metadata)

    async def publish_idempotent(
        self,
        topic: str,
        payload: bytes | memoryview,
        key: str,
        producer_name: str,
        sequence_id: int,
        *,
        epoch: int | None = None,
        metadata: bytes = b"",
    ) -> BlockResult:
        partition = self._partitions.get(topic) or await self.partition(topic)
        return await partition.publish_idempotent(
            payload, key, producer_name, sequence_id, epoch=epoch, metadata=metadata
        )

    # --- fences: ends of transactions on topics or subscriptions this pod does not hold -------------
    def _unknown_topic(self, topic: str) -> bool:
        if topic in self._partitions or self._ledger_exists is None:
            return False
        validate_name("topic", topic)
        return not self._ledger_exists(topic)

    def _unknown_subscription(self, topic: str, name: str) -> bool:
        if (topic, name) in self._subscriptions:
            return False
        validate_name("subscription", name)
        return name not in self._registry.get(topic, [])

    def _fence(self, topic: str, subscription: str, txn_id: TxnID, deadline_ms: int) -> None:
        now = self._clock_ms()
        until = deadline_ms + FENCE_GRACE_MS if deadline_ms else now + UNKNOWN_DEADLINE_FENCE_MS
        if until > now:
            self._fences[(topic, subscription, txn_id)] = until
        if len(self._fences) % 1024 == 0:
            self._fences = {k: v for k, v in self._fences.items() if v > now}

    def check_fence(self, topic: str, subscription: str, txn_id: TxnID) -> None:
        """Refuse a produce or ack of a txn that already ended on this topic or subscription."""
        if not self._fences:  # the usual case: no key to build and hash per transactional ack
            return
        until = self._fences.get((topic, subscription, txn_id))
        if until is None:
            return
        if until <= self._clock_ms():
            del self._fences[(topic, subscription, txn_id)]
            return
        where = f"{topic}/{subscription}" if subscription else topic
        raise InvalidTxnStatusError(f"transaction {txn_id} already ended on {where}")

    @property
    def fence_count(self) -> int:
        return len(self._fences)

    async def end_txn_on_partition(
        self, topic: str, txn_id: TxnID, commit: bool, deadline_ms: int = 0
    ) -> None:
        partition = self._partitions.get(topic)
        if partition is None:
            if self._gate is not None:
                self._gate(topic)  # never "ended" as unknown here: the outcome belongs to the owner
            if self._unknown_topic(topic):
                self._fence(topic, "", txn_id, deadline_ms)
                return
            partition = await self.partition(topic)
        await partition.end_txn(txn_id, commit, deadline_ms)

    async def end_txn_on_subscription(
        self, topic: str, name: str, txn_id: TxnID, commit: bool, deadline_ms: int = 0
    ) -> None:
        subscription = self._subscriptions.get((topic, name))
        if subscription is None:
            if self._gate is not None:
                self._gate(topic)
            if self._unknown_subscription(topic, name):
                self._fence(topic, name, txn_id, deadline_ms)
                return
            subscription = await self.subscription(topic, name)
        await subscription.end_txn(txn_id, commit, deadline_ms)

    def end_txn_on_store(
        self,
        txn_id: TxnID,
        commit: bool,
        topics: Iterable[str],
        subscriptions: list[tuple[str, str]],
        deadline_ms: int = 0,
    ) -> asyncio.Future[None]:
        """End the transaction on these partitions and subscriptions of this pod, all at once.

        Partition and subscription ends queue their record at the call and return futures, so they
        overlap without a task each (only a partition or subscription not open yet takes one); the
        future resolves once every end settled, failing with the first failure if any.
        """
        waiting, refused = self.end_txn_parts(txn_id, commit, topics, subscriptions, deadline_ms)
        return first_failure(waiting, refused)

    def end_txn_parts(
        self,
        txn_id: TxnID,
        commit: bool,
        topics: Iterable[str],
        subscriptions: list[tuple[str, str]],
        deadline_ms: int = 0,
    ) -> tuple[list[asyncio.Future[Any]], BaseException | None]:
        """``end_txn_on_store`` unsettled: the futures of the partition and subscription ends (in
        order) and the first refusal raised at a call (the others were still queued), so that a
        caller ending many transactions waits on all their parts at once (``settled.when_all``)
        instead of on a combining future per transaction. The transaction's outcome is the refusal,
        else the first of the futures that failed."""
        waiting: list[asyncio.Future[Any]] = []
        first_error: BaseException | None = None
        topics = list(topics)
        if self._gate is not None:
            # Refused whole when any of its topics is not served here (docs/contracts.md §12): the
            # coordinator re-groups the end by owner, and no part of it is applied twice or lost.
            try:
                for topic in (*topics, *(t for t, _ in subscriptions)):
                    if topic not in self._partitions:
                        self._gate(topic)
            except Exception as exc:
                return [], exc
        ends = self.txn_ends
        for topic in topics:
            ends[topic] = ends.get(topic, 0) + 1
            try:
                partition = self._partitions.get(topic)
                if partition is None:
                    waiting.append(
                        asyncio.ensure_future(self.end_txn_on_partition(topic, txn_id, commit, deadline_ms))
                    )
                else:
                    waiting.append(partition.end_txn(txn_id, commit, deadline_ms))
            except Exception as exc:  # the others still end; the coordinator retries the whole end
                first_error = first_error or exc
        for topic, name in subscriptions:
            try:
                subscription = self._subscriptions.get((topic, name))
                if subscription is None:
                    waiting.append(
                        asyncio.ensure_future(
                            self.end_txn_on_subscription(topic, name, txn_id, commit, deadline_ms)
                        )
                    )
                else:
                    waiting.append(subscription.end_txn(txn_id, commit, deadline_ms))
            except Exception as exc:
                first_error = first_error or exc
        return waiting, first_error
