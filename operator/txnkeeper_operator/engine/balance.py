"""Which units to move next, and where: drains first, then shard counts, then measured load.

Why its own module: the choice is the only judgement in scaling (everything else is a fixed phase
machine), and it must be deterministic (ties broken by ordinal and unit id) so that an operator that
restarts chooses exactly what it would have chosen, and the scenarios can print it.

The rules, in order, each only while moves may start (``slots``):
 1. Drain: every unit owned by a pod being removed goes to the serving pod with the fewest units
    (then the least load, then the lowest ordinal).
 2. Count (only during a rebalance, and only once every pod that stays is Ready): units move from the
    pod with the most to the pod with the fewest until no two pods differ by more than one (the
    cheapest unit, fewest bytes, first). Once the run moved a unit for load, only a pod more than one
    away from the mean starts this again (else it would undo the load moves).
 3. Load (only during a rebalance, with every pod's load known): a unit moves from the pod with the
    highest share of bytes/s + txn/s to the one with the lowest when the counts stay within one of the
    mean and the busier pod's share drops by at least ``LOAD_MIN_GAIN``; each unit at most once per run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from txnkeeper_operator.engine.placement import MoveReason, UnitLoad

LOAD_MIN_GAIN = 0.10


@dataclass(frozen=True, slots=True)
class Pick:
    unit: int
    source: int
    target: int
    reason: MoveReason


@dataclass(frozen=True, slots=True)
class Field:
    """The board the choice is made on."""

    owners: Sequence[int]  # unit -> owner, with moves in flight counted at their targets
    movable: frozenset[int]  # units that may start a move (none in flight, none failed)
    staying: Sequence[int]  # ordinals that remain (0..desired-1)
    ready: frozenset[int]  # ordinals that are Ready and hold the current record
    draining: frozenset[int]  # ordinals being removed
    load: Mapping[int, UnitLoad]  # per unit, where known
    load_known: bool  # every staying pod reported its load
    rebalancing: bool
    moved: frozenset[int]  # units this rebalance moved already
    by_load: bool = False  # this rebalance moved a unit for load: counts may now differ by two


def _counts(owners: Sequence[int], ordinals: Iterable[int]) -> dict[int, int]:
    counts = dict.fromkeys(ordinals, 0)
    for owner in owners:
        if owner in counts:
            counts[owner] += 1
    return counts


def _shares(owners: Sequence[int], load: Mapping[int, UnitLoad], ordinals: Iterable[int]) -> dict[int, float]:
    """Each pod's share of the total bytes/s plus its share of the total txn/s (0..2)."""
    total_bps = sum(load.get(u, UnitLoad()).bytes_per_second for u in range(len(owners)))
    total_tps = sum(load.get(u, UnitLoad()).txn_per_second for u in range(len(owners)))
    shares = dict.fromkeys(ordinals, 0.0)
    for unit, owner in enumerate(owners):
        if owner in shares:
            shares[owner] += unit_share(load.get(unit, UnitLoad()), total_bps, total_tps)
    return shares


def unit_share(load: UnitLoad, total_bps: float, total_tps: float) -> float:
    bps = load.bytes_per_second / total_bps if total_bps > 0 else 0.0
    tps = load.txn_per_second / total_tps if total_tps > 0 else 0.0
    return bps + tps


def choose(board: Field, slots: int) -> list[Pick]:
    """Up to ``slots`` new moves, in the order they should start."""
    owners = list(board.owners)
    picks: list[Pick] = []
    movable = set(board.movable)
    targets = [o for o in board.staying if o in board.ready]
    if not targets or slots <= 0:
        return picks

    def take(unit: int, target: int, reason: MoveReason) -> None:
        picks.append(Pick(unit, owners[unit], target, reason))
        owners[unit] = target
        movable.discard(unit)

    # 1. drain the pods being removed
    for unit in sorted(movable):
        if len(picks) >= slots:
            return picks
        source = owners[unit]
        if source not in board.draining or source not in board.ready:
            continue
        counts = _counts(owners, targets)
        shares = _shares(owners, board.load, targets)
        target = min(targets, key=lambda o: (counts[o], shares[o], o))
        take(unit, target, MoveReason.DRAIN)
    if not board.rebalancing or len(targets) != len(board.staying):
        return picks
    mean = len(owners) / len(board.staying)
    # 2. counts
    counts = _counts(owners, targets)
    uneven = max(counts.values()) - min(counts.values()) > 1
    if any(c > mean + 1 or c < mean - 1 for c in counts.values()) or (uneven and not board.by_load):
        while len(picks) < slots:
            counts = _counts(owners, targets)
            heavy = max(targets, key=lambda o: (counts[o], -o))
            light = min(targets, key=lambda o: (counts[o], o))
            if counts[heavy] - counts[light] <= 1:
                break
            candidates = [u for u in sorted(movable) if owners[u] == heavy]
            if not candidates:
                break
            unit = min(candidates, key=lambda u: (board.load.get(u, UnitLoad()).bytes, u))
            take(unit, light, MoveReason.COUNT)
        return picks
    # 3. load
    if not board.load_known:
        return picks
    total_bps = sum(board.load.get(u, UnitLoad()).bytes_per_second for u in range(len(owners)))
    total_tps = sum(board.load.get(u, UnitLoad()).txn_per_second for u in range(len(owners)))
    while len(picks) < slots:
        counts = _counts(owners, targets)
        shares = _shares(owners, board.load, targets)
        heavy = max(targets, key=lambda o: (shares[o], -o))
        light = min(targets, key=lambda o: (shares[o], o))
        if heavy == light or counts[heavy] - 1 < mean - 1 or counts[light] + 1 > mean + 1:
            break
        best: tuple[float, int] | None = None
        for unit in sorted(movable - board.moved):
            if owners[unit] != heavy:
                continue
            share = unit_share(board.load.get(unit, UnitLoad()), total_bps, total_tps)
            if share <= 0:
                continue
            after = max(shares[heavy] - share, shares[light] + share)
            if best is None or after < best[0]:
                best = (after, unit)
        if best is None or best[0] > shares[heavy] * (1 - LOAD_MIN_GAIN):
            break
        take(best[1], light, MoveReason.LOAD)
    return picks
