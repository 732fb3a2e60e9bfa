"""The scaling engine: (record, moves in flight, desired replicas, what the pods report) -> what to
persist and the actions to take next. Pure and deterministic like the rollout engine.

Why it is split from the rollout engine: scaling moves data between pods while the rollout restarts
them; each waits on readiness the other causes, and neither needs the other's memory. The operator
(and the local fleet) calls ``decide``, writes ``ScalingDecision.state`` and ``.placement`` (the
write-ahead: every phase is recorded before its action), carries out the actions, and after each one
folds its outcome in with ``completed`` or ``failed`` and writes again. A restart therefore repeats at
most the one action in flight, and every §12 verb is idempotent for the same move id.

A move (docs/contracts.md §12): PRECOPY on the target (store shards only: the shard's closed files
are copied while the source keeps serving, so the fence waits only for what changed since), FENCE on
the source, RECEIVE on the target, SWITCH (record epoch+1 with
the target as owner, then PUT to the target, the source and every other pod), RELEASE on the source,
done. Until the record names the target a move can be rolled back (ROLLBACK: discard on the target,
unfence on the source): when its target is being removed, or when a step failed ``MAX_STEP_FAILURES``
times; a move rolled back for failing is remembered (``FailedMove``) and its unit is not moved again
until a rebalance is requested, so a scale-in that needs it is refused (condition ScaleInSafe=False).
After the switch a move only goes forward.

The StatefulSet grows before any move (new pods receive units only once Ready and holding the current
record) and shrinks only when every pod being removed owns nothing, takes part in no move and reports
that it holds no data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from txnkeeper.contract.placement import Member, Placement
from txnkeeper_operator.engine import balance
from txnkeeper_operator.engine.model import Condition, ConditionStatus
from txnkeeper_operator.engine.placement import (
    MAX_STEP_FAILURES,
    FailedMove,
    Move,
    MovePhase,
    MoveReason,
    MoveStep,
    PushPlacement,
    Rebalance,
    ScaleStatefulSet,
    ScalingAction,
    ScalingInput,
    ScalingState,
)

SCALE_IN_CONDITION = "ScaleInSafe"
REBALANCE_REQUESTED = "requested by annotation"


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    state: ScalingState  # persist before acting
    placement: Placement  # persist before acting (a new epoch when members or owners changed)
    actions: tuple[ScalingAction, ...]
    phase: str  # Balanced, ScalingOut, Draining, Rebalancing or ScaleInRefused
    message: str
    condition: Condition
    # The rebalance the annotation asked for is done: the operator removes the annotation.
    rebalance_done: bool = False
    # New moves and rollbacks this decision started (for Events).
    started: tuple[Move, ...] = ()


def _prefix(placement: Placement) -> str:
    return "s" if placement.kind == "store-shards" else "c"


def _start_rollback(move: Move, why: str, *, gave_up: bool) -> Move:
    return replace(move, phase=MovePhase.ROLLBACK, rollback_reason=("failed: " if gave_up else "") + why)


def gave_up(move: Move) -> bool:
    return move.rollback_reason.startswith("failed: ")


def _members(placement: Placement, replicas: int, addresses: Mapping[int, Member]) -> dict[int, Member]:
    wanted = {o: addresses[o] for o in range(replicas) if o in addresses}
    for owner in set(placement.owners):  # an owner is always reachable through the record
        if owner not in wanted and owner in placement.members:
            wanted[owner] = placement.members[owner]
    return wanted


def decide(inp: ScalingInput, addresses: Mapping[int, Member]) -> ScalingDecision:
    """The next step; ``addresses``: each pod ordinal's member entry (its DNS names)."""
    state = inp.state
    placement = inp.placement
    actions: list[ScalingAction] = []
    started: list[Move] = []
    desired = inp.desired_replicas
    replicas = inp.statefulset_replicas

    if inp.rebalance_requested and (state.rebalance is None or state.rebalance.reason != REBALANCE_REQUESTED):
        # A requested rebalance also retries the moves that failed for good.
        state = replace(state, rebalance=Rebalance(REBALANCE_REQUESTED), failed=())
    elif state.rebalance is None and desired != state.balanced_for:
        state = replace(state, rebalance=Rebalance(f"spec.replicas {state.balanced_for} -> {desired}"))

    # 1. grow first: new pods start, and receive units only once Ready.
    if desired > replicas:
        actions.append(ScaleStatefulSet(desired, f"scale out from {replicas} to {desired} pods"))
        replicas = desired
    members = _members(placement, replicas, addresses)
    if members != dict(placement.members):
        placement = replace(placement, epoch=placement.epoch + 1, members=members)

    # 2. moves in flight
    moves: list[Move] = []
    pushed: set[int] = set()
    for held in state.moves:
        move = held
        leaving = move.target >= desired or move.target >= replicas
        switched = placement.owner_of(move.unit) == move.target
        undecided = move.phase in (MovePhase.PRECOPY, MovePhase.FENCE, MovePhase.RECEIVE) or (
            move.phase is MovePhase.SWITCH and not switched
        )
        if undecided and leaving:
            move = _start_rollback(move, f"target pod {move.target} is being removed", gave_up=False)
            started.append(move)
        moves.append(move)
        action = _step(inp, move, replicas)
        if action is None:
            continue
        if move.phase is MovePhase.SWITCH:
            if not switched:
                placement = placement.with_owner(move.unit, move.target)
            others = [o for o in range(replicas) if o not in (move.target, move.source) and inp.ready(o)]
            action = PushPlacement((move.target, move.source, *others), move)
            pushed.update(action.ordinals)
        actions.append(action)
    state = replace(state, moves=tuple(moves))

    # 3. copies older than the record (a pod that was down, a new pod, new members)
    stale = tuple(
        m.ordinal
        for m in sorted(inp.members, key=lambda m: m.ordinal)
        if inp.ready(m.ordinal)
        and m.epoch is not None
        and m.epoch < placement.epoch
        and m.ordinal not in pushed
    )
    if stale:
        actions.append(PushPlacement(stale))

    # 4. new moves
    state, new = _start_moves(inp, state, placement, replicas)
    started.extend(new)
    actions.extend(MoveStep(m) for m in new)

    # 5. shrink once the pods being removed hold nothing
    refused = _refusal(inp, state, placement, replicas)
    blockers = _shrink_blockers(inp, state, placement, replicas)
    if replicas > desired and not blockers and refused is None:
        actions.append(
            ScaleStatefulSet(desired, f"scale in from {replicas} to {desired} pods: they hold nothing")
        )
        replicas = desired

    done = False
    # Done only when nothing could start because there is nothing to do, not because a pod that stays
    # is not Ready yet or has not taken the current record.
    current = all(
        inp.ready(o)
        and (v := inp.member(o)) is not None
        and v.epoch == placement.epoch
        and v.held is not None
        for o in range(desired)
    )
    idle = not state.moves and not new and replicas == desired and current and refused is None
    if state.rebalance is not None and idle:
        done = state.rebalance.reason == REBALANCE_REQUESTED
        state = replace(state, rebalance=None, balanced_for=desired)

    phase, message = _phase(inp, state, replicas, refused, blockers)
    return ScalingDecision(
        state=state,
        placement=placement,
        actions=tuple(actions),
        phase=phase,
        message=message,
        condition=_condition(inp, replicas, refused, blockers),
        rebalance_done=done,
        started=tuple(started),
    )


