"""Scaling, the operator's I/O half: the placement ConfigMap, what the pods report, the §12 verbs.

Why apart from reconcile.py: the rollout and scaling are two engines with two memories (the status for
a downgrade, the ConfigMap ``<resource>-placement`` for placement); this module joins the pure scaling
engine (engine/moves.py) to the world. Order, for restarts: the engine's decision (new moves, a switched
record) is written to the ConfigMap before any of its actions run, and each action's outcome is folded
in and written right after it, so an operator killed anywhere repeats at most one idempotent verb.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txnkeeper.contract.admin import AdminError
from txnkeeper.contract.placement import (
    DEFAULT_PRECOPY_MIB_PER_S,
    SHARDS_PER_REPLICA,
    Member,
    Placement,
    PlacementError,
    PlacementKind,
)
from txnkeeper_operator import builders, naming, podtls
from txnkeeper_operator.context import Context
from txnkeeper_operator.engine.model import Condition, ConditionStatus
from txnkeeper_operator.engine.moves import (
    SCALE_IN_CONDITION,
    ScalingDecision,
    completed,
    decide,
    failed,
    gave_up,
)
from txnkeeper_operator.engine.placement import (
    MemberView,
    Move,
    MovePhase,
    MoveStep,
    PushPlacement,
    ScaleStatefulSet,
    ScalingAction,
    ScalingInput,
    ScalingState,
    ScalingStateError,
    UnitLoad,
    describe_move,
    describe_step,
)
from txnkeeper_operator.observe import pod_ready
from txnkeeper_operator.resource import Resource

Obj = Mapping[str, Any]
# Decide-act rounds per reconcile: a move whose pods answer at once finishes in one reconcile.
MAX_ROUNDS = 6


class ScalingUnusable(Exception):
    """The placement ConfigMap cannot be used (damaged, or a first record that cannot exist)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """The ConfigMap's contents."""

    record: Placement
    state: ScalingState


async def load(ctx: Context, cr: Resource, statefulset: Obj | None, *, create: bool = True) -> Placed:
    """The ConfigMap, created with the first record when absent (unless ``create`` is false: paused).
    For a new resource that is ``Placement.initial`` at spec.replicas; for a StatefulSet that exists
    (a resource from before placement, or a ConfigMap deleted by hand) the counts its pods were
    started with (``--replicas``/``--shards``, else its size), so every topic and coordinator id stays
    where those pods put it; pods holding a newer record are followed later (``_adopt_newer``)."""
    name = naming.placement_config_map(cr.name)
    found = await ctx.kube.get("ConfigMap", cr.namespace, name)
    if not create and found is None:
        raise ScalingUnusable(f"no ConfigMap {name} yet (reconciliation is paused)")
    if found is None or not (found.get("data") or {}).get(naming.PLACEMENT_KEY):
        flag_replicas, flag_units = builders.started_with(statefulset)
        running = int(statefulset["spec"].get("replicas") or 0) if statefulset else 0
        replicas = flag_replicas or running or cr.replicas
        units = flag_units or (
            builders.initial_units(cr) if statefulset is None else _existing_units(cr, replicas)
        )
        try:
            # Exactly the pods' own epoch 1 (they derive it from their flags and refuse another record
            # of the same epoch): the members, their DNS names, come with epoch 2 at the first decision.
            record = Placement.initial(_kind(cr), replicas, units)
        except PlacementError as err:
            raise ScalingUnusable(f"cannot write the first placement record: {err}") from err
        state = ScalingState(initial_replicas=replicas, balanced_for=replicas)
        await ctx.kube.create_if_absent(builders.placement_config_map(cr, record, state.dumps()))
        found = await ctx.kube.get("ConfigMap", cr.namespace, name)
    data = (found or {}).get("data") or {}
    where = f"ConfigMap {cr.namespace}/{name}"
    try:
        record = Placement.loads(data.get(naming.PLACEMENT_KEY, ""), f"{where} key {naming.PLACEMENT_KEY}")
        state = ScalingState.loads(data.get(naming.MOVES_KEY, ""), f"{where} key {naming.MOVES_KEY}")
    except (PlacementError, ScalingStateError) as err:
        raise ScalingUnusable(
            f"{err}; the operator changes no placement until it is repaired (the pods keep their own copies "
            "of the record: GET /admin/v1/placement on any pod shows the newest)"
        ) from err
    return Placed(record, state)


