"""A simulated StatefulSet of pods that hold shards, for driving the pure scaling engine in scenarios.

The pods implement the §12 move verbs with their rules (fence only by the owner its record names,
receive only from a source fenced for that move, release only once the record names another owner,
discard refused to the owner, unfence refused to a non-owner, PUT only of a newer epoch), and every
tick the owner of each shard accepts a write there while it serves it. The invariants are checked after
every step: at most one pod serves a shard, every acknowledged write is on the pod that serves it (or,
while fenced, on the fenced owner), and a pod the StatefulSet removes holds nothing. The operator keeps
nothing in memory: its whole state is the simulated ConfigMap, so stopping a reconcile midway is an
operator crash, and the next reconcile is the restarted operator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from txnkeeper.contract.placement import Member, Placement, PlacementKind
from txnkeeper_operator.engine.moves import completed, decide, failed
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
    UnitLoad,
)

CrashMode = Literal["before", "between", "after"]


class InvariantViolation(AssertionError):
    """Data lost, served twice, or stranded on a removed pod."""


class PodError(Exception):
    """A verb the pod refused or could not answer."""


@dataclass
class SimPod:
    ordinal: int
    record: Placement
    data: dict[int, list[int]] = field(default_factory=dict)
    markers: dict[int, tuple[str, str]] = field(default_factory=dict)  # unit -> (move, state)
    staged: dict[int, str] = field(default_factory=dict)  # unit -> move whose closed files it pre-copied
    down: int = 0  # ticks until it is Ready again
    fail: dict[str, int] = field(default_factory=dict)  # verb -> how many more calls fail

    @property
    def ready(self) -> bool:
        return self.down == 0

    def serves(self, unit: int) -> bool:
        fenced = self.markers.get(unit, ("", ""))[1] == "fenced"
        return self.ready and self.record.owner_of(unit) == self.ordinal and not fenced

    def _refuse_if_failing(self, verb: str) -> None:
        if self.fail.get(verb, 0) > 0:
            self.fail[verb] -= 1
            raise PodError(f"pod {self.ordinal}: {verb} failed (injected)")

    def fence(self, unit: int, move: str) -> None:
        self._refuse_if_failing("fence")
        if self.record.owner_of(unit) != self.ordinal:
            raise PodError(f"409 pod {self.ordinal} does not own {unit}")
        held = self.markers.get(unit)
        if held is not None and held[0] != move:
            raise PodError(f"409 {unit} is {held[1]} for {held[0]}")
        self.markers[unit] = (move, "fenced")

    def precopy(self, unit: int, move: str, source: SimPod) -> None:
        """Closed files only, from a source that keeps serving: staged, never served."""
        self._refuse_if_failing("precopy")
        if self.record.owner_of(unit) == self.ordinal:
            raise PodError(f"409 pod {self.ordinal} already owns {unit}")
        if source.record.owner_of(unit) != source.ordinal or not source.ready:
            raise PodError(f"409 source {source.ordinal} does not own {unit}")
        held = self.markers.get(unit)
        if held is not None and held[0] != move:
            raise PodError(f"409 {unit} is {held[1]} here for {held[0]}")
        self.staged[unit] = move

    def receive(self, unit: int, move: str, source: SimPod) -> None:
        self._refuse_if_failing("receive")
        if source.markers.get(unit) != (move, "fenced") or not source.ready:
            raise PodError(f"409 source {source.ordinal} is not fenced for {move}")
        held = self.markers.get(unit)
        if held is not None and held[0] != move:
            raise PodError(f"409 {unit} is {held[1]} here for {held[0]}")
        self.data[unit] = list(source.data.get(unit, []))
        self.markers[unit] = (move, "received")
        self.staged.pop(unit, None)

    def put(self, record: Placement) -> None:
        self._refuse_if_failing("put")
        if record.epoch == self.record.epoch and record == self.record:
            return
        if record.epoch <= self.record.epoch:
            raise PodError(f"409 epoch {record.epoch} is not newer than {self.record.epoch}")
        self.record = record
        for unit, (_move, state) in list(self.markers.items()):
            if state == "received" and record.owner_of(unit) == self.ordinal:
                del self.markers[unit]  # it owns what it received: it serves it now

    def release(self, unit: int, move: str) -> None:
        self._refuse_if_failing("release")
        if self.record.owner_of(unit) == self.ordinal:
            raise PodError(f"409 pod {self.ordinal} still owns {unit}")
        self.data.pop(unit, None)
        if self.markers.get(unit, ("", ""))[0] == move:
            del self.markers[unit]

    def discard(self, unit: int, move: str) -> None:
        self._refuse_if_failing("discard")
        if self.record.owner_of(unit) == self.ordinal:
            raise PodError(f"409 pod {self.ordinal} owns {unit}")
        if self.staged.get(unit) == move:
            del self.staged[unit]
        if self.markers.get(unit, ("", ""))[0] == move:
            del self.markers[unit]
            self.data.pop(unit, None)

    def unfence(self, unit: int, move: str) -> None:
        self._refuse_if_failing("unfence")
        if self.record.owner_of(unit) != self.ordinal:
            raise PodError(f"409 pod {self.ordinal} no longer owns {unit}")
        if self.markers.get(unit, ("", ""))[0] == move:
            del self.markers[unit]

    def held(self) -> dict[int, str]:
        return {u: self.markers.get(u, ("", "serving"))[1] for u in self.data}


def member(ordinal: int) -> Member:
    host = f"pas-{ordinal}.pas.ns.svc"
    return Member(f"{host}:6650", f"pulsar://{host}:6650", f"http://{host}:8080")


@dataclass
class SimScaling:
    kind: PlacementKind
    replicas: int  # the StatefulSet's
    desired: int
    units: int
    max_moves: int = 1
    pods: dict[int, SimPod] = field(default_factory=dict)
    record: Placement | None = None  # the ConfigMap's placement.json
    state: ScalingState | None = None  # the ConfigMap's moves.json
    writes: dict[int, int] = field(default_factory=dict)
    load: dict[int, UnitLoad] = field(default_factory=dict)
    annotation: bool = False
    history: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)  # the last decision's phase and condition
    # Called before and after each action is carried out (fault injection: pod kills mid-verb).
    before: Callable[[ScalingAction], None] | None = None
    after: Callable[[ScalingAction], None] | None = None
    start_ready_after: int = 1

    @classmethod
    def create(cls, kind: PlacementKind, replicas: int, units: int, max_moves: int) -> SimScaling:
        sim = cls(kind, replicas, replicas, units, max_moves)
        record = Placement.initial(kind, replicas, units)  # the pods' own epoch 1: no members yet
        sim.record = record
        sim.state = ScalingState(initial_replicas=replicas, balanced_for=replicas)
        for o in range(replicas):
            pod = SimPod(o, Placement.initial(kind, replicas, units))
            pod.data = {u: [] for u in record.shards_of(o)}
            sim.pods[o] = pod
        sim.writes = dict.fromkeys(range(units), 0)
        return sim

    # ---- the world ---------------------------------------------------------------------------------
    def _new_pod(self, ordinal: int) -> SimPod:
        assert self.state is not None
        pod = SimPod(ordinal, Placement.initial(self.kind, self.state.initial_replicas, self.units))
        pod.down = self.start_ready_after
        return pod

    def tick(self) -> None:
        for pod in self.pods.values():
            if pod.down > 0:
                pod.down -= 1
        for unit in range(self.units):
            servers = [p for p in self.pods.values() if p.serves(unit)]
            if len(servers) > 1:
                raise InvariantViolation(f"unit {unit} served by pods {[p.ordinal for p in servers]}")
            if servers:
                self.writes[unit] += 1
                servers[0].data.setdefault(unit, []).append(self.writes[unit])
        self.check()

    def check(self) -> None:
        for unit in range(self.units):
            complete = [
                p.ordinal for p in self.pods.values() if len(p.data.get(unit, [])) == self.writes[unit]
            ]
            if not complete:
                raise InvariantViolation(f"unit {unit}: no pod holds all {self.writes[unit]} writes")
            servers = [p for p in self.pods.values() if p.serves(unit)]
            for server in servers:
                if len(server.data.get(unit, [])) != self.writes[unit]:
                    raise InvariantViolation(f"unit {unit}: pod {server.ordinal} serves an incomplete copy")

    def kill(self, ordinal: int, ticks: int = 2) -> None:
        self.pods[ordinal].down = max(ticks, 1)

    # ---- the operator ------------------------------------------------------------------------------
    def observe(self) -> ScalingInput:
        assert self.record is not None and self.state is not None
        views = []
        for o, pod in sorted(self.pods.items()):
            if not pod.ready:
                views.append(MemberView(o, False))
                continue
            load = {u: self.load[u] for u in pod.data if u in self.load and pod.serves(u)}
            views.append(MemberView(o, True, pod.record.epoch, pod.held(), load))
        return ScalingInput(
            kind=self.kind,
            placement=self.record,
            state=self.state,
            desired_replicas=self.desired,
            statefulset_replicas=self.replicas,
            members=tuple(views),
            max_concurrent_moves=self.max_moves,
            rebalance_requested=self.annotation,
        )

    def reconcile(self, crash: CrashMode | None = None) -> int:
        """One operator pass; ``crash``: where the operator dies in it. Returns the actions taken."""
        inp = self.observe()
        decision = decide(inp, {o: member(o) for o in range(max(self.replicas, self.desired))})
        cond = decision.condition
        self.phases = [decision.phase, f"{cond.type}={cond.status} {cond.reason}"]
        if cond.status != "True":
            self.phases.append(cond.message)
        if crash == "before":
            return 0
        self.record, self.state = decision.placement, decision.state
        if decision.rebalance_done:
            self.annotation = False
        if crash == "between":
            return 0
        taken = 0
        for action in decision.actions:
            taken += 1
            try:
                self._act(action)
            except PodError as err:
                self.history.append(f"  failed: {err}")
                self.state = failed(self.state, self.record, action, str(err))
            else:
                self.state = completed(self.state, action)
            if crash == "after":
                return taken
        return taken

    def _act(self, action: ScalingAction) -> None:
        assert self.record is not None
        self.history.append(describe(action, self.record))
        if self.before is not None:
            self.before(action)
        self._apply(action)
        if self.after is not None:
            self.after(action)

    def _apply(self, action: ScalingAction) -> None:
        assert self.record is not None
        match action:
            case ScaleStatefulSet(replicas=n):
                if n > self.replicas:
                    for o in range(self.replicas, n):
                        self.pods[o] = self._new_pod(o)
                else:
                    for o in range(n, self.replicas):
                        pod = self.pods.pop(o)
                        if pod.data:
                            raise InvariantViolation(f"pod {o} removed holding {sorted(pod.data)}")
                self.replicas = n
            case PushPlacement(ordinals=ordinals, move=move):
                for o in ordinals:
                    pod = self._pod(o)
                    try:
                        pod.put(self.record)
                    except PodError:
                        if move is not None and o in (move.source, move.target):
                            raise
            case MoveStep(move=move):
                self._step(move)

    def _pod(self, ordinal: int) -> SimPod:
        pod = self.pods.get(ordinal)
        if pod is None or not pod.ready:
            raise PodError(f"pod {ordinal} is not reachable")
        return pod

    def _step(self, move: Move) -> None:
        match move.phase:
            case MovePhase.PRECOPY:
                self._pod(move.target).precopy(move.unit, move.id, self._pod(move.source))
            case MovePhase.FENCE:
                self._pod(move.source).fence(move.unit, move.id)
            case MovePhase.RECEIVE:
                self._pod(move.target).receive(move.unit, move.id, self._pod(move.source))
            case MovePhase.RELEASE:
                self._pod(move.source).release(move.unit, move.id)
            case MovePhase.ROLLBACK:
                if move.target in self.pods:
                    self._pod(move.target).discard(move.unit, move.id)
                self._pod(move.source).unfence(move.unit, move.id)
            case MovePhase.SWITCH:
                raise AssertionError("a switch is a PushPlacement")

    def settled(self) -> bool:
        assert self.state is not None
        return (
            not self.state.moves
            and self.state.rebalance is None
            and self.replicas == self.desired
            and all(p.ready for p in self.pods.values())
            and all(p.record == self.record for p in self.pods.values())
            and not any(p.staged for p in self.pods.values())  # pre-copies received or discarded
        )


def describe(action: ScalingAction, record: Placement) -> str:
    match action:
        case ScaleStatefulSet(replicas=n):
            return f"statefulset replicas {n}"
        case PushPlacement(ordinals=o, move=m):
            why = f" ({m.id} switch)" if m is not None else ""
            return f"push epoch {record.epoch} to {list(o)}{why}"
        case MoveStep(move=m):
            return f"{m.phase} {m.id} unit {m.unit} {m.source}->{m.target} ({m.reason})"
    raise AssertionError(action)
