"""Randomised operations against a plain model: deletes, ack sets, mark-delete, rollovers, trims, reopens.

The model is the obvious one (a set of deleted positions over the ordered list of every position ever
appended); the managed ledger and its cursor must agree with it after every step, also after reopening.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedCursor, ManagedLedger, ManagedLedgerConfig, ManagedLedgerFactory, Position

CONFIG = ManagedLedgerConfig(max_entries_per_ledger=5)


class Model:
    def __init__(self) -> None:
        self.positions: list[Position] = []  # every appended position, in order
        self.deleted: set[Position] = set()
        self.remaining: dict[Position, set[int]] = {}  # batched entries: batch indexes still present
        self.trimmed: set[int] = set()

    def prefix_end(self) -> Position | None:
        last = None
        for p in self.positions:
            if p not in self.deleted:
                break
            last = p
        return last


async def check(ml: ManagedLedger, cursor: ManagedCursor, model: Model) -> None:
    end = model.prefix_end()
    md = cursor.mark_delete_position()
    assert md is not None
    if end is not None:
        assert md >= end
        assert not any(p <= md for p in model.positions if p not in model.deleted)
    for p in model.positions:
        assert cursor.is_deleted(p) == (p in model.deleted), p
        if p in model.remaining and p not in model.deleted:
            assert all(cursor.is_batch_index_deleted(p, i) == (i not in model.remaining[p]) for i in range(8))
    live = ml.ledger_ids()
    assert not set(live) & model.trimmed
    present = [e.position for e in await ml.read_entries(Position(0, 0), 10_000)]
    assert present == [p for p in model.positions if p.ledger_id in live]


@pytest.mark.parametrize("seed", range(6))
async def test_random_operations_match_the_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model = Model()
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("model", CONFIG)
    cursor = await ml.open_cursor("c")
    for _ in range(120):
        op = rng.random()
        undeleted = [
            p for p in model.positions if p not in model.deleted and p.ledger_id not in model.trimmed
        ]
        if op < 0.35 or not undeleted:
            for _ in range(rng.randint(1, 4)):
                model.positions.append(await ml.add_entry(b"%d" % len(model.positions)))
        elif op < 0.55:
            picks = rng.sample(undeleted, k=min(len(undeleted), rng.randint(1, 3)))
            await cursor.delete(picks)
            model.deleted.update(picks)
        elif op < 0.72:
            p = rng.choice(undeleted)
            indexes = rng.sample(range(8), k=rng.randint(1, 4))
            await cursor.delete_batch_indexes(p, 8, indexes)
            left = model.remaining.setdefault(p, set(range(8)))
            left.difference_update(indexes)
            if not left:
                model.deleted.add(p)
        elif op < 0.8:
            p = rng.choice(undeleted)
            await cursor.mark_delete(p)
            model.deleted.update(q for q in model.positions if q <= p)
        elif op < 0.87:
            await ml.rollover()
        elif op < 0.95:
            trimmed = await ml.trim()
            closed = [lid for lid in ml.ledger_ids() + trimmed if lid != ml.current_ledger_id()]
            # exactly the closed ledgers such that every position up to their end is deleted
            expected = sorted(
                lid
                for lid in closed
                if lid not in model.trimmed
                and all(p in model.deleted for p in model.positions if p.ledger_id <= lid)
            )
            assert sorted(trimmed) == expected
            model.trimmed.update(trimmed)
        else:
            await factory.close()
            factory = ManagedLedgerFactory(tmp_path)
            ml = await factory.open("model", CONFIG)
            cursor = await ml.open_cursor("c")
        await check(ml, cursor, model)
    await factory.close()
