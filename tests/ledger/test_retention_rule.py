"""Pulsar's retention rule as ``ledgers_to_trim`` decides it (pure: ledger facts in, ids out), and on
a real managed ledger: a trim with a retention policy, without cursors, bounded by ``keep_from``."""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.position import Position
from txnkeeper.ledger.retention import LedgerFacts, Retention, ledgers_to_trim

MB = 1024 * 1024
NOW = 10_000.0
INF = float("inf")


def ledger(ledger_id: int, size: int, closed_ago: float | None, closed: bool = True) -> LedgerFacts:
    return LedgerFacts(ledger_id, 10, size, closed, None if closed_ago is None else NOW - closed_ago)


# four closed ledgers of 1 MB closed 400, 300, 200, 100 s ago, and the open one (1 MB)
LEDGERS = [ledger(i, MB, 500 - 100 * i) for i in range(1, 5)] + [ledger(5, MB, None, closed=False)]


@pytest.mark.parametrize(
    ("consumed_before", "retention", "keep_from", "trimmed"),
    [
        # without retention: every closed ledger every cursor is done with (a prefix)
        (3, None, None, [1, 2]),
        (INF, None, None, [1, 2, 3, 4]),  # never the open one
        (INF, None, 3, [1, 2]),  # nor any from keep_from on (an open transaction's)
        # retention 0/0 (Pulsar's default): as without retention
        (INF, Retention(0, 0), None, [1, 2, 3, 4]),
        # infinite: nothing
        (INF, Retention(-1, -1), None, []),
        # size: keep at least 2 MB of the topic's 5 MB (the open ledger counts)
        (INF, Retention(-1, 2 * MB), None, [1, 2, 3]),
        (INF, Retention(-1, 2 * MB + 1), None, [1, 2]),
        (2, Retention(-1, 2 * MB), None, [1]),  # still only what every cursor is done with
        # time: closed more than 250 s ago
        (INF, Retention(250_000, -1), None, [1, 2]),
        (INF, Retention(1_000_000, -1), None, []),
        # both limits: a ledger goes when either is exceeded (Pulsar), and the walk stops at the first
        # ledger inside both
        (INF, Retention(250_000, 4 * MB), None, [1, 2]),
        (INF, Retention(1_000_000, 3 * MB), None, [1, 2]),
        (INF, Retention(1_000_000, 0), None, [1, 2, 3, 4]),  # size 0 keeps nothing, whatever the time
        (INF, Retention(250_000, 3 * MB), 2, [1]),
    ],
)
def test_the_rule(
    consumed_before: float, retention: Retention | None, keep_from: int | None, trimmed: list[int]
) -> None:
    assert ledgers_to_trim(LEDGERS, consumed_before, retention, NOW, keep_from) == trimmed


def test_a_ledger_of_unknown_age_is_never_expired_by_time() -> None:
    unknown = [ledger(1, MB, None), ledger(2, MB, 100), ledger(3, 0, None, closed=False)]
    assert ledgers_to_trim(unknown, INF, Retention(0, -1), NOW) == []
    assert ledgers_to_trim(unknown, INF, Retention(0, 0), NOW) == [1, 2]  # the size rule still applies


async def test_trim_with_retention_on_a_managed_ledger(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("persistent://t/ns/r", ManagedLedgerConfig(max_entries_per_ledger=2))
    for i in range(7):
        await ml.add_entry(f"e{i}".encode())
    first, second, third, current = ml.ledger_ids()
    facts = ml.ledger_facts()
    assert [f.ledger_id for f in facts] == [first, second, third, current]
    assert [f.closed for f in facts] == [True, True, True, False] and facts[-1].closed_at is None
    assert all(f.closed_at is not None for f in facts[:3]) and [f.entries for f in facts] == [2, 2, 2, 1]
    assert await ml.trim() == []  # no cursor, no retention: nobody said the data is consumed
    assert await ml.trim(Retention(-1, -1)) == []
    assert await ml.trim(Retention(0, 0), keep_from_ledger=third) == [first, second]
    cursor = await ml.open_cursor("c")  # at the earliest live entry: nothing consumed
    assert await ml.trim(Retention(0, 0)) == []
    await cursor.mark_delete(Position(current, 0))
    assert await ml.trim(Retention(0, 0)) == [third]
    assert ml.ledger_ids() == [current]
    await factory.close()