def _step(inp: ScalingInput, move: Move, replicas: int) -> MoveStep | PushPlacement | None:
    """The action ``move``'s phase needs now, or None while a pod it needs is not Ready."""
    source_ready = inp.ready(move.source)
    target_ready = inp.ready(move.target)
    match move.phase:
        case MovePhase.FENCE | MovePhase.RELEASE:
            ok = source_ready
        case MovePhase.PRECOPY | MovePhase.RECEIVE | MovePhase.SWITCH:
            ok = source_ready and target_ready
        case MovePhase.ROLLBACK:
            # A target whose pod no longer exists cannot be asked; its PVC is released with it.
            ok = source_ready and (target_ready or move.target >= replicas)
    return MoveStep(move) if ok else None


def _start_moves(
    inp: ScalingInput, state: ScalingState, placement: Placement, replicas: int
) -> tuple[ScalingState, list[Move]]:
    slots = inp.max_concurrent_moves - len(state.moves)
    owners = list(placement.owners)
    for move in state.moves:
        owners[move.unit] = move.target
    busy = {m.unit for m in state.moves} | {f.unit for f in state.failed}
    staying = list(range(min(inp.desired_replicas, replicas)))
    ready = frozenset(
        m.ordinal
        for m in inp.members
        if inp.ready(m.ordinal) and m.epoch is not None and m.epoch >= placement.epoch
    )
    load = {u: v for m in inp.members if m.ordinal in staying for u, v in m.load.items()}
    board = balance.Field(
        owners=owners,
        movable=frozenset(range(placement.shards)) - busy,
        staying=staying,
        ready=ready,
        draining=frozenset(range(inp.desired_replicas, replicas)),
        load=load,
        load_known=all((v := inp.member(o)) is not None and v.held is not None for o in staying),
        rebalancing=state.rebalance is not None,
        moved=state.rebalance.moved if state.rebalance is not None else frozenset(),
        by_load=state.rebalance is not None and state.rebalance.by_load,
    )
    picks = balance.choose(board, slots)
    new: list[Move] = []
    next_move = state.next_move
    # Coordinator ids have no pre-copy: their log is small and wholly rewritten by its snapshot.
    first = MovePhase.PRECOPY if placement.kind == "store-shards" else MovePhase.FENCE
    for pick in picks:
        move_id = f"{_prefix(placement)}{pick.unit}-m{next_move}"
        next_move += 1
        new.append(Move(move_id, pick.unit, pick.source, pick.target, first, pick.reason))
    rebalance = state.rebalance
    if rebalance is not None and new:
        rebalance = replace(
            rebalance,
            moved=rebalance.moved | {m.unit for m in new},
            by_load=rebalance.by_load or any(m.reason is MoveReason.LOAD for m in new),
        )
    return replace(state, moves=(*state.moves, *new), next_move=next_move, rebalance=rebalance), new


