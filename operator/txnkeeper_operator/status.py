"""Build the resource's status from a decision and what was observed (pure).

Conditions follow the Kubernetes API conventions: keyed by type, lastTransitionTime only moves when
the status flips, observedGeneration on each. The per-pod arrays are PIP-160's coordinatorArray /
subscriptionArray, tagged with the pod that serves each entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from txnkeeper_operator import gated, naming, podsettings
from txnkeeper_operator.engine import Condition, Decision, VerifierReport
from txnkeeper_operator.engine.persist import format_time, progress_to_status
from txnkeeper_operator.observe import PodView
from txnkeeper_operator.resource import Resource

MAX_REPORTED_VERDICTS = 50
# The verify-offload report (None: none), why it is unusable, why it is not the last run's.
AuditView = tuple[Mapping[str, Any] | None, str | None, str | None]


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    decision: Decision,
    generation: int,
    now: datetime,
    extra: Sequence[Condition] = (),
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for cond in (*decision.conditions, *extra):
        old = before.get(cond.type)
        changed = old is None or old.get("status") != str(cond.status)
        out.append(
            {
                "type": cond.type,
                "status": str(cond.status),
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": format_time(now) if changed else old["lastTransitionTime"],  # type: ignore[index]
                "observedGeneration": generation,
            }
        )
    return out


def _pod_entry(view: PodView) -> dict[str, Any]:
    state = view.state()
    entry: dict[str, Any] = {"name": view.name}
    if state is None:
        return entry
    entry["version"] = state.version
    entry["ready"] = state.ready
    if view.info is not None:
        entry["release"] = str(view.info.get("release", ""))
        entry["formatLevel"] = int(view.info.get("formatLevel", 0))
    if view.offload is not None:
        segments = view.offload.get("segments") or {}
        entry["offload"] = {
            "maxMetadataVersion": int(view.offload.get("maxMetadataVersion", 1)),
            "tierOnlyLedgers": int(view.offload.get("tierOnlyLedgers", 0)),
            "assignedSegments": int(segments.get("Assigned", 0)),
            "offloadedSegments": int(segments.get("Offloaded", 0)),
            "failedSegments": int(segments.get("Failed", 0)),
        }
    elif view.offload_error is not None:
        entry["offload"] = {"error": view.offload_error}
    if state.batch is None:
        entry["batchLog"] = "Unknown"
    else:
        entry["batchLog"] = "Enabled" if state.batch.enabled else "Disabled"
    return entry


def _arrays(cr: Resource, pods: Sequence[PodView]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for view in pods:
        if view.batch_log is None:
            continue
        rows.extend({"pod": view.name, **dict(entry)} for entry in view.batch_log.array)
    return rows


def _versions(pods: Sequence[PodView]) -> str:
    versions = sorted({s.version for s in (p.state() for p in pods) if s is not None})
    return ",".join(versions)


def _batch_log(pods: Sequence[PodView]) -> str:
    states = [s for s in (p.state() for p in pods) if s is not None]
    enabled = [s for s in states if s.batch is not None and s.batch.enabled]
    if states and len(enabled) == len(states):
        return "Enabled"
    return "Partial" if enabled else "Disabled"


def report_status(report: VerifierReport) -> dict[str, Any]:
    blocking = [v for v in report.stores if not v.safe][:MAX_REPORTED_VERDICTS]
    return {
        "generatedAt": format_time(report.generated_at),
        "safe": report.safe,
        "stores": [{"pod": v.pod, "store": v.store, "safe": v.safe, "reason": v.reason} for v in blocking],
    }


def _gated_conditions(cr: Resource, pods: Sequence[PodView], audit: AuditView) -> tuple[Condition, ...]:
    """SettingsValid for both kinds; FeaturesSupported, OffloadHealthy and OffloadAudit for
    PendingAckStores only (the sections are theirs)."""
    if cr.kind is not naming.PENDING_ACK_STORE:
        return (podsettings.settings_condition(cr),)
    summaries = [(p.name, p.offload, p.offload_error) for p in sorted(pods, key=lambda p: p.name)]
    return (
        gated.features_condition(cr, cr.version),
        gated.offload_condition(cr, summaries),
        gated.offload_audit_condition(cr, *audit),
        podsettings.settings_condition(cr),
    )


def build_status(
    cr: Resource,
    decision: Decision,
    *,
    pods: Sequence[PodView],
    previous: Mapping[str, Any],
    now: datetime,
    report: VerifierReport | None,
    last_action: str | None,
    offload_audit: AuditView = (None, None, None),
    placement: Mapping[str, Any] | None = None,
    scaling: Condition | None = None,
    tls: Condition | None = None,
) -> dict[str, Any]:
    """The full status to merge-patch (None values clear stale fields). ``offload_audit`` is the
    verify-offload report (None: none), why it is unusable, if it is, and why it is not the last
    run's, if it is not (``auditfresh.stale_reason``); ``placement``/``scaling``: status.placement and
    the ScaleInSafe condition (scaling.py); ``tls``: the AdminTLS condition (podtls.py)."""
    ours = [p for p in pods if p.state() is not None]
    status: dict[str, Any] = {
        "observedGeneration": cr.generation,
        "phase": str(decision.phase),
        "phaseReason": decision.reason,
        "conditions": merge_conditions(
            previous.get("conditions") or [],
            decision,
            cr.generation,
            now,
            (
                *_gated_conditions(cr, ours, offload_audit),
                *((scaling,) if scaling is not None else ()),
                *((tls,) if tls is not None else ()),
            ),
        ),
        "replicas": len(ours),
        "readyReplicas": sum(1 for p in ours if (s := p.state()) is not None and s.ready),
        "selector": naming.selector_string(cr.kind, cr.name),
        "currentVersion": _versions(ours),
        "batchLog": _batch_log(ours),
        "pods": [_pod_entry(p) for p in sorted(ours, key=lambda p: p.name)],
        cr.kind.array_key: _arrays(cr, sorted(ours, key=lambda p: p.name)),
        "downgrade": progress_to_status(decision.progress),
    }
    if placement is not None:
        status["placement"] = placement
    if report is not None:
        status["lastVerifierReport"] = report_status(report)
    if cr.kind is naming.PENDING_ACK_STORE:
        audit, _, stale = offload_audit
        status["offloadAudit"] = gated.audit_status(audit, stale) if audit is not None else None
    if last_action is not None:
        status["lastAction"] = {"action": last_action, "time": format_time(now)}
    return status