def _existing_units(cr: Resource, replicas: int) -> int:
    """A resource that ran before placement existed: its pods placed by ``mod replicas``."""
    if cr.kind is naming.TRANSACTION_COORDINATOR:
        return cr.coordinators
    return int(cr.spec.get("shards") or SHARDS_PER_REPLICA * replicas)


async def _save(ctx: Context, cr: Resource, placed: Placed) -> None:
    await ctx.kube.apply(builders.placement_config_map(cr, placed.record, placed.state.dumps()))


def _kind(cr: Resource) -> PlacementKind:
    return "coordinator-ids" if cr.kind is naming.TRANSACTION_COORDINATOR else "store-shards"


def pod_admin_base(pod: Obj) -> str | None:
    """A pod's admin API by its IP (None: no IP yet), https:// when it serves TLS."""
    return podtls.pod_base(pod)


async def _view(
    ctx: Context, cr: Resource, pod: Obj, base_of: Callable[[Obj], str | None]
) -> tuple[MemberView, Placement | None]:
    """What one pod reports, and the record it holds."""
    ordinal = naming.pod_ordinal(str(pod["metadata"]["name"]))
    base = base_of(pod)
    if not pod_ready(pod) or base is None:
        return MemberView(ordinal, False), None
    try:
        record, held = await asyncio.gather(
            ctx.admin.get_placement(base), ctx.admin.placement_calls(_kind(cr)).held(base)
        )
    except AdminError:
        # A pod that cannot say what it holds is not worked with (and never removed past).
        return MemberView(ordinal, False), None
    load = {
        u.unit: UnitLoad(u.bytes, u.bytes_in_per_second, u.txn_per_second)
        for u in held.units
        if u.state == "serving"
    }
    return MemberView(ordinal, True, record.epoch, {u.unit: u.state for u in held.units}, load), record


async def _adopt_newer(run: ScalingRun, placed: Placed, records: list[Placement | None]) -> Placed:
    """A pod holding a newer epoch than the ConfigMap means the ConfigMap was lost or replaced (the
    operator writes it before any pod sees an epoch): take the newest copy rather than push an older
    record the pods would refuse, and say so. A pod holding another record of the ConfigMap's own
    epoch is a conflict nobody can settle by epochs: ScalingUnusable."""
    for record in records:
        if (
            record is not None
            and record.epoch == placed.record.epoch
            and record.owners != placed.record.owners
        ):
            # Two different records of one epoch: the pods were started with other --replicas/--shards
            # than the ConfigMap's first record, or the ConfigMap was replaced. Pushing either would
            # hand shards to pods that hold none of their data.
            raise ScalingUnusable(
                f"a pod holds placement epoch {record.epoch} with owners {list(record.owners)[:16]}, but "
                f"ConfigMap {naming.placement_config_map(run.cr.name)} has that epoch with owners "
                f"{list(placed.record.owners)[:16]}: the operator changes no placement until they agree "
                "(restore the ConfigMap, or delete it so it is written again from the pods' flags)"
            )
    newest = max((r for r in records if r is not None), key=lambda r: r.epoch, default=None)
    if newest is None or not newest.supersedes(placed.record):
        return placed
    run.emit(
        "Warning",
        "PlacementAdopted",
        f"a pod holds placement epoch {newest.epoch}, newer than ConfigMap "
        f"{naming.placement_config_map(run.cr.name)} (epoch {placed.record.epoch}): the pods' record is "
        "taken (moves that were in flight are not known any more; their pods keep their markers)",
    )
    adopted = Placed(newest, placed.state)
    await _save(run.ctx, run.cr, adopted)
    return adopted


def rebalance_requested(cr: Resource) -> bool:
    return str(cr.annotations.get(naming.REBALANCE_ANNOTATION, "")).lower() == "now"


def max_concurrent_moves(cr: Resource) -> int:
    return int(cr.section("scaling").get("maxConcurrentMoves", 1))


def precopy_bytes_per_second(cr: Resource) -> int | None:
    """spec.scaling.precopyMiBPerSecond in bytes (None: unbounded, 0 in the spec); the CRD's default
    where the spec says nothing (a resource stored before the default existed)."""
    rate = cr.section("scaling").get("precopyMiBPerSecond", DEFAULT_PRECOPY_MIB_PER_S)
    return int(rate) << 20 if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0 else None


