"""A topic's policies as its partition applies them: Pulsar's retention, message TTL and backlog quota.

Why its own module: the partition only asks "what do my policies say now" at each check; the rules
(what a backlog is, where TTL or eviction moves a cursor, when a producer is held or refused) live
here, in small pieces that each have their own tests. The settings themselves (config file, per-topic
overrides, admin verbs) are the server's (``server/topic_policies.py``); this layer gets the merged
result through a callable.

Three rules hold for every move the store makes on a subscription's behalf (TTL, eviction): it only
moves a cursor forward, never past the first message of an open transaction (Pulsar's max read
position: the subscription could not have read it yet, and acknowledging it would also let its
ledger be trimmed), and never past the last durable entry.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from txnkeeper.errors import BacklogQuotaExceededError
from txnkeeper.ledger.position import Position
from txnkeeper.ledger.retention import LedgerFacts, Retention
from txnkeeper.topic.records import publish_time_ms

HOLD = "producer_request_hold"
EXCEPTION = "producer_exception"
EVICTION = "consumer_backlog_eviction"
# Eviction brings a subscription's backlog to this share of the size limit (Pulsar's 0.9: a backlog
# evicted to exactly the limit would be over it again at the next send).
EVICTION_TARGET = 0.9
# A held send is answered BACKLOG_QUOTA_EXCEEDED after this long (below the client's 30 s operation
# timeout, so the producer learns why rather than timing out with an unknown outcome), and a topic
# holds at most this many bytes of sends (a producer that keeps sending cannot fill the store's memory).
HOLD_TIMEOUT_SECONDS = 20.0
HOLD_MAX_BYTES = 32 * 1024 * 1024
# While sends are held the policies are checked at least this often (a drained backlog lets them go).
HELD_CHECK_INTERVAL = 1.0
# Entries read per step of a time scan, and at most looked at to find a subscription's oldest message.
SCAN_BATCH = 256
OLDEST_LOOKAHEAD = 64


@dataclass(frozen=True)
class BacklogQuota:
    """Pulsar's BacklogQuota: a subscription's backlog may hold at most ``limit_bytes`` (-1: no limit)
    and its oldest unacknowledged message be at most ``limit_seconds`` old (-1: no limit)."""

    limit_bytes: int = -1
    limit_seconds: int = -1
    policy: str = HOLD

    @property
    def active(self) -> bool:
        return self.limit_bytes >= 0 or self.limit_seconds >= 0


@dataclass(frozen=True)
class TopicPolicies:
    """What applies to one topic now. ``retention`` None: none configured anywhere, so the store keeps
    its rule from before retention existed (ledgers go once every subscription is done with them; a
    topic without subscriptions keeps everything for a future one). ``message_ttl_seconds`` 0: no TTL."""

    retention: Retention | None = None
    message_ttl_seconds: int = 0
    backlog_quota: BacklogQuota | None = None


NO_POLICIES = TopicPolicies()


@dataclass(slots=True)
class PolicyStats:
    """Counters and gauges behind a topic's txnkeeper_topic_* policy metrics."""

    checks: int = 0
    trimmed_ledgers: int = 0
    ttl_skips: int = 0
    eviction_skips: int = 0
    storage_bytes: int = 0
    backlog_bytes: int = 0


class BacklogReader(Protocol):
    """What a time scan reads: the partition's entries after a position."""

    async def read_after(
        self, position: Position | None, max_entries: int
    ) -> list[tuple[Position, bytes]]: ...


# --- sizes -------------------------------------------------------------------------------------------


def bytes_after(facts: Sequence[LedgerFacts], position: Position) -> int:
    """Payload bytes after ``position`` (a subscription's mark-delete: its backlog), estimated as
    Pulsar does: whole ledgers after it, and the share of its own ledger's entries after it."""
    total = 0
    for info in facts:
        if info.ledger_id < position.ledger_id:
            continue
        if info.ledger_id > position.ledger_id:
            total += info.size
            continue
        remaining = info.entries - (position.entry_id + 1)
        if remaining > 0 and info.entries > 0:
            total += info.size * remaining // info.entries
    return total


