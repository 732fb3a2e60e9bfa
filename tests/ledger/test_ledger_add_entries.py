"""add_entries places a group of entries in one ledger: a rollover that is due, or that the group would
make due, runs before the group and never inside it (what keeps a single-routing-key block's MessageIds
contiguous, contracts §1 and §10). Real files, real fsyncs; positions are checked against reads."""

from __future__ import annotations

import asyncio

import pytest

from txnkeeper.ledger import (
    LedgerClosedError,
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
    Position,
)


async def _read_back(ml: ManagedLedger, positions: list[Position]) -> list[bytes]:
    return [await ml.read_entry(p) for p in positions]


async def test_a_group_that_would_cross_the_entry_limit_starts_a_new_ledger(
    factory: ManagedLedgerFactory,
) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=5))
    single = await ml.add_entry(b"s")
    first_group = [f"a{i}".encode() for i in range(3)]
    a = list(await asyncio.gather(*ml.add_entries(first_group)))
    assert a == [Position(single.ledger_id, i) for i in range(1, 4)]  # 4 entries: still fits
    second_group = [f"b{i}".encode() for i in range(3)]
    b = list(await asyncio.gather(*ml.add_entries(second_group)))
    # 4 + 3 > 5: the ledger rolled before the group, so it is entries 0..2 of the next ledger
    assert b[0].ledger_id > single.ledger_id
    assert b == [Position(b[0].ledger_id, i) for i in range(3)]
    assert await _read_back(ml, a) == first_group
    assert await _read_back(ml, b) == second_group
    assert ml.internal_stats()["ledgers"][0]["entries"] == 4  # the first ledger kept its 4 entries only


async def test_a_group_that_would_cross_the_size_limit_starts_a_new_ledger(
    factory: ManagedLedgerFactory,
) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_size_per_ledger_bytes=250))
    head = await ml.add_entry(b"h" * 100)
    group = [b"x" * 60, b"y" * 60, b"z" * 60]  # 100 + 180 > 250
    positions = list(await asyncio.gather(*ml.add_entries(group)))
    assert positions[0].ledger_id > head.ledger_id
    assert positions == [Position(positions[0].ledger_id, i) for i in range(3)]
    assert await _read_back(ml, positions) == group


async def test_a_group_larger_than_a_ledger_goes_whole_into_a_fresh_one(
    factory: ManagedLedgerFactory,
) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=3))
    head = await ml.add_entry(b"h")
    group = [f"g{i}".encode() for i in range(7)]
    positions = list(await asyncio.gather(*ml.add_entries(group)))
    assert positions[0].ledger_id > head.ledger_id
    assert positions == [Position(positions[0].ledger_id, i) for i in range(7)]
    after = await ml.add_entry(b"after")  # the oversized ledger is full: the next append rolls
    assert after == Position(after.ledger_id, 0) and after.ledger_id > positions[0].ledger_id
    assert await _read_back(ml, positions) == group


async def test_groups_stay_whole_across_a_reopen(factory: ManagedLedgerFactory) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    ml = await factory.open("log", config)
    written: list[tuple[list[bytes], list[Position]]] = []
    for n in range(6):  # groups of 3 against 4 entries per ledger: each one would straddle
        group = [f"{n}-{i}".encode() for i in range(3)]
        written.append((group, list(await asyncio.gather(*ml.add_entries(group)))))
    await ml.close()
    ml = await factory.open("log", config)
    for group, positions in written:
        assert positions == [Position(positions[0].ledger_id, i) for i in range(3)]
        assert await _read_back(ml, positions) == group
    reopened = list(await asyncio.gather(*ml.add_entries([b"r1", b"r2"])))
    assert reopened == [Position(reopened[0].ledger_id, i) for i in range(2)]


async def test_refusals_queue_nothing(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig())
    before = await ml.add_entry(b"before")
    with pytest.raises(ValueError, match="at least one entry"):
        ml.add_entries([])
    with pytest.raises(TypeError, match="must be bytes"):
        ml.add_entries([b"ok", "text"])  # type: ignore[list-item]
    after = await ml.add_entry(b"after")
    assert after == Position(before.ledger_id, before.entry_id + 1)  # nothing of the refused group
    await ml.close()
    with pytest.raises(LedgerClosedError):
        ml.add_entries([b"late"])