@dataclass
class ScalingRun:
    """One reconcile's scaling: the context, the resource, its pods and how to resize."""

    ctx: Context
    cr: Resource
    body: Obj
    pods: Sequence[Obj]
    resize: Callable[[int, int, int], Awaitable[None]]  # (replicas, initial replicas, units)
    token: str
    # Where a pod's admin API is, and the record's member entry of an ordinal (tests of real local
    # processes give their ports; in Kubernetes: the pod IP, the DNS names).
    base_of: Callable[[Obj], str | None] = pod_admin_base
    member_of: Callable[[Resource, int], Member] = builders.member

    def _base(self, ordinal: int) -> str:
        for pod in self.pods:
            if naming.pod_ordinal(str(pod["metadata"]["name"])) == ordinal and (base := self.base_of(pod)):
                return base
        raise AdminError(f"{self.cr.name}-{ordinal} has no pod IP")

    def _scheme(self, ordinal: int, url: str) -> str:
        """The record's admin URL of a pod with the scheme the pod serves now (records written before
        a switch of spec.tls keep the old scheme; the pod's DNS name is what its certificate is for)."""
        pod = next((p for p in self.pods if naming.pod_ordinal(str(p["metadata"]["name"])) == ordinal), None)
        if pod is None:
            return url
        scheme, sep, rest = url.partition("://")
        wanted = "https" if podtls.pod_serves_tls(pod) else "http"
        return f"{wanted}://{rest}" if sep and scheme in ("http", "https") else url

    def emit(self, type_: str, reason: str, message: str) -> None:
        self.ctx.events.emit(self.body, type_, reason, message)

    async def act(self, placed: Placed, action: ScalingAction) -> None:
        calls = self.ctx.admin.placement_calls(_kind(self.cr))
        token = self.token
        match action:
            case ScaleStatefulSet(replicas=n, reason=reason):
                await self.resize(n, placed.state.initial_replicas, placed.record.shards)
                self.emit("Normal", "Scaled", reason)
            case PushPlacement(ordinals=ordinals, move=move):
                for ordinal in ordinals:
                    try:
                        await self.ctx.admin.put_placement(self._base(ordinal), placed.record, token)
                    except AdminError:
                        if move is not None and move.involves(ordinal):
                            raise
                        # Another pod's copy stays older: it is pushed again once it answers.
            case MoveStep(move=move):
                await self._step(calls, placed, move)

    async def _step(self, calls: Any, placed: Placed, move: Move) -> None:
        token = self.token
        match move.phase:
            case MovePhase.PRECOPY:
                source = placed.record.member(move.source)
                if source is None or not source.admin_url:
                    raise AdminError(f"the record names no admin URL for pod {move.source}")
                await calls.precopy(
                    self._base(move.target),
                    move.unit,
                    move.id,
                    self._scheme(move.source, source.admin_url),
                    token,
                    max_bytes_per_second=precopy_bytes_per_second(self.cr),
                )
            case MovePhase.FENCE:
                await calls.fence(self._base(move.source), move.unit, move.id, token)
            case MovePhase.RECEIVE:
                source = placed.record.member(move.source)
                if source is None or not source.admin_url:
                    raise AdminError(f"the record names no admin URL for pod {move.source}")
                source_url = self._scheme(move.source, source.admin_url)
                await calls.receive(self._base(move.target), move.unit, move.id, source_url, token)
            case MovePhase.RELEASE:
                await calls.release(self._base(move.source), move.unit, move.id, token)
            case MovePhase.ROLLBACK:
                if any(naming.pod_ordinal(str(p["metadata"]["name"])) == move.target for p in self.pods):
                    await calls.discard(self._base(move.target), move.unit, move.id, token)
                await calls.unfence(self._base(move.source), move.unit, move.id, token)
            case MovePhase.SWITCH:
                raise AssertionError("a switch is carried out as a PushPlacement")


def _report_outcome(run: ScalingRun, before: ScalingState, after: ScalingState, kind: PlacementKind) -> None:
    """Events for moves that finished, rolled back or failed for good with this action."""
    remaining = {m.id for m in after.moves}
    for move in before.moves:
        if move.id in remaining:
            continue
        if move.phase is MovePhase.RELEASE:
            run.emit("Normal", "ShardMoved", f"moved {describe_move(move, kind)}")
        elif move.phase is MovePhase.ROLLBACK and gave_up(move):
            run.emit("Warning", "ShardMoveFailed", describe_step(move, kind))
        elif move.phase is MovePhase.ROLLBACK:
            run.emit("Normal", "ShardMoveRolledBack", describe_step(move, kind))