def size_eviction_target(facts: Sequence[LedgerFacts], limit_bytes: int) -> Position | None:
    """The position to acknowledge through so that at most ``EVICTION_TARGET`` of ``limit_bytes``
    stays after it (newest entries kept), or None when everything fits."""
    budget = int(limit_bytes * EVICTION_TARGET)
    for info in reversed(facts):
        if info.entries <= 0:
            continue
        if info.size <= budget:
            budget -= info.size
            continue
        average = max(1, info.size // info.entries)
        keep = min(info.entries, budget // average)
        return Position(info.ledger_id, info.entries - keep - 1)
    return None


def capped(target: Position | None, cap: Position | None) -> Position | None:
    """``target``, but before ``cap`` (the first message of an open transaction), or None."""
    if target is None or cap is None or target < cap:
        return target
    if cap.entry_id > 0:
        return Position(cap.ledger_id, cap.entry_id - 1)
    return Position(cap.ledger_id, -1)  # everything before the cap's ledger (and none of it)


# --- times -------------------------------------------------------------------------------------------


async def newest_older_than(
    reader: BacklogReader,
    facts: Sequence[LedgerFacts],
    after: Position,
    cutoff_ms: int,
    cap: Position | None,
    *,
    time_of: Callable[[bytes], int | None] = publish_time_ms,
) -> Position | None:
    """The newest entry after ``after`` published at or before ``cutoff_ms`` with every message
    between them as old (the position message TTL or time eviction acknowledges through), before
    ``cap``; None when there is none.

    Whole ledgers closed before the cutoff are taken without reading them (their entries are all
    older, as Pulsar uses a ledger's close time); then entries are read from there until the first
    younger message. Markers carry no time: they are passed, never end the scan.
    """
    target: Position | None = None
    position = after
    for info in facts:
        if info.ledger_id < after.ledger_id or info.entries <= 0:
            continue
        last = Position(info.ledger_id, info.entries - 1)
        if last <= after:
            continue
        if (cap is not None and last >= cap) or info.closed_at is None or info.closed_at * 1000 > cutoff_ms:
            break
        target = position = last
    while True:
        entries = await reader.read_after(position, SCAN_BATCH)
        if not entries:
            return target
        for at, data in entries:
            if cap is not None and at >= cap:
                return target
            published = time_of(data)
            if published is not None:
                if published > cutoff_ms:
                    return target
                target = at
            position = at


async def oldest_age_ms(
    reader: BacklogReader,
    after: Position,
    acknowledged: Callable[[Position], bool],
    now_ms: int,
) -> int:
    """How old the oldest unacknowledged message after ``after`` is (0: none found among the next
    ``OLDEST_LOOKAHEAD`` entries, or none at all)."""
    for at, data in await reader.read_after(after, OLDEST_LOOKAHEAD):
        if acknowledged(at):
            continue
        published = publish_time_ms(data)
        if published is not None:
            return max(0, now_ms - published)
    return 0


# --- producers ---------------------------------------------------------------------------------------

# How a held send continues: resume(None) writes it now, resume(error) fails it with that error.
Resume = Callable[[BaseException | None], None]


class QuotaGate:
    """The producers' side of a topic's backlog quota, as the last check found it.

    While open (the usual case: one attribute read per send) every send is written. With the quota
    exceeded, ``producer_exception`` refuses each send and ``producer_request_hold`` queues it until
    a check finds the backlog drained (then every held send is written, in arrival order, before any
    newer one), the quota gone or changed, or the send held ``HOLD_TIMEOUT_SECONDS``.
    """

    def __init__(self, topic: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.open = True
        self.reason: str | None = None  # why the quota is exceeded (None: it is not)
        self.policy = HOLD
        self.refused = 0
        self._held: deque[tuple[float, int, Resume]] = deque()
        self._held_bytes = 0
        self._clock = clock

    @property
    def held(self) -> int:
        return len(self._held)

    def _error(self, what: str) -> BacklogQuotaExceededError:
        self.refused += 1
        return BacklogQuotaExceededError(
            f"backlog quota of {self.topic} is exceeded ({self.reason}); {what}: consume or acknowledge "
            "the backlog, or raise the quota (txnkeeper admin topics backlog-quota set)"
        )

    def admit(self, size: int, resume: Resume) -> bool:
        """True: write the send now. False: it is held (``resume`` is called later). Raises
        ``BacklogQuotaExceededError`` when it is refused."""
        if self.open:
            return True
        if self.reason is not None and self.policy == EXCEPTION:
            raise self._error("nothing was written")
        if self._held_bytes + size > HOLD_MAX_BYTES:
            raise self._error(f"{HOLD_MAX_BYTES} bytes of sends are held already, nothing was written")
        self._held.append((self._clock(), size, resume))
        self._held_bytes += size
        return False

    def wait(self, size: int) -> Awaitable[None] | None:
        """``admit`` for a coroutine: None to write now, else an awaitable that resolves when the
        held send may be written (or raises why not)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def resume(failure: BaseException | None) -> None:
            if not future.done():
                if failure is None:
                    future.set_result(None)
                else:
                    future.set_exception(failure)

        return None if self.admit(size, resume) else future

    def update(self, reason: str | None, policy: str) -> None:
        """The last check's finding: ``reason`` why the quota is exceeded (None: it is not, or the
        policy evicts instead of holding producers back)."""
        self.reason, self.policy = reason, policy
        if reason is not None and policy == HOLD:
            self.open = False
            now = self._clock()
            while self._held and now - self._held[0][0] >= HOLD_TIMEOUT_SECONDS:
                _, size, resume = self._held.popleft()
                self._held_bytes -= size
                resume(self._error(f"the send was held {HOLD_TIMEOUT_SECONDS:g} s and not written"))
            return
        refuse = reason is not None and policy == EXCEPTION
        self.open = not refuse
        while self._held:  # drained (or no longer holding): in arrival order, before any newer send
            _, size, resume = self._held.popleft()
            self._held_bytes -= size
            resume(self._error("nothing was written") if refuse else None)

    def fail_held(self, failure: BaseException) -> None:
        """Answer every held send with ``failure`` (the topic is closing)."""
        while self._held:
            _, size, resume = self._held.popleft()
            self._held_bytes -= size
            resume(failure)
