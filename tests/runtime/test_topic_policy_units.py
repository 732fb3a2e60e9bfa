"""The pure parts of topic policies: backlog sizes, where eviction and TTL move a cursor, the
producers' gate of a backlog quota, and the config section from a CR's spec to what a partition
applies (issue 25 item 14)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from txnkeeper.contract import store_settings
from txnkeeper.errors import BacklogQuotaExceededError
from txnkeeper.ledger.position import Position
from txnkeeper.ledger.retention import LedgerFacts, Retention
from txnkeeper.server import topic_policies
from txnkeeper.topic import policies
from txnkeeper.topic.policies import (
    BacklogQuota,
    QuotaGate,
    TopicPolicies,
    bytes_after,
    capped,
    newest_older_than,
    size_eviction_target,
)
from txnkeeper.topic.records import encode_data, encode_marker
from txnkeeper.txnid import TxnID

# ledger 1: 10 entries, 1000 bytes (closed at t=100 s); ledger 2: 10 entries, 2000 bytes (open)
FACTS = [LedgerFacts(1, 10, 1000, True, 100.0), LedgerFacts(2, 10, 2000, False, None)]


def test_backlog_sizes_as_pulsar_estimates_them() -> None:
    assert bytes_after(FACTS, Position(1, -1)) == 3000
    assert bytes_after(FACTS, Position(1, 4)) == 500 + 2000
    assert bytes_after(FACTS, Position(1, 9)) == 2000
    assert bytes_after(FACTS, Position(2, 9)) == 0
    assert bytes_after(FACTS, Position(0, 3)) == 3000  # a mark-delete in a trimmed ledger


@pytest.mark.parametrize(
    ("limit", "target"),
    [
        (10_000, None),  # 90 % of it holds everything
        (2500, Position(1, 7)),  # 2250 bytes may stay: ledger 2 and 2 entries (200 bytes) of ledger 1
        (2222, Position(2, 0)),  # 1999: not all of ledger 2 (its entries are 200 bytes): its newest 9
        (1000, Position(2, 5)),  # 900 bytes kept: the newest 4 entries of ledger 2
        (0, Position(2, 9)),  # nothing kept
    ],
)
def test_eviction_keeps_the_newest_entries_within_ninety_percent(limit: int, target: Position | None) -> None:
    assert size_eviction_target(FACTS, limit) == target


def test_no_move_passes_an_open_transaction() -> None:
    assert capped(Position(3, 5), None) == Position(3, 5)
    assert capped(Position(3, 5), Position(3, 6)) == Position(3, 5)
    assert capped(Position(3, 9), Position(3, 6)) == Position(3, 5)
    assert capped(Position(4, 9), Position(3, 0)) == Position(3, -1)
    assert capped(None, Position(3, 0)) is None


class Entries:
    """A partition's entries for a time scan: (position, data) in order."""

    def __init__(self, entries: list[tuple[Position, bytes]]) -> None:
        self.entries = entries
        self.reads = 0

    async def read_after(self, position: Position | None, max_entries: int) -> list[tuple[Position, bytes]]:
        self.reads += 1
        return [e for e in self.entries if position is None or e[0] > position][:max_entries]


async def test_a_time_scan_finds_the_newest_older_message() -> None:
    marker = encode_marker(TxnID(0, 1), True)
    entries = Entries(
        [
            (Position(2, 0), encode_data(b"a", "", None, 5_000)),
            (Position(2, 1), marker),  # no time: passed
            (Position(2, 2), encode_data(b"b", "", None, 6_000)),
            (Position(2, 3), encode_data(b"c", "", None, 9_000)),
        ]
    )
    # ledger 1 closed at 100 s, after the cutoff: it is read, not taken whole (its first message is young)
    young = Entries([(Position(1, 0), encode_data(b"y", "", None, 50_000)), *entries.entries])
    assert await newest_older_than(young, FACTS, Position(1, -1), 7_000, None) is None
    old = [LedgerFacts(1, 10, 1000, True, 1.0), LedgerFacts(2, 4, 100, False, None)]
    assert await newest_older_than(entries, old, Position(1, -1), 7_000, None) == Position(2, 2)
    assert entries.reads == 1  # ledger 1 (closed at 1 s) was taken without reading it
    assert await newest_older_than(entries, old, Position(1, -1), 5_500, None) == Position(2, 0)
    # the cap (an open txn at 2:2) ends it; the marker before it is left for dispatch to pass
    assert await newest_older_than(entries, old, Position(1, -1), 99_000, Position(2, 2)) == Position(2, 0)
    assert await newest_older_than(entries, old, Position(1, -1), 99_000, Position(1, 4)) is None
    assert await newest_older_than(entries, old, Position(2, 3), 99_000, None) is None


