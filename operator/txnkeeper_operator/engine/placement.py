"""The scaling engine's vocabulary: moves in flight and their phases, what the pods report, the actions.

Why a module of its own: the move state is the operator's durable memory of scaling (ConfigMap
``<resource>-placement``, key ``moves.json``, beside the record's ``placement.json``) and the local
fleet's too, so its values and its JSON codec must be one, pure, and free of Kubernetes. A move's
``phase`` is always the step to take next, written before that step runs: an operator that restarts
repeats it (every §12 verb is idempotent for the same move id).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from txnkeeper.contract.placement import MAX_MEMBERS, Placement, PlacementKind

STATE_VERSION = 1
MAX_STEP_FAILURES = 5  # a step that failed this often rolls its move back (when it still can)


class MovePhase(StrEnum):
    PRECOPY = "precopy"  # next: POST .../precopy on the target (store shards: closed files, no fence)
    FENCE = "fence"  # next: POST .../fence on the source
    RECEIVE = "receive"  # next: POST .../receive on the target
    SWITCH = "switch"  # next: record epoch+1 with the target as owner, PUT to target, source, all
    RELEASE = "release"  # next: POST .../release on the source; then the move is done
    ROLLBACK = "rollback"  # next: POST .../discard on the target, .../unfence on the source


class MoveReason(StrEnum):
    DRAIN = "drain"  # off a pod being removed (scale-in)
    COUNT = "count"  # even out shard counts (scale-out, rebalance)
    LOAD = "load"  # even out measured bytes/s and txn/s (rebalance)


@dataclass(frozen=True, slots=True)
class Move:
    """One shard (coordinator id) on its way from ``source`` to ``target`` (pod ordinals)."""

    id: str
    unit: int
    source: int
    target: int
    phase: MovePhase
    reason: MoveReason
    failures: int = 0
    error: str = ""
    # Why a rollback was started (kept so the failed-move record can say it).
    rollback_reason: str = ""

    def involves(self, ordinal: int) -> bool:
        return ordinal in (self.source, self.target)


@dataclass(frozen=True, slots=True)
class FailedMove:
    """A move that was rolled back after failing for good: its unit stays on ``source`` and is not
    moved again automatically (a scale-in that needs it is refused) until a rebalance is requested."""

    id: str
    unit: int
    source: int
    target: int
    error: str


@dataclass(frozen=True, slots=True)
class Rebalance:
    """A rebalance in progress: why, and which units it moved already (each at most once per run, so
    rates measured afresh on a new owner never bounce a unit back and forth)."""

    reason: str
    moved: frozenset[int] = frozenset()
    by_load: bool = False  # some unit moved for load (the count rule then only restores mean +- 1)


@dataclass(frozen=True, slots=True)
class ScalingState:
    """Everything the operator persists about scaling besides the record itself."""

    # The replica count of the first record: pods started without a copy of the record use
    # Placement.initial(kind, --replicas, --shards) with exactly this (it must never change).
    initial_replicas: int
    next_move: int = 1
    moves: tuple[Move, ...] = ()
    failed: tuple[FailedMove, ...] = ()
    rebalance: Rebalance | None = None
    # The replica count the placement was last balanced for (a different spec.replicas starts one).
    balanced_for: int = 0

    # ---- JSON (ConfigMap key moves.json; the local fleet's file) ------------------------------------
    def to_json(self) -> dict[str, object]:
        return {
            "version": STATE_VERSION,
            "initialReplicas": self.initial_replicas,
            "nextMove": self.next_move,
            "balancedFor": self.balanced_for,
            "moves": [
                {
                    "id": m.id,
                    "unit": m.unit,
                    "source": m.source,
                    "target": m.target,
                    "phase": str(m.phase),
                    "reason": str(m.reason),
                    "failures": m.failures,
                    "error": m.error,
                    "rollbackReason": m.rollback_reason,
                }
                for m in self.moves
            ],
            "failed": [
                {"id": f.id, "unit": f.unit, "source": f.source, "target": f.target, "error": f.error}
                for f in self.failed
            ],
            "rebalance": None
            if self.rebalance is None
            else {
                "reason": self.rebalance.reason,
                "moved": sorted(self.rebalance.moved),
                "byLoad": self.rebalance.by_load,
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def loads(cls, text: str, where: str = "moves.json") -> ScalingState:
        """Parse; every problem is a ScalingStateError naming ``where`` and the field."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ScalingStateError(f"{where}: not JSON ({exc})") from None
        try:
            return _state(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ScalingStateError(f"{where}: {exc!r}") from None


class ScalingStateError(ValueError):
    """A persisted scaling state that cannot be used (the operator stops scaling and says so)."""


def _int(raw: Mapping[str, object], key: str, low: int = 0, high: int = 1 << 62) -> int:
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer in {low}..{high}, not {value!r}")
    return value


def _str(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value


def _state(raw: object) -> ScalingState:
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        raise ValueError(f"must be an object with version {STATE_VERSION}")
    moves = tuple(
        Move(
            id=_str(m, "id"),
            unit=_int(m, "unit"),
            source=_int(m, "source", 0, MAX_MEMBERS - 1),
            target=_int(m, "target", 0, MAX_MEMBERS - 1),
            phase=MovePhase(m["phase"]),
            reason=MoveReason(m["reason"]),
            failures=_int(m, "failures"),
            error=_str(m, "error"),
            rollback_reason=_str(m, "rollbackReason"),
        )
        for m in raw["moves"]
    )
    failed = tuple(
        FailedMove(
            _str(f, "id"),
            _int(f, "unit"),
            _int(f, "source", 0, MAX_MEMBERS - 1),
            _int(f, "target", 0, MAX_MEMBERS - 1),
            _str(f, "error"),
        )
        for f in raw["failed"]
    )
    reb = raw.get("rebalance")
    rebalance = None
    if reb is not None:
        by_load = reb.get("byLoad", False)
        if not isinstance(by_load, bool):
            raise TypeError("rebalance.byLoad must be a boolean")
        rebalance = Rebalance(
            _str(reb, "reason"), frozenset(_int({"u": u}, "u") for u in reb["moved"]), by_load
        )
    return ScalingState(
        initial_replicas=_int(raw, "initialReplicas", 1, MAX_MEMBERS),
        next_move=_int(raw, "nextMove", 1),
        moves=moves,
        failed=failed,
        rebalance=rebalance,
        balanced_for=_int(raw, "balancedFor"),
    )


# ---- what the pods report ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnitLoad:
    """One unit's measured load (``GET /admin/v1/shards``): bytes on disk, bytes/s in, txn/s."""

    bytes: int = 0
    bytes_per_second: float = 0.0
    txn_per_second: float = 0.0


@dataclass(frozen=True, slots=True)
class MemberView:
    """One pod ordinal as observed right now."""

    ordinal: int
    ready: bool
    # The epoch of the record the pod judges by; None: not known (not ready, no answer).
    epoch: int | None = None
    # unit -> state ("serving", "fenced", "received") of every unit it holds data of; None: unknown.
    held: Mapping[int, str] | None = None
    load: Mapping[int, UnitLoad] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScalingInput:
    kind: PlacementKind
    placement: Placement
    state: ScalingState
    desired_replicas: int
    # The StatefulSet's spec.replicas as it is now (the pods that exist or are being created).
    statefulset_replicas: int
    members: tuple[MemberView, ...]
    max_concurrent_moves: int = 1
    rebalance_requested: bool = False

    def member(self, ordinal: int) -> MemberView | None:
        return next((m for m in self.members if m.ordinal == ordinal), None)

    def ready(self, ordinal: int) -> bool:
        view = self.member(ordinal)
        return view is not None and view.ready and ordinal < self.statefulset_replicas


# ---- actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleStatefulSet:
    """Set the StatefulSet's replicas (up before moves, down once the removed pods hold nothing)."""

    replicas: int
    reason: str


@dataclass(frozen=True, slots=True)
class MoveStep:
    """Carry out ``move``'s current phase (fence, receive, release or rollback) on the pods."""

    move: Move


@dataclass(frozen=True, slots=True)
class PushPlacement:
    """PUT the record to these pods, in this order (a move's switch: target, source, then the rest;
    otherwise pods whose copy is older). ``move``: the switch this push completes, if any."""

    ordinals: tuple[int, ...]
    move: Move | None = None


ScalingAction = ScaleStatefulSet | MoveStep | PushPlacement


def describe_move(move: Move, kind: PlacementKind) -> str:
    """``shard 3 (s3-m7) from pod 2 to pod 0``."""
    unit = "shard" if kind == "store-shards" else "coordinator id"
    return f"{unit} {move.unit} ({move.id}) from pod {move.source} to pod {move.target}"


def describe_step(move: Move, kind: PlacementKind) -> str:
    """One line for Events and status: what this phase of ``move`` does."""
    where = describe_move(move, kind)
    match move.phase:
        case MovePhase.PRECOPY:
            return f"pre-copy the closed files of {where}"
        case MovePhase.FENCE:
            return f"fence {where}"
        case MovePhase.RECEIVE:
            return f"copy {where}"
        case MovePhase.SWITCH:
            return f"switch the owner of {where}"
        case MovePhase.RELEASE:
            return f"release the old copy of {where}"
        case MovePhase.ROLLBACK:
            return f"roll back the move of {where}: {move.rollback_reason or move.error}"
    raise AssertionError(move.phase)
