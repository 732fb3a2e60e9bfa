"""A simulated StatefulSet + data + verifier for driving the pure rollout engine in scenario tests.

The simulation models exactly what the safety argument is about: which ledgers of each pod still hold
live batched entries. It asserts the invariant at every step (no pod runs, and no pod could be recreated
from the template, at a format level below what its live data needs), runs the engine's actions the way
the operator does, and can "restart the operator" by dropping the in-memory progress and decoding what
was persisted through the same codec the operator uses for the resource's status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from txnkeeper_operator.engine import (
    ApplyTemplate,
    BatchSettings,
    ConfigureBatchLog,
    Decision,
    Desired,
    EngineConfig,
    Observed,
    Phase,
    PodState,
    Progress,
    RestartPod,
    RolloverStores,
    RunVerifier,
    StoreVerdict,
    Template,
    VerifierReport,
    VerifierState,
    decide,
    format_level,
    record_rollover,
)
from txnkeeper_operator.engine.persist import progress_from_status, progress_to_status

T0 = datetime(2026, 11, 21, 22, 0, 0, tzinfo=UTC)
ON = BatchSettings(enabled=True, max_records=512, max_size_bytes=4 * 1024 * 1024, max_delay_millis=1)
OFF = BatchSettings()
CONFIG = EngineConfig(verifier_retry=timedelta(seconds=5), verifier_timeout=timedelta(seconds=60))


class InvariantViolation(AssertionError):
    """The one thing the engine must never allow."""


@dataclass
class SimPod:
    ordinal: int
    name: str
    version: str
    batch: BatchSettings
    ready: bool = False
    current_ledger: int = 1
    batched_ledgers: set[int] = field(default_factory=set)
    # A transaction that never ends pins its ledgers: nothing behind it is trimmed.
    pinned: bool = False
    rolled_at: datetime | None = None
    crashlooping: bool = False
    # Ticks until a (re)started pod reports ready: long enough for the operator to see it unready.
    starting: int = 2

    def needs_level(self) -> int:
        return 2 if self.batched_ledgers else 1


@dataclass
class SimCluster:
    name: str = "tc"
    stores_per_pod: int = 2
    now: datetime = T0
    template: Template | None = None
    pods: dict[int, SimPod] = field(default_factory=dict)
    persisted: dict[str, Any] | None = None
    paused: bool = False
    verifier_running: bool = False
    verifier_markers: dict[str, int] = field(default_factory=dict)
    verifier_taken_at: datetime | None = None
    verifier_failed_at: datetime | None = None
    verifier_failure: str = ""
    verifier_done_at: datetime | None = None
    report: VerifierReport | None = None
    verifier_seconds: int = 3
    trim_after: timedelta = timedelta(seconds=4)
    # Whether the next pod (re)start is unready until the next tick (slow start) or stays broken.
    reachable: bool = True
    log: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    # Volumes of pods deleted together with their StatefulSet (PVCs are retained).
    volumes: dict[int, SimPod] = field(default_factory=dict)

    # ---- what the operator observes -----------------------------------------------------------------

    def observe(self) -> Observed:
        pods = tuple(
            PodState(
                p.ordinal,
                p.name,
                p.version,
                p.ready,
                p.batch if (p.ready and self.reachable) else None,
            )
            for p in self.pods.values()
        )
        verifier = VerifierState(
            self.verifier_running, self.report, self.verifier_failed_at, self.verifier_failure
        )
        return Observed(self.template, pods, self.now, verifier, self.paused)

    def progress(self) -> Progress:
        return progress_from_status(self.persisted)

    # ---- one reconcile loop iteration ---------------------------------------------------------------

    def step(self, desired: Desired, crash: str | None = None) -> Decision:
        """Decide and act like a handler: persist progress (write-ahead), act, persist the result.

        crash="before": the operator dies after deciding, before persisting anything;
        crash="between": it persisted the decision's progress but died before acting;
        crash="after": it acted but died before persisting what the action returned.
        """
        self._statefulset_controller(desired)
        decision = decide(desired, self.observe(), self.progress(), CONFIG)
        self.decisions.append(decision)
        if crash == "before":
            self.log.append("operator restart")
            return decision
        self.persisted = progress_to_status(decision.progress)
        if crash == "between":
            self.log.append("operator restart")
            return decision
        progress = decision.progress
        if decision.action is not None:
            progress = self._execute(decision, desired, progress)
        if crash == "after":
            self.log.append("operator restart")
            return decision
        self.persisted = progress_to_status(progress)
        return decision

    def _execute(self, decision: Decision, desired: Desired, progress: Progress) -> Progress:
        action = decision.action
        if isinstance(action, ApplyTemplate):
            self.template = Template(action.version, action.batch)
            self.log.append(f"template {action.version} batch={'on' if action.batch.enabled else 'off'}")
            for ordinal in range(desired.replicas):
                if ordinal not in self.pods:
                    self._create(ordinal)
        elif isinstance(action, RestartPod):
            assert self.template is not None
            if self.template.version != action.to_version:
                raise AssertionError(
                    f"restart to {action.to_version} but template is {self.template.version}"
                )
            others = [p.name for p in self.pods.values() if not p.ready and p.ordinal != action.ordinal]
            if others:
                raise AssertionError(f"restarted {action.pod} while {others} not ready")
            self.log.append(f"restart {action.pod} -> {action.to_version}")
            self._recreate(self.pods[action.ordinal])
        elif isinstance(action, ConfigureBatchLog):
            pod = self.pods[action.ordinal]
            if action.batch.enabled and format_level(pod.version) < 2:
                raise AssertionError(f"enabled batching on level-1 pod {pod.name} (409)")
            pod.batch = action.batch
            if action.batch.enabled:
                pod.batched_ledgers.add(pod.current_ledger)
            self.log.append(f"batch {action.pod} {'on' if action.batch.enabled else 'off'}")
        elif isinstance(action, RolloverStores):
            pod = self.pods[action.ordinal]
            markers = {f"{pod.name}/s{i}": pod.current_ledger for i in range(self.stores_per_pod)}
            pod.current_ledger += 1
            pod.rolled_at = self.now
            self.log.append(f"rollover {action.pod}")
            progress = record_rollover(progress, pod.name, markers)
        elif isinstance(action, RunVerifier):
            self.verifier_running = True
            self.verifier_markers = dict(action.markers)
            self.verifier_taken_at = action.taken_at
            self.verifier_done_at = self.now + timedelta(seconds=self.verifier_seconds)
            self.log.append("verify")
        return progress

    # ---- the world moving on ------------------------------------------------------------------------

    def tick(self, seconds: int = 1) -> None:
        self.now += timedelta(seconds=seconds)
        for pod in self.pods.values():
            if pod.batch.enabled and pod.ready:
                pod.batched_ledgers.add(pod.current_ledger)  # load keeps writing batched entries
            if not pod.pinned and pod.rolled_at is not None and self.now >= pod.rolled_at + self.trim_after:
                pod.batched_ledgers = {lid for lid in pod.batched_ledgers if lid >= pod.current_ledger}
            if not pod.ready and not pod.crashlooping:
                pod.starting -= 1
                pod.ready = pod.starting <= 0
        if self.verifier_running and self.verifier_done_at is not None and self.now >= self.verifier_done_at:
            self._finish_verifier()
        self.check_invariant()

    def _finish_verifier(self) -> None:
        verdicts = []
        for pod in self.pods.values():
            for i in range(self.stores_per_pod):
                store = f"{pod.name}/s{i}"
                live = sorted(pod.batched_ledgers)
                safe = not live and store in self.verifier_markers
                reason = "all batched data invalidated" if safe else f"live batched entries in ledgers {live}"
                verdicts.append(StoreVerdict(pod.name, store, safe, reason))
        self.report = VerifierReport(
            self.now,
            dict(self.verifier_markers),
            all(v.safe for v in verdicts),
            tuple(verdicts),
            self.verifier_taken_at,
        )
        self.verifier_running = False

    def check_invariant(self) -> None:
        for pod in self.pods.values():
            if format_level(pod.version) < pod.needs_level():
                raise InvariantViolation(f"{pod.name} runs {pod.version} with live batched data")
            if self.template is not None and format_level(self.template.version) < pod.needs_level():
                raise InvariantViolation(
                    f"template {self.template.version} would recreate {pod.name} over live batched data"
                )

    # ---- pods ----------------------------------------------------------------------------------------

    def _statefulset_controller(self, desired: Desired) -> None:
        """Create missing pods and remove surplus ones from the template, as the controller would."""
        if self.template is None:
            return
        for ordinal in range(desired.replicas):
            if ordinal not in self.pods:
                self._create(ordinal)
        for ordinal in [o for o in self.pods if o >= desired.replicas]:
            del self.pods[ordinal]

    def _create(self, ordinal: int) -> None:
        assert self.template is not None
        batch = self.template.batch if format_level(self.template.version) >= 2 else OFF
        pod = SimPod(ordinal, f"{self.name}-{ordinal}", self.template.version, batch)
        volume = self.volumes.pop(ordinal, None)
        if volume is not None:  # a retained PVC: the new pod opens the old pod's ledgers
            pod.batched_ledgers, pod.current_ledger = volume.batched_ledgers, volume.current_ledger
            pod.pinned, pod.rolled_at = volume.pinned, volume.rolled_at
            if format_level(pod.version) < pod.needs_level():
                raise InvariantViolation(f"{pod.name} created at {pod.version} over retained batched data")
        self.pods[ordinal] = pod

    def delete_statefulset(self, *, orphan: bool) -> None:
        """kubectl delete sts: with --cascade=orphan the pods keep running; otherwise they go and
        only their volumes remain."""
        self.log.append(f"crash statefulset (orphan={orphan})")
        self.template = None
        if not orphan:
            self.volumes.update(self.pods)
            self.pods.clear()

    def _recreate(self, pod: SimPod) -> None:
        assert self.template is not None
        if format_level(self.template.version) < pod.needs_level():
            raise InvariantViolation(f"{pod.name} recreated at {self.template.version} over batched data")
        pod.version = self.template.version
        pod.batch = self.template.batch if format_level(pod.version) >= 2 else OFF
        pod.ready = False
        pod.crashlooping = False
        pod.starting = 2

    def crash_pod(self, ordinal: int) -> None:
        """The pod is deleted (eviction, node loss): the StatefulSet recreates it from the template."""
        self.log.append(f"crash {self.pods[ordinal].name}")
        self._recreate(self.pods[ordinal])

    # ---- driving ---------------------------------------------------------------------------------

    def run(
        self,
        desired: Desired,
        *,
        until: Callable[[Decision], bool] | None = None,
        max_steps: int = 200,
        crash_when: Callable[[Decision], bool] | None = None,
        crash_mode: str = "before",
    ) -> Decision:
        """Reconcile until ``until`` holds (default: Ready with nothing to do); return the last decision."""
        stop = until or (lambda d: d.phase == Phase.READY and d.action is None)
        crashed = False
        for _ in range(max_steps):
            self._statefulset_controller(desired)
            probe = decide(desired, self.observe(), self.progress(), CONFIG)
            mode = None
            if crash_when is not None and not crashed and crash_when(probe):
                mode, crashed = crash_mode, True
            decision = self.step(desired, crash=mode)
            # A decision the operator died on before acting was not carried out: the restarted
            # operator reconciles again, so a run does not end on one.
            if stop(decision) and mode not in ("before", "between"):
                return decision
            self.tick()
        raise AssertionError(f"no convergence in {max_steps} steps; last: {self.decisions[-1].reason}")

    def actions(self) -> list[str]:
        return [line for line in self.log if not line.startswith(("crash", "operator"))]


def desired(version: str, batch: BatchSettings = OFF, replicas: int = 3) -> Desired:
    return Desired(version, replicas, batch)


def installed(version: str, batch: BatchSettings = OFF, replicas: int = 3, **kw: Any) -> SimCluster:
    """A cluster already reconciled to ``version``; the install's log is cleared."""
    sim = SimCluster(**kw)
    sim.run(desired(version, batch, replicas))
    sim.tick()  # the load runs: batched pods now hold live batched entries
    sim.log.clear()
    sim.decisions.clear()
    return sim
