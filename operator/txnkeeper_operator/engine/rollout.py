"""The rollout engine: (desired spec, observed pods and stores, verifier report, persisted progress)
-> the next single action. Pure and deterministic, in the style of etcd-io/raft's Ready loop.

The safety rule everything else serves: no pod is ever (re)started at a format level below what its
live data needs. Everything is recomputed from what pods report plus the persisted progress, so an
operator restart in any phase resumes where it left off (Strimzi's KafkaRoller reads pod versions the
same way). Each call runs this algorithm and stops at the first step that has something to do:

 1. Place the desired version, every pod's and the template's on the release table
    (contract.formats); an unknown release is FAILED. The data level is the highest of them.
 2. Paused by annotation: PAUSED, nothing else. Maintenance windows that do not parse: FAILED.
 3. No StatefulSet: create it (CREATING) at a version the data can live with, never below what the
    running pods or an unfinished downgrade say the volumes may hold (``_create_template``).
 4. A pod missing or not ready: a not-ready pod at a version other than the template's is restarted
    from the template (always at a level its data can live with); otherwise wait (``_wait_for_pods``).
 5. Desired level below the data level: the downgrade (``_downgrade``) passes the gates of the
    features it takes away (contract.formats.lost_features). offload-segments first
    (RESTORING_OFFLOADED, ``_restore_offloaded``): each pod still at an offload-capable release that
    reports tier-only ledgers or metadata version 2, or whose running configuration still offloads
    automatically (it may offload at any moment), is asked to restore (RestoreOffloaded), then
    restarted at the template's release (offload off) so it restores before opening its ledgers;
    held until every such pod reports none. Without batched-log among the lost features (3.x -> 2.x)
    the roll then proceeds like step 6. Otherwise the batched-log gates:
    a. batching re-enabled on any pod throws away markers and proof taken so far;
    b. proof already held: roll the template, then the pods highest ordinal first (ROLLING_DOWNGRADE);
    c. gate 1, DISABLING_BATCH_LOG: template unbatched, every pod told and confirmed unbatched,
       while the template stays at a batched-capable version (``_batch_log_off``);
    d. gate 2, ROLLING_OVER_LEDGERS: every pod rolls its stores over and reports LastBatchedLedger
       (``_rollover_next``);
    e. gate 3, VERIFYING_DOWNGRADE / DOWNGRADE_BLOCKED: only a report fresh by the shared rule
       (contract.freshness: same markers, same takenAt, collected after it) counts; safe opens the
       gate (go to b), unsafe holds it and asks again after ``verifier_retry``; no fresh report runs,
       awaits or retries the verifier (``_verify``).
 6. Otherwise a downgrade not yet finished is cancelled, and the upgrade / toggle runs
    (``_upgrade_or_toggle``): batching disabled in the spec is switched off (template, then pods, live);
    the template moves to the desired version, then pods restart highest ordinal first; batching is
    switched on (template, then pods, live) only once every pod can read batched entries; READY.
The downgrade steps return their new progress inside the Decision rather than mutating the planner.
Maintenance windows (``spec.maintenanceWindows``, engine/windows.py) hold every planned restart of a
ready pod while none is open: the decision then has no action, keeps its phase and progress, and says
when the next window opens. A pod that is not ready is restarted at once (recovery, step 4), and every
step that restarts nothing goes on, so the rollout waits at its first restart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from txnkeeper.contract.formats import (
    BATCHED_LEVEL,
    OFFLOAD_LEVEL,
    Feature,
    UnknownReleaseError,
    format_level,
    lost_features,
)
from txnkeeper.contract.freshness import staleness
from txnkeeper.contract.names import PAUSE_ANNOTATION
from txnkeeper_operator.engine.model import (
    Action,
    ApplyTemplate,
    Condition,
    ConditionStatus,
    ConfigureBatchLog,
    Decision,
    Desired,
    DowngradeProgress,
    Observed,
    Phase,
    PodState,
    Progress,
    RestartPod,
    RestoreOffloaded,
    RolloverStores,
    RunVerifier,
    Template,
    VerifierReport,
)
from txnkeeper_operator.engine.windows import WindowError, inside, next_opening, parse_windows


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # A verifier that said "not yet" is asked again after this long (live transactions must end and
    # their ledgers be trimmed before the answer can change).
    verifier_retry: timedelta = timedelta(seconds=30)
    # A requested verifier run that neither shows up as running nor reports is requested again.
    verifier_timeout: timedelta = timedelta(minutes=10)


DEFAULT_CONFIG = EngineConfig()


def decide(
    desired: Desired, observed: Observed, progress: Progress, config: EngineConfig = DEFAULT_CONFIG
) -> Decision:
    """Return the one next step towards ``desired``; see the module docstring for the rules."""
    return _Planner(desired, observed, progress, config).plan()


def _fmt_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class _Planner:
    """One decision's working state; exists only to keep the steps small and named."""

    def __init__(self, desired: Desired, observed: Observed, progress: Progress, config: EngineConfig):
        self.desired = desired
        self.observed = observed
        self.progress = progress
        self.config = config
        # Highest ordinal first, as StatefulSet scale-down and CloudNativePG do.
        self.pods = sorted(
            (p for p in observed.pods if p.ordinal < desired.replicas), key=lambda p: -p.ordinal
        )

    # ---- entry point -------------------------------------------------------------------------------

    def plan(self) -> Decision:
        try:
            self.target_level = format_level(self.desired.version)
            levels = [format_level(p.version) for p in self.pods]
            if self.observed.template is not None:
                levels.append(format_level(self.observed.template.version))
        except UnknownReleaseError as err:
            return self._decision(None, Phase.FAILED, str(err))
        self.data_level = max(levels, default=self.target_level)
        try:
            self.windows = parse_windows(self.desired.maintenance_windows)
        except WindowError as err:
            return self._decision(None, Phase.FAILED, f"spec.maintenanceWindows: {err}")
        self.want_batch = self.desired.batch.enabled and self.target_level >= BATCHED_LEVEL
        if self.observed.paused:
            return self._decision(
                None, Phase.PAUSED, f"reconciliation paused by annotation {PAUSE_ANNOTATION}"
            )
        template = self.observed.template
        if template is None:
            return self._create_template()
        waiting = self._wait_for_pods(template)
        if waiting is not None:
            return waiting
        if self.target_level < self.data_level:
            return self._downgrade(template)
        downgrade = self.progress.downgrade
        if downgrade is not None and not self._completed(downgrade):
            # The spec moved back to a batched-capable version: the downgrade is cancelled.
            self.progress = replace(self.progress, downgrade=None)
        return self._upgrade_or_toggle(template)

    def _completed(self, downgrade: DowngradeProgress) -> bool:
        """A verified downgrade whose pods all run the old line is kept as the record of its proof
        (DowngradeSafe stays True) until the spec returns to a batched-capable line; any new downgrade
        can only follow such an upgrade, so it always starts from scratch."""
        return (
            downgrade.verified_at is not None
            and downgrade.from_version is not None
            and self.target_level < format_level(downgrade.from_version)
        )

    def _create_template(self) -> Decision:
        """A missing StatefulSet (first creation, or deleted by hand while pods or volumes remain) is
        created at a version the data can live with: never below what running pods or an unfinished
        downgrade say the volumes may hold; the normal rollout then continues from there."""
        version = self.desired.version
        batched_pods = [p.version for p in self.pods if format_level(p.version) >= BATCHED_LEVEL]
        downgrade = self.progress.downgrade
        if self.target_level < BATCHED_LEVEL:
            if batched_pods:
                version = max(batched_pods, key=_version_key)
            elif downgrade is not None and downgrade.verified_at is None and downgrade.from_version:
                version = downgrade.from_version
        if self.target_level < OFFLOAD_LEVEL and format_level(version) < OFFLOAD_LEVEL:
            unclean = [
                p.version
                for p in self.pods
                if format_level(p.version) >= OFFLOAD_LEVEL and (p.offload is None or not p.offload.clean)
            ]
            if unclean:
                version = max(unclean, key=_version_key)
        fresh = not self.pods and downgrade is None
        startup = self.desired.batch if self.want_batch and fresh else self.desired.batch.disabled()
        return self._act(ApplyTemplate(version, startup, f"create pods at {version}"), Phase.CREATING)

    # ---- readiness: one pod at a time ---------------------------------------------------------------

    def _wait_for_pods(self, template: Template) -> Decision | None:
        present = {p.ordinal for p in self.pods}
        missing = [o for o in range(self.desired.replicas) if o not in present]
        unready = [p for p in self.pods if not p.ready]
        for pod in unready:
            if pod.version != template.version:
                # A pod that cannot become ready at a stale version is restarted from the template,
                # which is always at a level its data can live with.
                return self._act(
                    RestartPod(
                        pod.name,
                        pod.ordinal,
                        pod.version,
                        template.version,
                        f"{pod.name} is not ready at {pod.version}; restarting it at {template.version}",
                    ),
                    self._rolling_phase(),
                )
        if missing or unready:
            names = [f"ordinal {o} (not created yet)" for o in missing] + [p.name for p in unready]
            phase = Phase.WAITING_FOR_PODS if any(p.ready for p in self.pods) else Phase.CREATING
            return self._decision(None, phase, "waiting for pods to become ready: " + ", ".join(names))
        return None

    def _rolling_phase(self) -> Phase:
        return Phase.ROLLING_DOWNGRADE if self.target_level < self.data_level else Phase.ROLLING_UPGRADE

    # ---- upgrade, same-level change, dynamic toggle -------------------------------------------------

    def _upgrade_or_toggle(self, template: Template) -> Decision:
        desired = self.desired
        if not self.want_batch:
            if template.batch.enabled:
                return self._act(
                    ApplyTemplate(template.version, template.batch.disabled(), "pods start unbatched"),
                    Phase.DISABLING_BATCH_LOG,
                )
            for pod in self.pods:
                if pod.batch is not None and pod.batch.enabled:
                    return self._act(
                        ConfigureBatchLog(
                            pod.name, pod.ordinal, desired.batch.disabled(), "batch log disabled in spec"
                        ),
                        Phase.DISABLING_BATCH_LOG,
                    )
        all_batched_capable = all(format_level(p.version) >= BATCHED_LEVEL for p in self.pods)
        if template.version != desired.version:
            # Pods created during a roll from a level-1 release start unbatched: batching is only
            # switched on once every pod can read it (PIP-160's documented upgrade).
            startup = desired.batch if self.want_batch and all_batched_capable else desired.batch.disabled()
            return self._act(
                ApplyTemplate(desired.version, startup, f"roll pods to {desired.version}"),
                self._rolling_phase(),
            )
        restart = self._restart_next(desired.version, "to", self._rolling_phase())
        if restart is not None:
            return restart
        for pod in self.pods:
            # A template change other than the version (TLS switched): the same one-at-a-time restart,
            # in the same order and maintenance windows, once every pod runs the version.
            if pod.stale is not None:
                reason = f"restart {pod.name}: {pod.stale}"
                stale = RestartPod(pod.name, pod.ordinal, pod.version, pod.version, reason)
                return self._act(stale, Phase.ROLLING_UPGRADE)
        if self.want_batch:
            if not template.batch.satisfies(desired.batch):
                return self._act(
                    ApplyTemplate(template.version, desired.batch, "all pods batched-capable"),
                    Phase.ENABLING_BATCH_LOG,
                )
            for pod in self.pods:
                if pod.batch is None or not pod.batch.satisfies(desired.batch):
                    return self._act(
                        ConfigureBatchLog(pod.name, pod.ordinal, desired.batch, "batch log enabled in spec"),
                        Phase.ENABLING_BATCH_LOG,
                    )
        elif not template.batch.satisfies(desired.batch.disabled()):
            return self._act(
                ApplyTemplate(template.version, desired.batch.disabled(), "pods start unbatched"),
                Phase.DISABLING_BATCH_LOG,
            )
        unknown = [p.name for p in self.pods if p.batch is None]
        if unknown:
            return self._decision(
                None, Phase.WAITING_FOR_PODS, "waiting for batch-log state from " + ", ".join(unknown)
            )
        return self._decision(None, Phase.READY, self._ready_reason())

    def _ready_reason(self) -> str:
        state = "enabled" if self.want_batch else "disabled"
        return f"{len(self.pods)} pod(s) ready at {self.desired.version}, batch log {state}"

    # ---- downgrade to a level that cannot read batched entries ---------------------------------------

    def _downgrade(self, template: Template) -> Decision:
        """The gates are those of the features the move takes away (contract.formats.lost_features):
        offload-segments first (tier-only ledgers restored), then batched-log (the verifier's proof)."""
        lost = lost_features(self.data_level, self.target_level)
        if Feature.OFFLOAD_SEGMENTS in lost:
            gate = self._restore_offloaded(template)
            if gate is not None:
                return gate
        if Feature.BATCHED_LOG not in lost:
            # 3.x -> 2.x: nothing batched to prove; roll like an upgrade, highest ordinal first.
            return self._upgrade_or_toggle(template)
        return self._batched_downgrade(template)

    def _restore_offloaded(self, template: Template) -> Decision | None:
        """Gate 0, RESTORING_OFFLOADED: every pod still at a release with offload reports no tier-only
        ledger, metadata version 1 and no automatic offload. A pod that does not is asked to restore at
        its next start (RestoreOffloaded), then restarted at the template's (offload-capable, offload
        off) release. Pods already below that level started, so their data was clean (the runtime
        refuses otherwise).

        A pod that offloads by itself is asked to restore even while it reports nothing tier-only: it
        may offload between this observation and its restart, and an operator restart in between
        observes it again. Deciding "restart" for a clean one and "restore first" for the same pod a
        moment later would make the actions depend on when the operator happened to look; with the
        request first, the pod-reported ``restore_requested`` is the only memory the gate needs, and the
        one restart restores whatever it offloaded meanwhile."""
        for pod in self.pods:
            if format_level(pod.version) < OFFLOAD_LEVEL:
                continue
            state = pod.offload
            if state is None:
                return self._decision(
                    None, Phase.RESTORING_OFFLOADED, f"waiting for the offload state of {pod.name}"
                )
            if state.clean and not state.automatic:
                continue
            if state.clean:
                held = f"{pod.name} offloads automatically"
                restart = f"restart {pod.name} at {template.version} with automatic offload off"
                request = (
                    f"{held} (nothing tier-only yet); {self.desired.version} cannot read tier-only "
                    "ledgers: have it restore whatever it offloads before its restart"
                )
            else:
                tier_only, version = state.tier_only_ledgers, state.metadata_version
                what = f"{tier_only} tier-only ledger(s), metadata version {version}"
                held = f"{pod.name} still holds {what}"
                restart = f"restart {pod.name} at {template.version} so it restores {what} first"
                request = (
                    f"{pod.name} holds {what}; {self.desired.version} cannot read them: restore them locally"
                )
            if format_level(template.version) < OFFLOAD_LEVEL:
                # Only after a lost StatefulSet: a restart must come back at a release that restores.
                return self._act(ApplyTemplate(pod.version, template.batch, held), Phase.RESTORING_OFFLOADED)
            if state.restore_requested:
                return self._act(
                    RestartPod(pod.name, pod.ordinal, pod.version, template.version, restart),
                    Phase.RESTORING_OFFLOADED,
                )
            return self._act(RestoreOffloaded(pod.name, pod.ordinal, request), Phase.RESTORING_OFFLOADED)
        return None

    def _batched_downgrade(self, template: Template) -> Decision:
        progress = self.progress.downgrade or DowngradeProgress(
            started_at=self.observed.now, from_version=self._highest_batched_version(template)
        )
        enabled = [p for p in self.pods if p.batch is not None and p.batch.enabled]
        if enabled and (progress.markers or progress.verified_at is not None):
            # Batched data may have been written after the markers: they prove nothing any more.
            progress = progress.invalidated()
        if progress.verified_at is not None:
            return self._downgrade_roll(template, progress)
        return (
            self._batch_log_off(template, progress, enabled)
            or self._rollover_next(progress)
            or self._verify(template, progress)
        )

    def _highest_batched_version(self, template: Template) -> str | None:
        versions = [p.version for p in self.pods] + [template.version]
        capable = [v for v in versions if format_level(v) >= BATCHED_LEVEL]
        return max(capable, key=_version_key) if capable else None

    def _batch_log_off(
        self, template: Template, progress: DowngradeProgress, enabled: list[PodState]
    ) -> Decision | None:
        """Gate step 1: the template and every pod run with the batch log disabled (else the next
        action towards that), confirmed by every pod."""
        if format_level(template.version) < BATCHED_LEVEL:
            # Only reachable when a verified downgrade lost its proof mid-roll: a pod recreated now
            # must still be able to read what the remaining batched-capable pods wrote.
            version = max(
                (p.version for p in self.pods if format_level(p.version) >= BATCHED_LEVEL),
                key=_version_key,
            )
            return self._act(
                ApplyTemplate(version, template.batch.disabled(), "keep restarted pods batched-capable"),
                Phase.DISABLING_BATCH_LOG,
                progress,
            )
        if template.batch.enabled:
            return self._act(
                ApplyTemplate(template.version, template.batch.disabled(), "pods start unbatched"),
                Phase.DISABLING_BATCH_LOG,
                progress,
            )
        if enabled:
            pod = enabled[0]
            return self._act(
                ConfigureBatchLog(
                    pod.name,
                    pod.ordinal,
                    self.desired.batch.disabled(),
                    f"disable the batch log before downgrading to {self.desired.version}",
                ),
                Phase.DISABLING_BATCH_LOG,
                progress,
            )
        unknown = [p.name for p in self.pods if p.batch is None]
        if unknown:
            return self._decision(
                None,
                Phase.DISABLING_BATCH_LOG,
                "waiting to confirm the batch log is disabled on " + ", ".join(unknown),
                progress,
            )
        return None

    def _rollover_next(self, progress: DowngradeProgress) -> Decision | None:
        """Gate step 2: every pod in scope has rolled its stores over and reported LastBatchedLedger."""
        for pod in self.pods:
            if pod.name not in progress.markers:
                return self._act(
                    RolloverStores(pod.name, pod.ordinal, "record LastBatchedLedger for every store"),
                    Phase.ROLLING_OVER_LEDGERS,
                    progress,
                )
        return None

    def _verify(self, template: Template, progress: DowngradeProgress) -> Decision:
        """Gate step 3: a fresh safe report opens the gate; a fresh unsafe one holds it (asking again
        after verifier_retry); otherwise the verifier is run, awaited or retried."""
        now = self.observed.now
        if progress.markers_complete_at is None:
            progress = replace(progress, markers_complete_at=now)
        # Only the pods in scope: a pod scaled away mid-gate cannot be asked, and would hold the gate forever.
        in_scope = {p.name for p in self.pods}
        markers = {
            store: ledger
            for pod, stores in progress.markers.items()
            if pod in in_scope
            for store, ledger in stores.items()
        }
        report = self.observed.verifier.report
        fresh = report if report is not None and _is_fresh(report, progress, markers) else None
        if fresh is not None and fresh.safe:
            return self._downgrade_roll(template, replace(progress, verified_at=now, blocked_since=None))
        if fresh is not None:
            return self._blocked(progress, markers, fresh)
        return self._await_verifier(progress, markers)

    def _blocked(
        self, progress: DowngradeProgress, markers: dict[str, int], fresh: VerifierReport
    ) -> Decision:
        """A fresh report says live batched entries remain: hold, and verify again after a while."""
        blocked_since = progress.blocked_since or fresh.generated_at
        progress = replace(progress, blocked_since=blocked_since)
        blockers = [f"{v.pod}/{v.store} ({v.reason})" for v in fresh.stores if not v.safe]
        why = f"downgrade to {self.desired.version} held since {_fmt_time(blocked_since)}: " + (
            ", ".join(blockers) if blockers else "the verifier reported not safe"
        )
        retry_at = fresh.generated_at + self.config.verifier_retry
        running = self.observed.verifier.running
        if not running and self.observed.now >= retry_at and not self._verifier_pending(progress, fresh):
            return self._run_verifier(progress, markers, why + "; verifying again", Phase.DOWNGRADE_BLOCKED)
        return self._decision(None, Phase.DOWNGRADE_BLOCKED, why, progress)

    def _await_verifier(self, progress: DowngradeProgress, markers: dict[str, int]) -> Decision:
        """No fresh report: retry a failed run, wait for a running or just-requested one, else run it."""
        verifier = self.observed.verifier
        failed = self._failed_run(progress)
        if failed is not None and not verifier.running:
            if self.observed.now >= failed + self.config.verifier_retry:
                return self._run_verifier(
                    progress, markers, f"the last verifier run failed ({verifier.failure}); running it again"
                )
            return self._decision(
                None,
                Phase.VERIFYING_DOWNGRADE,
                f"the last verifier run failed ({verifier.failure}); retrying",
                progress,
            )
        if verifier.running or self._verifier_pending(progress, None):
            return self._decision(
                None,
                Phase.VERIFYING_DOWNGRADE,
                f"waiting for the verifier ({len(markers)} store(s))",
                progress,
            )
        return self._run_verifier(
            progress, markers, f"prove no live batched entry remains in {len(markers)} store(s)"
        )

    def _failed_run(self, progress: DowngradeProgress) -> datetime | None:
        """When the run this downgrade requested ended without a report (else None)."""
        failed = self.observed.verifier.failed_at
        requested = progress.verifier_requested_at
        if failed is None or requested is None or failed < requested:
            return None
        return failed

    def _verifier_pending(self, progress: DowngradeProgress, answered: VerifierReport | None) -> bool:
        """A run was requested recently and has not answered since (it may not be visible yet)."""
        requested = progress.verifier_requested_at
        if requested is None:
            return False
        if answered is not None and answered.generated_at >= requested:
            return False
        return self.observed.now < requested + self.config.verifier_timeout

    def _run_verifier(
        self,
        progress: DowngradeProgress,
        markers: dict[str, int],
        reason: str,
        phase: Phase = Phase.VERIFYING_DOWNGRADE,
    ) -> Decision:
        progress = replace(progress, verifier_requested_at=self.observed.now)
        taken_at = progress.markers_complete_at or self.observed.now
        return self._act(RunVerifier(markers, taken_at, reason), phase, progress)

    def _downgrade_roll(self, template: Template, progress: DowngradeProgress) -> Decision:
        """After the proof: the template, then every pod (highest ordinal first), to the old line."""
        desired = self.desired
        if template.version != desired.version or template.batch.enabled:
            return self._act(
                ApplyTemplate(
                    desired.version,
                    desired.batch.disabled(),
                    "verifier proved every store free of live batched entries",
                ),
                Phase.ROLLING_DOWNGRADE,
                progress,
            )
        restart = self._restart_next(desired.version, "down to", Phase.ROLLING_DOWNGRADE, progress)
        if restart is not None:
            return restart
        # Unreachable while data_level > target_level, kept so the planner never falls off its end.
        return self._decision(None, Phase.ROLLING_DOWNGRADE, "waiting for the downgraded pods", progress)

    def _restart_next(
        self, version: str, to: str, phase: Phase, downgrade: DowngradeProgress | None = None
    ) -> Decision | None:
        """Restart the first pod (in the planner's order) not yet at ``version``; None if none is left."""
        for pod in self.pods:
            if pod.version != version:
                reason = f"roll {pod.name} from {pod.version} {to} {version}"
                restart = RestartPod(pod.name, pod.ordinal, pod.version, version, reason)
                return self._act(restart, phase, downgrade)
        return None

    # ---- results ---------------------------------------------------------------------------------

    def _act(self, action: Action, phase: Phase, downgrade: DowngradeProgress | None = None) -> Decision:
        if (
            isinstance(action, RestartPod)
            and self._planned(action)
            and not inside(self.windows, self.observed.now)
        ):
            opening = next_opening(self.windows, self.observed.now)
            when = (
                f"the next opens at {_fmt_time(opening)}"
                if opening is not None
                else "none of them opens within a year: check spec.maintenanceWindows"
            )
            reason = f"{action.reason}: waits for a maintenance window ({when})"
            return self._decision(None, phase, reason, downgrade)
        return self._decision(action, phase, action.reason, downgrade)

    def _planned(self, restart: RestartPod) -> bool:
        """A restart of a pod that is up (a rollout step), not of one that is down (recovery)."""
        return any(p.name == restart.pod and p.ready for p in self.pods)

    def _decision(
        self, action: Action | None, phase: Phase, reason: str, downgrade: DowngradeProgress | None = None
    ) -> Decision:
        """The decision, carrying ``downgrade`` (the downgrade steps' new progress) when given."""
        progress = self.progress if downgrade is None else replace(self.progress, downgrade=downgrade)
        return Decision(action, phase, reason, progress, self._conditions(phase, reason, progress))

    def _conditions(self, phase: Phase, reason: str, progress: Progress) -> tuple[Condition, ...]:
        t, f, u = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
        ready_pods = sum(1 for p in self.pods if p.ready)
        all_ready = ready_pods == self.desired.replicas and len(self.pods) == self.desired.replicas
        ready = Condition(
            "Ready",
            t if phase == Phase.READY else f,
            "Reconciled" if phase == Phase.READY else str(phase),
            reason if phase == Phase.READY else f"{ready_pods}/{self.desired.replicas} pods ready; {reason}",
        )
        settled = phase in (Phase.READY, Phase.PAUSED, Phase.FAILED)
        progressing = Condition(
            "Progressing", f if settled else t, str(phase), reason if not settled else "no rollout underway"
        )
        batched = [p for p in self.pods if p.batch is not None and p.batch.enabled]
        total = len(self.pods)
        if total and len(batched) == total and all_ready:
            batch_cond = Condition("BatchLogEnabled", t, "AllStoresBatched", f"all {total} pods batch")
        elif batched:
            batch_cond = Condition(
                "BatchLogEnabled", f, "Partial", f"{len(batched)}/{total} pods report the batch log enabled"
            )
        else:
            batch_cond = Condition("BatchLogEnabled", f, "Disabled", "no pod has the batch log enabled")
        downgrade = progress.downgrade
        if downgrade is None:
            safe = Condition("DowngradeSafe", u, "NoDowngrade", "no downgrade in progress")
        elif downgrade.verified_at is not None:
            done = " (downgrade complete)" if phase == Phase.READY else ""
            safe = Condition(
                "DowngradeSafe",
                t,
                "Verified",
                f"verifier proved no live batched entry at {_fmt_time(downgrade.verified_at)}{done}",
            )
        elif phase == Phase.DOWNGRADE_BLOCKED:
            safe = Condition("DowngradeSafe", f, "LiveBatchedData", reason)
        else:
            safe = Condition("DowngradeSafe", u, str(phase), reason)
        paused = Condition(
            "Paused",
            t if phase == Phase.PAUSED else f,
            "Annotated" if phase == Phase.PAUSED else "NotPaused",
            reason if phase == Phase.PAUSED else f"annotate {PAUSE_ANNOTATION}=true to pause",
        )
        return (ready, progressing, batch_cond, safe, paused)


def _is_fresh(report: VerifierReport, progress: DowngradeProgress, markers: dict[str, int]) -> bool:
    """The shared freshness rule (contracts §7): a report counts only if it names these markers'
    takenAt, was computed against exactly these markers, and was collected after they were taken."""
    reason = staleness(
        markers_taken_at=progress.markers_complete_at,
        markers=markers,
        report_markers_taken_at=report.markers_taken_at,
        report_markers=report.markers,
        generated_at=report.generated_at,
    )
    return reason is None


def _version_key(version: str) -> tuple[int, ...]:
    core = version.split("-", 1)[0].split("+", 1)[0]
    return tuple(int(part) for part in core.split("."))


def record_rollover(progress: Progress, pod: str, markers: dict[str, int]) -> Progress:
    """Fold one pod's RolloverStores result (store -> LastBatchedLedger) into the persisted progress."""
    downgrade = progress.downgrade
    if downgrade is None:
        return progress
    merged = {**downgrade.markers, pod: dict(markers)}
    return replace(progress, downgrade=replace(downgrade, markers=merged, markers_complete_at=None))