def _refusal(inp: ScalingInput, state: ScalingState, placement: Placement, replicas: int) -> str | None:
    """Why shrinking to spec.replicas would lose data, and what to do (None: it would not)."""
    unit = "shard" if placement.kind == "store-shards" else "coordinator id"
    stuck = [f for f in state.failed if placement.owner_of(f.unit) >= inp.desired_replicas]
    if replicas <= inp.desired_replicas or not stuck:
        return None
    first = stuck[0]
    return (
        f"pod {first.source} still holds {unit} {first.unit}, whose move to pod {first.target} failed "
        f"({first.error}); removing the pod would lose it"
        + (f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else "")
        + ": fix the cause (the pods' logs and the ShardMoveFailed Events say what failed), then annotate "
        "txnkeeper.io/rebalance=now to retry, or set spec.replicas back to "
        f"{replicas}"
    )


def _shrink_blockers(
    inp: ScalingInput, state: ScalingState, placement: Placement, replicas: int
) -> list[str]:
    blockers = []
    for ordinal in range(inp.desired_replicas, replicas):
        owned = placement.shards_of(ordinal)
        view = inp.member(ordinal)
        if owned:
            blockers.append(f"pod {ordinal} owns {len(owned)}")
        elif any(m.involves(ordinal) for m in state.moves):
            blockers.append(f"pod {ordinal} takes part in a move")
        elif view is None or not view.ready or view.held is None:
            blockers.append(f"pod {ordinal} is not Ready (cannot confirm it holds nothing)")
        elif view.held:
            blockers.append(f"pod {ordinal} still holds data of {sorted(view.held)}")
    return blockers


