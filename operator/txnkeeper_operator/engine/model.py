"""The rollout engine's vocabulary: what is wanted, what is observed, what was persisted, what to do.

Everything here is an immutable value so that a decision is a pure function of its inputs: the Kopf
handlers and the local fleet translate the world into these values, call the engine, and carry out the
one action it returns. Nothing in this module performs I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from txnkeeper.contract.batching import BatchSettings


@dataclass(frozen=True, slots=True)
class Desired:
    """The resource's spec, reduced to what the rollout depends on."""

    version: str
    replicas: int
    batch: BatchSettings
    # spec.maintenanceWindows: cron expressions in UTC (engine/windows.py); planned pod restarts
    # wait for one to be open. Empty: restarts whenever the rollout needs them.
    maintenance_windows: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Template:
    """What a pod (re)created right now would start with: the StatefulSet template's version and the
    ConfigMap's start-up batch settings. A pod that crashes or is evicted comes back with exactly this,
    so the engine keeps it at a format level the data can live with."""

    version: str
    batch: BatchSettings


@dataclass(frozen=True, slots=True)
class OffloadState:
    """A store pod's offload state (GET /admin/v1/offload/summary): what a downgrade to a release
    without ``offload-segments`` waits on."""

    tier_only_ledgers: int
    metadata_version: int
    # The pod holds a restore request (POST /admin/v1/offload/restore): it restores at its next start.
    restore_requested: bool = False
    # Its running configuration offloads by itself: it could create tier-only ledgers at any time.
    automatic: bool = False

    @property
    def clean(self) -> bool:
        """Nothing a release without offload could not read: no tier-only ledger, metadata version 1."""
        return self.tier_only_ledgers == 0 and self.metadata_version <= 1


@dataclass(frozen=True, slots=True)
class PodState:
    """One pod as observed: its spec version (what it runs) and what its admin API reports."""

    ordinal: int
    name: str
    version: str
    ready: bool
    # Aggregated over every store of the pod; None while the admin API has not answered.
    batch: BatchSettings | None = None
    # Reported by store pods whose release has offload-segments; None: not asked or no answer.
    offload: OffloadState | None = None
    # Why the pod must restart although it runs the template's version: it was started from a template
    # that differs otherwise (spec.tls switched: "TLS off -> on"). None: it matches the template.
    stale: str | None = None


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    """The verifier's judgement of one store (docs/contracts.md §7)."""

    pod: str
    store: str
    safe: bool
    reason: str


@dataclass(frozen=True, slots=True)
class VerifierReport:
    """A verifier run's outcome; only trusted when it was computed against the current markers."""

    generated_at: datetime
    markers: Mapping[str, int]
    safe: bool
    stores: tuple[StoreVerdict, ...] = ()
    # The takenAt of the markers document the run was given, when the verifier reports it.
    markers_taken_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class VerifierState:
    running: bool = False
    report: VerifierReport | None = None
    # When the latest verifier run ended without a report (a failed Job), and why.
    failed_at: datetime | None = None
    failure: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    template: Template | None
    pods: tuple[PodState, ...]
    now: datetime
    verifier: VerifierState = VerifierState()
    paused: bool = False


@dataclass(frozen=True, slots=True)
class DowngradeProgress:
    """What a downgrade has established so far; persisted in the resource's status so that an
    operator restart resumes instead of starting over (crate-operator's persisted queue)."""

    started_at: datetime
    # The batched-capable release the data was written by: what a lost StatefulSet is recreated at.
    from_version: str | None = None
    # pod name -> {store name -> LastBatchedLedger} recorded by that pod's forced rollover.
    markers: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    markers_complete_at: datetime | None = None
    verifier_requested_at: datetime | None = None
    blocked_since: datetime | None = None
    verified_at: datetime | None = None

    def flat_markers(self) -> dict[str, int]:
        return {store: ledger for stores in self.markers.values() for store, ledger in stores.items()}

    def invalidated(self) -> DowngradeProgress:
        """Forget every marker and verdict: batched data may have been written after them."""
        return DowngradeProgress(started_at=self.started_at, from_version=self.from_version)


