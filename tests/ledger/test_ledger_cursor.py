"""Cursors: mark-delete, individual deletes, Pulsar ack sets, auto-advance, persistence across reopen."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.ackset import mask_to_words, mask_without, words_to_mask
from txnkeeper.ledger.rangeset import EntryRangeSet


async def test_new_cursor_starts_before_the_first_live_entry(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    p = await ml.add_entry(b"a")
    cursor = await ml.open_cursor("sub")
    assert cursor.mark_delete_position() == Position(p.ledger_id, -1)
    assert not cursor.is_deleted(p)
    assert cursor.ack_set(p) is None
    assert await ml.open_cursor("sub") is cursor


async def test_individual_deletes_advance_mark_delete_across_ledgers(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=3))
    ps = [await ml.add_entry(b"%d" % i) for i in range(8)]  # ledgers: 3 + 3 + 2
    cursor = await ml.open_cursor("sub")
    await cursor.delete([ps[1], ps[2], ps[3], ps[5], ps[6]])
    assert cursor.mark_delete_position() == Position(ps[0].ledger_id, -1)
    assert cursor.is_deleted(ps[5]) and not cursor.is_deleted(ps[4])
    await cursor.delete([ps[0]])  # 0..3 contiguous: across the first ledger boundary
    assert cursor.mark_delete_position() == ps[3]
    await cursor.delete([ps[4]])  # 4, 5 close the second ledger, 6 continues into the third
    assert cursor.mark_delete_position() == ps[6]
    assert cursor.stats()["individuallyDeletedMessages"] == "[]"


async def test_mark_delete_and_its_bad_input(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    ps = [await ml.add_entry(b"x") for _ in range(5)]
    cursor = await ml.open_cursor("sub")
    await cursor.delete([ps[3]])
    await cursor.mark_delete(ps[2])  # advances over the deleted ps[3]
    assert cursor.mark_delete_position() == ps[3]
    await cursor.mark_delete(ps[0])  # backwards: no-op
    assert cursor.mark_delete_position() == ps[3]
    with pytest.raises(ValueError, match="does not exist"):
        await cursor.mark_delete(Position(ps[0].ledger_id, 99))
    with pytest.raises(ValueError, match="does not exist"):
        await cursor.delete([ps[4], Position(ps[0].ledger_id + 7, 0)])
    assert not cursor.is_deleted(ps[4])  # nothing of a refused call was applied


async def test_batch_index_deletes_follow_pulsar_ack_sets(factory: ManagedLedgerFactory) -> None:
    ml = await factory.open("log")
    a = await ml.add_entry(b"batch-a")
    b = await ml.add_entry(b"batch-b")
    cursor = await ml.open_cursor("sub")
    await cursor.delete_batch_indexes(a, 70, [0, 65])
    assert cursor.is_batch_index_deleted(a, 0) and cursor.is_batch_index_deleted(a, 65)
    assert not cursor.is_batch_index_deleted(a, 1)
    assert not cursor.is_deleted(a)
    # set bit = still present; 70 bits -> 2 words, Java longs (signed)
    assert cursor.ack_set(a) == mask_to_words(((1 << 70) - 1) & ~1 & ~(1 << 65))
    assert cursor.ack_set(a) == [-2, 0b111101]
    # PIP-160 deletes index i with "every bit set except i"; the cursor ANDs them
    await cursor.apply_ack_set(a, mask_to_words(mask_without(70, [1])), 70)
    assert cursor.is_batch_index_deleted(a, 1)
    await cursor.delete_batch_indexes(a, 70, [i for i in range(70) if i not in (0, 1, 65)])
    assert cursor.is_deleted(a)  # no bit left: the entry is deleted and mark-delete moves
    assert cursor.mark_delete_position() == a
    assert cursor.ack_set(a) == []
    with pytest.raises(ValueError, match="outside the batch"):
        await cursor.delete_batch_indexes(b, 4, [4])
    with pytest.raises(ValueError, match="batch_size"):
        await cursor.delete_batch_indexes(b, 0, [])


async def test_cursor_state_survives_reopen(tmp_path: Path) -> None:
    f1 = ManagedLedgerFactory(tmp_path)
    ml = await f1.open("log", ManagedLedgerConfig(max_entries_per_ledger=4))
    ps = [await ml.add_entry(b"%d" % i) for i in range(10)]
    cursor = await ml.open_cursor("persistent://t/ns/topic-sub")
    await cursor.mark_delete(ps[1])
    await cursor.delete([ps[4], ps[5], ps[8]])
    await cursor.delete_batch_indexes(ps[3], 10, [2, 7])
    await cursor.apply_ack_set(ps[6], [0b1010], 4)
    before = cursor.stats()
    await f1.close()

    f2 = ManagedLedgerFactory(tmp_path)
    ml = await f2.open("log", ManagedLedgerConfig(max_entries_per_ledger=4))
    cursor = await ml.open_cursor("persistent://t/ns/topic-sub")
    assert cursor.stats() == before
    assert cursor.mark_delete_position() == ps[1]
    assert [cursor.is_deleted(p) for p in ps] == [
        True,
        True,
        False,
        False,
        True,
        True,
        False,
        False,
        True,
        False,
    ]
    assert cursor.is_batch_index_deleted(ps[3], 2) and cursor.is_batch_index_deleted(ps[3], 7)
    assert not cursor.is_batch_index_deleted(ps[3], 3)
    assert cursor.ack_set(ps[6]) == [0b1010]
    await cursor.delete([ps[2]])  # 3 still has batch indexes present: mark-delete stops before it
    assert cursor.mark_delete_position() == ps[2]
    await cursor.delete([ps[3]])  # a whole-entry delete overrides its ack set; 4, 5 follow
    assert cursor.mark_delete_position() == ps[5]
    assert cursor.ack_set(ps[3]) == []
    await f2.close()


@given(st.lists(st.integers(0, 200), max_size=80), st.integers(-1, 200))
def test_range_set_matches_a_plain_set(ids: list[int], cut: int) -> None:
    ranges = EntryRangeSet()
    for i in ids:
        ranges.add(i)
    assert all(i in ranges for i in ids)
    assert sum(1 for i in range(-2, 205) if i in ranges) == len(set(ids))
    merged = list(ranges.ranges())
    assert all(a_end + 1 < b_start for (_, a_end), (b_start, _) in itertools.pairwise(merged))
    ranges.remove_through(cut)
    assert {i for i in range(-2, 205) if i in ranges} == {i for i in ids if i > cut}


@given(st.integers(1, 200), st.sets(st.integers(0, 199)))
def test_ack_set_words_round_trip(batch_size: int, deleted: set[int]) -> None:
    indexes = [i for i in deleted if i < batch_size]
    mask = mask_without(batch_size, indexes)
    words = mask_to_words(mask)
    assert all(-(1 << 63) <= w < (1 << 63) for w in words)
    assert not words or words[-1] != 0  # BitSet.toLongArray drops trailing zero words
    assert words_to_mask(words, batch_size) == mask
    assert words_to_mask([w & ((1 << 64) - 1) for w in words], batch_size) == mask  # unsigned accepted


async def test_close_returns_after_every_change_a_write_already_covered(tmp_path: Path) -> None:
    """The first change's write covers all the others, which still wait for the write lock; a close
    at that moment must not return before they do (it did, on a loaded machine)."""
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    ps = [await ml.add_entry(b"x") for _ in range(10)]
    cursor = await ml.open_cursor("c")
    changes = [asyncio.ensure_future(cursor.delete([p])) for p in ps]
    await asyncio.sleep(0)  # every change accepted: applied in memory, the first one's write started
    assert cursor._persisted < cursor._changes
    for _ in range(100_000):  # until the first write is on disk and recorded as covering every change
        if cursor._persisted >= cursor._changes:
            break
        await asyncio.sleep(0)
    assert cursor._persisted >= cursor._changes, "the first write never finished"
    assert not all(c.done() for c in changes), "no change was still waiting: nothing to test"
    await cursor.close()
    assert all(c.done() and c.exception() is None for c in changes)
    await factory.close()


async def test_close_waits_for_every_accepted_cursor_change(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    ps = [await ml.add_entry(b"x") for _ in range(40)]
    cursor = await ml.open_cursor("c")
    changes = [asyncio.ensure_future(cursor.delete([p])) for p in ps[1::2]]
    await asyncio.sleep(0)  # let every change be accepted (applied in memory, waiting for its write)
    await factory.close()
    assert all(c.done() and c.exception() is None for c in changes)
    factory = ManagedLedgerFactory(tmp_path)
    cursor = await (await factory.open("log")).open_cursor("c")
    assert [cursor.is_deleted(p) for p in ps] == [i % 2 == 1 for i in range(40)]
    await factory.close()