async def test_the_gate_holds_releases_in_order_refuses_and_times_out() -> None:
    clock = [0.0]
    gate = QuotaGate("t", clock=lambda: clock[0])
    order: list[Any] = []
    assert gate.open and gate.admit(10, order.append)
    gate.update("subscription 's' has 9 bytes of backlog, over the limit of 1 bytes", policies.HOLD)
    assert not gate.open
    assert not gate.admit(10, lambda failure: order.append(("first", failure)))
    waiting = gate.wait(10)
    assert waiting is not None and gate.held == 2
    clock[0] = 5
    gate.update(gate.reason, policies.HOLD)  # still over: they stay held
    assert gate.held == 2 and order == []
    gate.update(None, policies.HOLD)  # drained: released in arrival order
    assert order == [("first", None)] and gate.held == 0 and gate.open
    await asyncio.wait_for(asyncio.ensure_future(waiting), 1)

    gate.update("over", policies.HOLD)
    assert not gate.admit(1, lambda failure: order.append(("late", failure)))
    clock[0] = 5 + policies.HOLD_TIMEOUT_SECONDS
    gate.update("over", policies.HOLD)
    assert isinstance(order[-1][1], BacklogQuotaExceededError) and "held 20 s" in str(order[-1][1])
    with pytest.raises(BacklogQuotaExceededError, match="bytes of sends are held already"):
        gate.admit(policies.HOLD_MAX_BYTES + 1, order.append)

    gate.update("over", policies.EXCEPTION)
    with pytest.raises(BacklogQuotaExceededError, match=r"backlog quota of t is exceeded \(over\); nothing"):
        gate.admit(1, order.append)
    gate.update("over", policies.EVICTION)  # eviction never holds producers back
    assert gate.open and gate.refused == 3


def test_a_crs_topic_policies_reach_a_partition() -> None:
    spec = {
        "retentionMinutes": 1440,
        "retentionSizeMB": -1,
        "messageTTLSeconds": 3600,
        "backlogQuotaLimitBytes": 10 * 1024**3,
        "backlogQuotaPolicy": "consumer_backlog_eviction",
        "checkIntervalSeconds": 30,
    }
    section = store_settings.topic_policies_config(spec)
    assert section == {
        "retention": {"retentionTimeInMinutes": 1440, "retentionSizeInMB": -1},
        "messageTTL": {"messageTTLInSeconds": 3600},
        "backlogQuota": {"limitSize": 10 * 1024**3, "policy": "consumer_backlog_eviction"},
        "checkIntervalSeconds": 30,
    }
    pod = topic_policies.parse_section(section, "topicPolicies")
    assert pod.check_interval_seconds == 30
    assert topic_policies.topic_policies(pod.blocks) == TopicPolicies(
        Retention(1440 * 60_000, -1), 3600, BacklogQuota(10 * 1024**3, -1, "consumer_backlog_eviction")
    )
    assert store_settings.topic_policies_config({}) == {}
    assert topic_policies.topic_policies({}) == TopicPolicies()  # nothing configured: the old rule
    # a block that leaves a key out has Pulsar's default for it
    assert topic_policies.topic_policies({"retention": {"retentionSizeInMB": 5}}).retention == Retention(
        0, 5 * 1024**2
    )