@dataclass(frozen=True, slots=True)
class Progress:
    downgrade: DowngradeProgress | None = None


class Phase(StrEnum):
    CREATING = "Creating"
    READY = "Ready"
    PAUSED = "Paused"
    FAILED = "Failed"
    WAITING_FOR_PODS = "WaitingForPods"
    ROLLING_UPGRADE = "RollingUpgrade"
    ENABLING_BATCH_LOG = "EnablingBatchLog"
    DISABLING_BATCH_LOG = "DisablingBatchLog"
    ROLLING_OVER_LEDGERS = "RollingOverLedgers"
    VERIFYING_DOWNGRADE = "VerifyingDowngrade"
    DOWNGRADE_BLOCKED = "DowngradeBlocked"
    ROLLING_DOWNGRADE = "RollingDowngrade"
    RESTORING_OFFLOADED = "RestoringOffloaded"


@dataclass(frozen=True, slots=True)
class ApplyTemplate:
    """Set the StatefulSet template's version and the ConfigMap's start-up batch settings."""

    version: str
    batch: BatchSettings
    reason: str


@dataclass(frozen=True, slots=True)
class RestartPod:
    """Delete one pod so the StatefulSet (OnDelete) recreates it from the template."""

    pod: str
    ordinal: int
    from_version: str
    to_version: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConfigureBatchLog:
    """Change one pod's batch-log settings dynamically through its admin API (no restart)."""

    pod: str
    ordinal: int
    batch: BatchSettings
    reason: str


@dataclass(frozen=True, slots=True)
class RolloverStores:
    """Force every store of one pod onto a new ledger and record its LastBatchedLedger."""

    pod: str
    ordinal: int
    reason: str


@dataclass(frozen=True, slots=True)
class RunVerifier:
    """Run the invalidation verifier against these rollover markers (taken at ``taken_at``)."""

    markers: Mapping[str, int]
    taken_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class RestoreOffloaded:
    """Ask one store pod (POST /admin/v1/offload/restore) to copy its tier-only ledgers back and
    rewrite its metadata as version 1 at its next start (the engine then restarts it)."""

    pod: str
    ordinal: int
    reason: str


Action = ApplyTemplate | RestartPod | ConfigureBatchLog | RolloverStores | RunVerifier | RestoreOffloaded


def describe(action: Action) -> str:
    """One line saying what ``action`` does: the operator's Events and status.lastAction, the local
    fleet's history. One wording for both, so what the demo prints is what a cluster shows."""
    match action:
        case ApplyTemplate(version=v, batch=b):
            return f"template -> {v}, pods start with batch log {'on' if b.enabled else 'off'}"
        case RestartPod(pod=p, from_version=f, to_version=t):
            return f"restart {p}: {f} -> {t}"
        case ConfigureBatchLog(pod=p, batch=b):
            return f"batch log {'on' if b.enabled else 'off'} on {p}"
        case RolloverStores(pod=p):
            return f"roll over every store of {p}"
        case RunVerifier(markers=m):
            return f"run the verifier over {len(m)} store(s)"
        case RestoreOffloaded(pod=p):
            return f"restore the tier-only ledgers of {p} locally"
    raise AssertionError(action)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Condition:
    """A Kubernetes-convention condition without its timestamps (the handler adds those)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The engine's answer: at most one action, the phase with a human reason, the progress to
    persist (before or after the action, it is valid either way), and the conditions to publish."""

    action: Action | None
    phase: Phase
    reason: str
    progress: Progress
    conditions: tuple[Condition, ...]

    def condition(self, type_: str) -> Condition:
        for cond in self.conditions:
            if cond.type == type_:
                return cond
        raise KeyError(type_)
