"""Scaling a local store group with the operator's scaling engine: what scaling.py is to a cluster.

Why: the demo shows the lifecycle a cluster user sees, and scaling out under load (new pod, shards
moved to it while clients follow redirects) is part of it. The engine (``engine/moves.py``) is the
operator's, pure; this module is its I/O at the edge for local processes: the placement record and
the moves in flight are one checksummed state file (the ConfigMap's two keys), written before every
action it enables; "the StatefulSet" is the group's member list (a scale-in stops the removed members
and deletes their data, as ``whenScaled: Delete`` does once they hold nothing); the pods are reached
through the same admin-API calls the operator makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from txnkeeper import statefile
from txnkeeper.contract.admin import AdminClient, AdminError
from txnkeeper.contract.placement import Member, Placement, PlacementError
from txnkeeper.fleet.group import MemberGroup
from txnkeeper.fleet.process import RuntimeProcess
from txnkeeper_operator.engine.moves import ScalingDecision, completed, decide, failed
from txnkeeper_operator.engine.placement import (
    MemberView,
    MovePhase,
    MoveStep,
    PushPlacement,
    ScaleStatefulSet,
    ScalingAction,
    ScalingInput,
    ScalingState,
    ScalingStateError,
    UnitLoad,
    describe_step,
)

PLACEMENT_KIND = "fleet-placement"
PLACEMENT_VERSION = 1
MAX_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Placed:
    record: Placement
    state: ScalingState


class ScalingDriver:
    """One store group's placement, driven by the scaling engine. ``initial_replicas`` must be what
    the group's members were started with (``MemberGroup.placement_replicas``)."""

    def __init__(
        self, group: MemberGroup, admin: AdminClient, token: str, say: Callable[[str], None]
    ) -> None:
        if group.placement_replicas < 1:
            raise ValueError(f"group {group.name} was not started with placement (--replicas)")
        self.group = group
        self.admin = admin
        self.token = token
        self.say = say
        self.path = group.work_dir / f"{group.name}.placement"

    # ---- the "ConfigMap" -----------------------------------------------------------------------------
    def load(self) -> Placed:
        doc = statefile.read(self.path, PLACEMENT_KIND, frozenset({PLACEMENT_VERSION}))
        if doc is None:
            replicas = self.group.placement_replicas
            # Exactly the members' own epoch 1 (they derive it from --replicas and refuse another record
            # of the same epoch); their addresses come with epoch 2, at the first decision.
            return Placed(
                Placement.initial("store-shards", replicas),
                ScalingState(initial_replicas=replicas, balanced_for=replicas),
            )
        body = statefile.obj(doc.body, "fleet placement", {"record", "moves"})
        try:
            record = Placement.from_json(body.get("record"), f"{self.path}: record")
            state = ScalingState.loads(statefile.string(body.get("moves"), "moves"), f"{self.path}: moves")
        except (PlacementError, ScalingStateError) as err:
            raise statefile.StateFileError(self.path, str(err)) from None
        return Placed(record, state)

    def save(self, placed: Placed) -> None:
        body = {"record": placed.record.to_json(), "moves": placed.state.dumps()}
        statefile.write(self.path, PLACEMENT_KIND, PLACEMENT_VERSION, body)

    # ---- observe -------------------------------------------------------------------------------------
    def _running(self) -> list[tuple[int, RuntimeProcess]]:
        return [(o, m) for o, m in enumerate(self.group.members) if m.release and m.running()]

    async def _view(self, ordinal: int, member: RuntimeProcess) -> MemberView:
        base = self.group.admin_base(member)
        if not member.ports_file.exists() or not await self.admin.ready(base):
            return MemberView(ordinal, False)
        try:
            record, held = await asyncio.gather(
                self.admin.get_placement(base), self.admin.placement_calls("store-shards").held(base)
            )
        except AdminError:
            return MemberView(ordinal, False)
        load = {
            u.unit: UnitLoad(u.bytes, u.bytes_in_per_second, u.txn_per_second)
            for u in held.units
            if u.state == "serving"
        }
        return MemberView(ordinal, True, record.epoch, {u.unit: u.state for u in held.units}, load)

    def _member(self, ordinal: int) -> Member:
        member = self.group.member_process(ordinal)
        return Member(member.listen, f"pulsar://{member.listen}", self.group.admin_base(member))

    # ---- one reconcile -------------------------------------------------------------------------------
    async def step(self, desired: int, *, rebalance: bool = False) -> ScalingDecision:
        """Decide and act until the engine has nothing more to do now (or a step failed)."""
        placed = self.load()
        decision: ScalingDecision | None = None
        for _ in range(MAX_ROUNDS):
            running = self._running()
            views = await asyncio.gather(*(self._view(o, m) for o, m in running))
            size = len(self.group.members_started())
            addresses = {o: self._member(o) for o in range(max(desired, size))}
            decision = decide(
                ScalingInput(
                    kind="store-shards",
                    placement=placed.record,
                    state=placed.state,
                    desired_replicas=desired,
                    statefulset_replicas=size,
                    members=tuple(views),
                    rebalance_requested=rebalance,
                ),
                addresses,
            )
            if (decision.placement, decision.state) != (placed.record, placed.state):
                placed = Placed(decision.placement, decision.state)
                self.save(placed)  # write-ahead, as the operator writes its ConfigMap
            if decision.rebalance_done:
                return decision  # the caller stops asking (the operator removes the annotation)
            if not decision.actions:
                break
            for action in decision.actions:
                try:
                    await self._act(placed, action)
                except AdminError as err:
                    self.say(f"{self.group.name}: {self._what(action)} failed, retried: {err}")
                    placed = Placed(placed.record, failed(placed.state, placed.record, action, str(err)))
                    self.save(placed)
                    return decision
                placed = Placed(placed.record, completed(placed.state, action))
                self.save(placed)
        assert decision is not None
        return decision

    def _what(self, action: ScalingAction) -> str:
        match action:
            case ScaleStatefulSet(replicas=n):
                return f"resize to {n} members"
            case MoveStep(move=move) | PushPlacement(move=move) if move is not None:
                return describe_step(move, "store-shards")
        return "push the record"

    async def _act(self, placed: Placed, action: ScalingAction) -> None:
        calls = self.admin.placement_calls("store-shards")
        token = self.token
        match action:
            case ScaleStatefulSet(replicas=n, reason=reason):
                self.say(f"{self.group.name}: {reason}")
                await self.group.resize(n)
            case PushPlacement(ordinals=ordinals, move=move):
                if move is not None:
                    self.say(f"{self.group.name}: {describe_step(move, 'store-shards')}")
                for ordinal in ordinals:
                    try:
                        await self.admin.put_placement(self._base(ordinal), placed.record, token)
                    except AdminError:
                        if move is not None and move.involves(ordinal):
                            raise  # a switch needs its two pods; others catch up next round
            case MoveStep(move=move):
                self.say(f"{self.group.name}: {describe_step(move, 'store-shards')}")
                if move.phase is MovePhase.PRECOPY:
                    source = self._base(move.source)
                    await calls.precopy(self._base(move.target), move.unit, move.id, source, token)
                elif move.phase is MovePhase.FENCE:
                    await calls.fence(self._base(move.source), move.unit, move.id, token)
                elif move.phase is MovePhase.RECEIVE:
                    source = self._base(move.source)
                    await calls.receive(self._base(move.target), move.unit, move.id, source, token)
                elif move.phase is MovePhase.RELEASE:
                    await calls.release(self._base(move.source), move.unit, move.id, token)
                elif move.phase is MovePhase.ROLLBACK:
                    if move.target < len(self.group.members_started()):
                        await calls.discard(self._base(move.target), move.unit, move.id, token)
                    await calls.unfence(self._base(move.source), move.unit, move.id, token)

    def _base(self, ordinal: int) -> str:
        return self.group.admin_base(self.group.member_process(ordinal))

    def owners(self) -> dict[str, int]:
        """Shards per member, by the record."""
        record = self.load().record
        return {
            self.group.member_process(o).name: len(record.shards_of(o)) for o in sorted(set(record.owners))
        }