def _phase(
    inp: ScalingInput, state: ScalingState, replicas: int, refused: str | None, blockers: list[str]
) -> tuple[str, str]:
    desired = inp.desired_replicas
    if refused is not None:
        return "ScaleInRefused", refused
    if replicas > desired:
        return "Draining", f"scaling in to {desired}: " + "; ".join(blockers)
    not_ready = [o for o in range(desired) if not inp.ready(o)]
    if state.rebalance is not None and not_ready:
        return "ScalingOut", f"waiting for pods {not_ready} to become Ready before giving them work"
    if state.moves or state.rebalance is not None:
        why = state.rebalance.reason if state.rebalance is not None else "moves in flight"
        return "Rebalancing", f"{len(state.moves)} move(s) in flight ({why})"
    if state.failed:
        return "Balanced", f"balanced, except {len(state.failed)} unit(s) whose move failed"
    return "Balanced", f"balanced over {desired} pod(s)"


def _condition(inp: ScalingInput, replicas: int, refused: str | None, blockers: list[str]) -> Condition:
    if refused is not None:
        return Condition(SCALE_IN_CONDITION, ConditionStatus.FALSE, "WouldLoseData", refused)
    if replicas > inp.desired_replicas:
        return Condition(SCALE_IN_CONDITION, ConditionStatus.TRUE, "Draining", "; ".join(blockers))
    return Condition(SCALE_IN_CONDITION, ConditionStatus.TRUE, "NothingToRemove", "no pod is being removed")


# ---- outcomes, folded in after each action ----------------------------------------------------------


def _replace_move(state: ScalingState, move_id: str, new: Move | None) -> ScalingState:
    moves = tuple(m for m in state.moves if m.id != move_id)
    if new is None:
        return replace(state, moves=moves)
    return replace(state, moves=tuple(new if m.id == move_id else m for m in state.moves))


def completed(state: ScalingState, action: ScalingAction) -> ScalingState:
    """``action`` succeeded: its move goes to the next phase (or is done)."""
    move = action.move if isinstance(action, MoveStep | PushPlacement) else None
    if move is None:
        return state
    current = next((m for m in state.moves if m.id == move.id), None)
    if current is None:
        return state
    if isinstance(action, PushPlacement):
        return _replace_move(state, move.id, replace(current, phase=MovePhase.RELEASE, failures=0, error=""))
    match current.phase:
        case MovePhase.PRECOPY:
            return _replace_move(
                state, move.id, replace(current, phase=MovePhase.FENCE, failures=0, error="")
            )
        case MovePhase.FENCE:
            return _replace_move(
                state, move.id, replace(current, phase=MovePhase.RECEIVE, failures=0, error="")
            )
        case MovePhase.RECEIVE:
            return _replace_move(
                state, move.id, replace(current, phase=MovePhase.SWITCH, failures=0, error="")
            )
        case MovePhase.RELEASE:
            return _replace_move(state, move.id, None)
        case MovePhase.ROLLBACK:
            state = _replace_move(state, move.id, None)
            if gave_up(current):
                record = FailedMove(current.id, current.unit, current.source, current.target, current.error)
                state = replace(state, failed=(*state.failed, record))
            return state
    return state


def failed(state: ScalingState, placement: Placement, action: ScalingAction, error: str) -> ScalingState:
    """``action`` failed with ``error``: counted; a move that can still be rolled back is after
    ``MAX_STEP_FAILURES`` failures of one step."""
    move = action.move if isinstance(action, MoveStep | PushPlacement) else None
    current = next((m for m in state.moves if move is not None and m.id == move.id), None)
    if current is None:
        return state
    count = current.failures + 1
    updated = replace(current, failures=count, error=error[:300])
    switched = placement.owner_of(current.unit) == current.target
    can_roll_back = current.phase in (MovePhase.PRECOPY, MovePhase.FENCE, MovePhase.RECEIVE) or (
        current.phase is MovePhase.SWITCH and not switched
    )
    if can_roll_back and count >= MAX_STEP_FAILURES:
        updated = _start_rollback(
            updated, f"{current.phase} failed {count} times: {error[:200]}", gave_up=True
        )
    return _replace_move(state, current.id, updated)
