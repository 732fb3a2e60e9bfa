"""The rollout engine's vocabulary: what is wanted, what is observed, what was persisted, what to do.

Everything here is an immutable value so that a decision is a pure function of its inputs: the Kopf
handlers and the local fleet translate the world into these values, call the engine, and carry out the
one action it returns. Nothing in this module performs I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from txnkeeper.contract import batching


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The PIP-160 batchedWrite block (also Pulsar's TxnBufferedWriterStat) for one pod's stores."""

    # Defaults (and the CRD's limits) come from the contract the runtime enforces too.
    enabled: bool = batching.DEFAULT_ENABLED
    max_records: int = batching.DEFAULT_MAX_RECORDS
    max_size_bytes: int = batching.DEFAULT_MAX_SIZE_BYTES
    max_delay_millis: int = batching.DEFAULT_MAX_DELAY_MILLIS

    def disabled(self) -> BatchSettings:
        return replace(self, enabled=False)

    @classmethod
    def from_stat(cls, stat: Mapping[str, Any]) -> BatchSettings:
        """From Pulsar's TxnBufferedWriterStat, as a pod's admin API reports it."""
        return cls(
            enabled=bool(stat["batchEnabled"]),
            max_records=int(stat["batchedWriteMaxRecords"]),
            max_size_bytes=int(stat["batchedWriteMaxSize"]),
            max_delay_millis=round(float(stat["batchedWriteMaxDelayInMillis"])),
        )

    @classmethod
    def effective(cls, pod_level: BatchSettings, stores: Iterable[BatchSettings]) -> BatchSettings:
        """One value for a whole pod from its pod-level settings and its stores' own.

        Stores that disagree with the pod level make it a value that satisfies no spec (so the engine
        configures the pod again), enabled if any store batches (so a downgrade never mistakes a
        half-disabled pod for a disabled one).
        """
        stores = list(stores)
        if all(s == pod_level for s in stores):
            return pod_level
        any_enabled = pod_level.enabled or any(s.enabled for s in stores)
        return cls(enabled=any_enabled, max_records=0, max_size_bytes=0, max_delay_millis=0)

    def to_stat(self) -> dict[str, Any]:
        """As Pulsar's TxnBufferedWriterStat (what a pod's admin API takes)."""
        return {
            "batchEnabled": self.enabled,
            "batchedWriteMaxRecords": self.max_records,
            "batchedWriteMaxSize": self.max_size_bytes,
            "batchedWriteMaxDelayInMillis": self.max_delay_millis,
        }

    def satisfies(self, wanted: BatchSettings) -> bool:
        """True when a store running with these settings is what ``wanted`` asks for.

        Limits only matter while batching is on: a disabled writer writes every record directly.
        """
        if self.enabled != wanted.enabled:
            return False
        if not wanted.enabled:
            return True
        return (
            self.max_records == wanted.max_records
            and self.max_size_bytes == wanted.max_size_bytes
            and self.max_delay_millis == wanted.max_delay_millis
        )


@dataclass(frozen=True, slots=True)
class Desired:
    """The resource's spec, reduced to what the rollout depends on."""

    version: str
    replicas: int
    batch: BatchSettings


@dataclass(frozen=True, slots=True)
class Template:
    """What a pod (re)created right now would start with: the StatefulSet template's version and the
    ConfigMap's start-up batch settings. A pod that crashes or is evicted comes back with exactly this,
    so the engine keeps it at a format level the data can live with."""

    version: str
    batch: BatchSettings


@dataclass(frozen=True, slots=True)
class PodState:
    """One pod as observed: its spec version (what it runs) and what its admin API reports."""

    ordinal: int
    name: str
    version: str
    ready: bool
    # Aggregated over every store of the pod; None while the admin API has not answered.
    batch: BatchSettings | None = None


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


Action = ApplyTemplate | RestartPod | ConfigureBatchLog | RolloverStores | RunVerifier


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
