"""Every rollover trigger (entries, bytes, age on append, age by timer, on demand) and id monotonicity."""

from __future__ import annotations

import time
from pathlib import Path

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position

from .conftest import wait_for


async def test_rollover_by_max_entries(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=4))
    positions = [await ml.add_entry(b"e") for _ in range(10)]
    by_ledger: dict[int, list[int]] = {}
    for p in positions:
        by_ledger.setdefault(p.ledger_id, []).append(p.entry_id)
    assert list(by_ledger.values()) == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1]]
    assert ml.ledger_ids() == sorted(by_ledger)


async def test_rollover_by_max_bytes_lets_the_last_entry_exceed(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_size_per_ledger_bytes=250))
    positions = [await ml.add_entry(b"x" * 100) for _ in range(7)]
    ledgers = [p.ledger_id for p in positions]
    # 100, 200 (< 250), 300 (>= 250: the next append rolls), as Pulsar does
    assert ledgers == [ledgers[0]] * 3 + [ledgers[3]] * 3 + [ledgers[6]]
    assert len(set(ledgers)) == 3
    stats = ml.internal_stats()
    assert [led["size"] for led in stats["ledgers"]] == [300, 300, 100]


async def test_rollover_by_age_on_append(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_ledger_age_seconds=0.2))
    first = await ml.add_entry(b"a")
    deadline = time.monotonic() + 10
    while (p := await ml.add_entry(b"b")).ledger_id == first.ledger_id:
        assert time.monotonic() < deadline, "no age rollover within 10 s"
    # The append that found the ledger too old is the new ledger's first entry. On a loaded machine
    # that ledger may itself have aged past 0.2 s before the append's answer ran (CI saw ledger 3
    # current beside an answer in ledger 2), so the current one is that ledger or a later one.
    assert p.entry_id == 0
    assert first.ledger_id < p.ledger_id <= ml.current_ledger_id()


async def test_rollover_by_age_timer_without_appends(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_ledger_age_seconds=0.1))
    first = await ml.add_entry(b"a")
    await wait_for(lambda: len(ml.ledger_ids()) == 2, what="the age timer to roll the ledger over")
    assert ml.ledger_ids()[0] == first.ledger_id
    assert ml.internal_stats()["ledgers"][0]["entries"] == 1
    # an empty ledger is never rolled over by age: once it is old, the first append still lands in it
    empty = ml.current_ledger_id()
    created = time.monotonic()
    await wait_for(lambda: time.monotonic() - created > 0.3, what="the empty ledger to age")
    assert await ml.add_entry(b"b") == Position(empty, 0)


async def test_rollover_on_demand_returns_the_new_ledger(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    before = await ml.add_entry(b"a")
    new_id = await ml.rollover()
    assert new_id > before.ledger_id
    assert ml.current_ledger_id() == new_id
    assert ml.ledger_ids() == [before.ledger_id, new_id]
    after = await ml.add_entry(b"b")
    assert after == Position(new_id, 0)
    again = await ml.rollover()  # also when the current ledger is empty
    assert again > new_id


async def test_ledger_ids_never_reused_across_trims_and_restarts(tmp_path: Path) -> None:
    seen: list[int] = []
    for _ in range(3):
        factory = ManagedLedgerFactory(tmp_path)
        ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=2))
        cursor = await ml.open_cursor("c")
        for _ in range(5):
            p = await ml.add_entry(b"z")
            seen.append(p.ledger_id)
            await cursor.mark_delete(p)
        await ml.trim()
        await factory.close()
    ids_in_order = list(dict.fromkeys(seen))
    assert ids_in_order == sorted(ids_in_order)
    assert len(ids_in_order) == len(set(seen))


async def test_appends_during_rollover_keep_order(factory: ManagedLedgerFactory) -> None:
    import asyncio

    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=7))
    positions = await asyncio.gather(*(ml.add_entry(b"%d" % i) for i in range(100)))
    assert positions == sorted(positions)
    entries = await ml.read_entries(Position(0, 0), 1000)
    assert [e.data for e in entries] == [b"%d" % i for i in range(100)]
    assert [e.position for e in entries] == positions