async def step(
    run: ScalingRun, placed: Placed, desired: int, statefulset_replicas: int
) -> tuple[Placed, ScalingDecision, int]:
    """Decide and act, a few rounds; returns what is persisted, the last decision and the StatefulSet's
    replicas after the actions."""
    kind = _kind(run.cr)
    addresses = {o: run.member_of(run.cr, o) for o in range(max(desired, statefulset_replicas))}
    decision: ScalingDecision | None = None
    for _ in range(MAX_ROUNDS):
        seen = await asyncio.gather(*(_view(run.ctx, run.cr, p, run.base_of) for p in run.pods))
        views = [view for view, _ in seen]
        placed = await _adopt_newer(run, placed, [record for _, record in seen])
        inp = ScalingInput(
            kind=kind,
            placement=placed.record,
            state=placed.state,
            desired_replicas=desired,
            statefulset_replicas=statefulset_replicas,
            members=tuple(views),
            max_concurrent_moves=max_concurrent_moves(run.cr),
            rebalance_requested=rebalance_requested(run.cr),
        )
        decision = decide(inp, addresses)
        if (decision.placement, decision.state) != (placed.record, placed.state):
            placed = Placed(decision.placement, decision.state)
            await _save(run.ctx, run.cr, placed)  # write-ahead: before any action it enables
        for move in decision.started:
            reason = "ShardMoveRollingBack" if move.phase is MovePhase.ROLLBACK else "ShardMoveStarted"
            run.emit("Normal", reason, describe_step(move, kind))
        if decision.rebalance_done:
            await run.ctx.kube.patch_resource(
                run.cr.kind.plural, run.cr.namespace, run.cr.name,
                {"metadata": {"annotations": {naming.REBALANCE_ANNOTATION: None}}},
            )  # fmt: skip
            run.emit("Normal", "Rebalanced", "the requested rebalance is done")
        if not decision.actions:
            break
        broke = False
        for action in decision.actions:
            before = placed.state
            try:
                await run.act(placed, action)
            except AdminError as err:
                state = failed(placed.state, placed.record, action, str(err))
                target = action.move if isinstance(action, MoveStep | PushPlacement) else None
                what = describe_step(target, kind) if target is not None else str(action)
                run.emit("Warning", "ShardMoveStepFailed", f"{what}: {err}")
                broke = True
            else:
                state = completed(placed.state, action)
                if isinstance(action, ScaleStatefulSet):
                    statefulset_replicas = action.replicas
            if state != placed.state:
                placed = Placed(placed.record, state)
                await _save(run.ctx, run.cr, placed)
            _report_outcome(run, before, placed.state, kind)
            if broke:
                break
        if broke:
            break
    assert decision is not None
    return placed, decision, statefulset_replicas


def status(
    cr: Resource, placed: Placed | None, decision: ScalingDecision | None, problem: str | None
) -> dict[str, Any] | None:
    """status.placement: the record per pod, the moves in flight, failed moves, the phase."""
    if placed is None:
        return {"phase": "Unusable", "message": problem} if problem else None
    record, state = placed.record, placed.state
    owners = sorted(set(record.owners) | set(record.members))
    out: dict[str, Any] = {
        "kind": record.kind,
        "epoch": record.epoch,
        "shards": record.shards,
        "phase": decision.phase if decision is not None else ("Unusable" if problem else "Paused"),
        "message": decision.message if decision is not None else (problem or "reconciliation is paused"),
        "rebalance": state.rebalance.reason if state.rebalance is not None else None,
        "pods": [
            {"pod": f"{cr.name}-{o}", "owned": list(record.shards_of(o)), "count": len(record.shards_of(o))}
            for o in owners
        ],
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
            }
            for m in state.moves
        ],
        "failedMoves": [
            {"id": f.id, "unit": f.unit, "source": f.source, "target": f.target, "error": f.error}
            for f in state.failed
        ],
    }
    return out


def condition(decision: ScalingDecision | None, why_not: str) -> Condition:
    """ScaleInSafe: the decision's, or Unknown saying why there was none (paused, being created, an
    unusable ConfigMap), so the condition is always there."""
    if decision is not None:
        return decision.condition
    return Condition(SCALE_IN_CONDITION, ConditionStatus.UNKNOWN, "NotEvaluated", why_not)
