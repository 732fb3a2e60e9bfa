"""The checks a partition runs at each interval for its message TTL and backlog quota.

Why its own module: the partition owns writes, reads and the transaction buffer; what its policies
do to subscriptions and producers at each check is a separate concern, with its own state (the
quota's gate, the counters behind the metrics) and its own reads. It reaches the partition only
through the narrow parts passed in, so it is tested on real ledgers without a store pod.
Retention is applied by the partition's trim (``ledger/retention.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from txnkeeper.ledger.position import Position
from txnkeeper.ledger.retention import LedgerFacts
from txnkeeper.topic.policies import (
    EVICTION,
    BacklogQuota,
    BacklogReader,
    PolicyStats,
    QuotaGate,
    bytes_after,
    capped,
    newest_older_than,
    oldest_age_ms,
    size_eviction_target,
)


class Skippable(Protocol):
    """A subscription as the checks move it (``topic.subscription.Subscription``)."""

    def mark_delete_position(self) -> Position | None: ...

    def is_acknowledged(self, position: Position) -> bool: ...

    async def skip_through(self, position: Position) -> bool: ...


class PolicyChecks:
    """Message TTL and backlog quota of one partition (docs/contracts.md §6, "Topic policies")."""

    def __init__(
        self,
        topic: str,
        reader: BacklogReader,
        facts: Callable[[], list[LedgerFacts]],
        first_open: Callable[[], Position | None],
        subscriptions: Mapping[str, Skippable],
    ) -> None:
        self._reader = reader
        self._facts = facts
        self._first_open = first_open  # the max read position's bound: no move passes it
        self._subscriptions = subscriptions
        self.gate = QuotaGate(topic)
        self.stats = PolicyStats()
        # Why the backlog quota was over at the last check (None: it was not), whatever its policy.
        self.backlog_exceeded: str | None = None

    async def expire_messages(self, ttl_seconds: int) -> None:
        """Message TTL: every subscription acknowledges the messages published more than
        ``ttl_seconds`` ago (up to the first younger one, and never past an open transaction's)."""
        cutoff = int(time.time() * 1000) - ttl_seconds * 1000
        facts = self._facts()
        cap = self._first_open()
        for subscription in list(self._subscriptions.values()):
            after = subscription.mark_delete_position()
            if after is None:
                continue
            target = capped(await newest_older_than(self._reader, facts, after, cutoff, cap), cap)
            if target is not None and await subscription.skip_through(target):
                self.stats.ttl_skips += 1

    async def check_backlog(self, quota: BacklogQuota | None) -> None:
        """Measure every subscription's backlog against ``quota``: evict (``consumer_backlog_eviction``)
        or tell the producers' gate (hold, exception); also the storage and backlog gauges."""
        facts = self._facts()
        stats = self.stats
        stats.storage_bytes = sum(info.size for info in facts)
        active = quota is not None and quota.active
        over: str | None = None
        largest = 0
        now = int(time.time() * 1000)
        for name, subscription in list(self._subscriptions.items()):
            after = subscription.mark_delete_position()
            if after is None:
                continue
            size = bytes_after(facts, after)
            if quota is not None and active:
                reason = await self._over_quota(name, subscription, quota, size, now)
                evicted = reason is not None and quota.policy == EVICTION
                if evicted and await self._evict(subscription, quota, facts, after, now):
                    size = bytes_after(facts, subscription.mark_delete_position() or after)
                    reason = await self._over_quota(name, subscription, quota, size, now)
                over = over or reason
            largest = max(largest, size)
        stats.backlog_bytes = largest
        self.backlog_exceeded = over
        if quota is None or not active:
            self.gate.update(None, "")
        else:
            self.gate.update(over if quota.policy != EVICTION else None, quota.policy)

    async def _evict(
        self,
        subscription: Skippable,
        quota: BacklogQuota,
        facts: list[LedgerFacts],
        after: Position,
        now: int,
    ) -> bool:
        """Move ``subscription`` forward until it is within ``quota`` (the newest messages stay)."""
        cap = self._first_open()
        target = size_eviction_target(facts, quota.limit_bytes) if quota.limit_bytes >= 0 else None
        if quota.limit_seconds >= 0:
            by_time = await newest_older_than(
                self._reader, facts, after, now - quota.limit_seconds * 1000, cap
            )
            if by_time is not None and (target is None or by_time > target):
                target = by_time
        target = capped(target, cap)
        if target is None or not await subscription.skip_through(target):
            return False
        self.stats.eviction_skips += 1
        return True

    async def _over_quota(
        self, name: str, subscription: Skippable, quota: BacklogQuota, size: int, now_ms: int
    ) -> str | None:
        """Why ``subscription`` is over ``quota`` (None: it is not)."""
        if 0 <= quota.limit_bytes < size:
            limit = quota.limit_bytes
            return f"subscription {name!r} has {size} bytes of backlog, over the limit of {limit} bytes"
        if quota.limit_seconds >= 0:
            after = subscription.mark_delete_position()
            if after is not None:
                age = await oldest_age_ms(self._reader, after, subscription.is_acknowledged, now_ms)
                if age > quota.limit_seconds * 1000:
                    return (
                        f"subscription {name!r} has messages {age / 1000:.1f} s old, older than the limit of "
                        f"{quota.limit_seconds} s"
                    )
        return None
