"""Text for people (pure): a resource's status as tables, its rollout history, aligned like kubectl's.

Everything shown is read from the object as the API server returned it; fields a status does not have
(an older operator, a resource not yet reconciled, ``placement`` from a newer one) are left out rather
than shown empty, so the same plugin reads every operator version's status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from txnkeeper.contract.formats import UnknownReleaseError, format_level
from txnkeeper_operator import naming

Obj = Mapping[str, Any]
INDENT = "  "
# kopf posts the operator's handler log lines as Events of this reason: not rollout steps.
LOG_LINE_REASON = "Logging"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> list[str]:
    """Columns padded to their widest cell, three spaces apart (kubectl's printer)."""
    cells = [list(header), *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [
        indent + "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def level_of(version: str) -> str:
    """The storage format level a release reads and writes at most ('?' for an unknown release)."""
    try:
        return str(int(format_level(version)))
    except UnknownReleaseError:
        return "?"


def when(raw: object) -> str:
    """An API timestamp as ``YYYY-MM-DDTHH:MM:SSZ`` (as it came if unparseable)."""
    if not isinstance(raw, str) or not raw:
        return "-"
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        return raw
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _versions(status: Obj) -> str:
    current = str(status.get("currentVersion") or "")
    if not current:
        return "-"
    return ", ".join(f"{v} (format level {level_of(v)})" for v in current.split(","))


def _offload_cell(entry: Obj) -> str:
    offload = entry.get("offload")
    if not isinstance(offload, Mapping):
        return "-"
    if offload.get("error"):
        return f"error: {offload['error']}"
    return (
        f"tier-only {offload.get('tierOnlyLedgers', 0)}, segments"
        f" {offload.get('assignedSegments', 0)} assigned/{offload.get('offloadedSegments', 0)} offloaded"
        f"/{offload.get('failedSegments', 0)} failed, metadata v{offload.get('maxMetadataVersion', 1)}"
    )


def _pods(status: Obj) -> list[str]:
    rows = []
    for entry in status.get("pods") or []:
        version = entry.get("version")
        level = entry.get("formatLevel") or (level_of(version) if version else None)
        ready = entry.get("ready")
        rows.append(
            [
                entry.get("name", "?"),
                version or "-",
                level or "-",
                "-" if ready is None else ("true" if ready else "false"),
                entry.get("batchLog", "-"),
                _offload_cell(entry),
            ]
        )
    if not rows:
        return [f"{INDENT}Pods:        none"]
    header = ["POD", "VERSION", "FORMAT LEVEL", "READY", "BATCH LOG", "OFFLOAD"]
    return [f"{INDENT}Pods:", *table(header, rows, INDENT * 2)]


def _conditions(status: Obj) -> list[str]:
    rows = [
        [
            c.get("type"),
            c.get("status"),
            c.get("reason", ""),
            when(c.get("lastTransitionTime")),
            c.get("message", ""),
        ]
        for c in status.get("conditions") or []
    ]
    if not rows:
        return []
    return [
        f"{INDENT}Conditions:",
        *table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows, INDENT * 2),
    ]


def _downgrade(status: Obj) -> list[str]:
    d = status.get("downgrade")
    if not isinstance(d, Mapping):
        return []
    out = [f"{INDENT}Downgrade:   started {when(d.get('startedAt'))}"
           + (f" from {d['fromVersion']}" if d.get("fromVersion") else "")]  # fmt: skip
    for key, label in (
        ("markersCompleteAt", "markers complete"),
        ("verifierRequestedAt", "verifier requested"),
        ("blockedSince", "blocked since"),
        ("verifiedAt", "verified safe"),
    ):
        if d.get(key):
            out.append(f"{' ' * len(out[0].split('started')[0])}{label} {when(d[key])}")
    rows = [
        [entry.get("pod"), s.get("store"), s.get("lastBatchedLedger")]
        for entry in d.get("rolledOver") or []
        for s in entry.get("stores") or [{"store": "(no stores)", "lastBatchedLedger": "-"}]
    ]
    if rows:
        out.extend(table(["POD", "STORE", "LAST BATCHED LEDGER"], rows, INDENT * 2))
    return out


def _verifier(status: Obj) -> list[str]:
    report = status.get("lastVerifierReport")
    if not isinstance(report, Mapping):
        return []
    verdict = "safe" if report.get("safe") else "NOT SAFE"
    out = [f"{INDENT}Verifier:    last report {when(report.get('generatedAt'))}: {verdict}"]
    rows = [[s.get("pod"), s.get("store"), s.get("reason", "")] for s in report.get("stores") or []]
    if rows:
        out.extend(table(["POD", "STORE", "WHY NOT SAFE"], rows, INDENT * 2))
    return out


def _offload_audit(status: Obj) -> list[str]:
    audit = status.get("offloadAudit")
    if not isinstance(audit, Mapping):
        return []
    verdict = "ok" if audit.get("ok") else f"{audit.get('findingCount', 0)} finding(s)"
    counts = ", ".join(
        f"{k} {audit[k]}" for k in ("pods", "segments", "segmentsChecked", "objects") if k in audit
    )
    out = [
        f"{INDENT}Offload audit: {when(audit.get('generatedAt'))}: {verdict}"
        + (f" ({counts})" if counts else "")
    ]
    if audit.get("error"):
        out.append(f"{INDENT * 2}error: {audit['error']}")
    if audit.get("stale"):
        out.append(f"{INDENT * 2}stale: {audit['stale']}")
    rows = [
        [f.get("kind"), f.get("pod", ""), f.get("store", ""), f.get("detail", "")]
        for f in audit.get("findings") or []
    ]
    if rows:
        out.extend(table(["FINDING", "POD", "STORE", "DETAIL"], rows, INDENT * 2))
    return out


def _placement(status: Obj) -> list[str]:
    """``status.placement`` (shards or coordinator ids per pod, moves), from operators that write it."""
    p = status.get("placement")
    if not isinstance(p, Mapping):
        return []
    head = ", ".join(
        f"{label} {p[key]}"
        for key, label in (("kind", "kind"), ("epoch", "epoch"), ("shards", "shards"))
        if p.get(key) is not None
    )
    out = [f"{INDENT}Placement:   {p.get('phase', '?')}" + (f" ({head})" if head else "")]
    for key in ("message", "rebalance"):
        if p.get(key):
            out.append(f"{INDENT * 2}{key}: {p[key]}")
    rows = [
        [
            e.get("pod"),
            e.get("count", len(e.get("owned") or [])),
            ",".join(str(u) for u in e.get("owned") or []),
        ]
        for e in p.get("pods") or []
    ]
    if rows:
        out.extend(table(["POD", "OWNS", "UNITS"], rows, INDENT * 2))
    moves = [
        [m.get("id"), m.get("unit"), m.get("source"), m.get("target"), m.get("phase", "failed"),
         m.get("error", "")]
        for m in [*(p.get("moves") or []), *(p.get("failedMoves") or [])]
    ]  # fmt: skip
    if moves:
        out.extend(table(["MOVE", "UNIT", "FROM", "TO", "STEP", "ERROR"], moves, INDENT * 2))
    return out


def status_text(obj: Obj) -> str:
    """The status of one resource, as a block of lines."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    lines = [f"{obj.get('kind', '?')} {meta.get('namespace', '')}/{meta.get('name', '?')}"]
    paused = str((meta.get("annotations") or {}).get(naming.PAUSE_ANNOTATION, "")).lower() == "true"
    if paused:
        lines.append(
            f"{INDENT}Paused:      yes ({naming.PAUSE_ANNOTATION}=true: the operator changes nothing)"
        )
    if not status:
        lines.append(f"{INDENT}Status:      none yet (the operator has not reconciled it: is it running?)")
        return "\n".join(lines)
    reason = status.get("phaseReason")
    lines.append(f"{INDENT}Phase:       {status.get('phase', '-')}" + (f" ({reason})" if reason else ""))
    spec_version = (obj.get("spec") or {}).get("version")
    if spec_version:
        lines.append(f"{INDENT}Desired:     {spec_version} (format level {level_of(str(spec_version))})")
    lines.append(f"{INDENT}Running:     {_versions(status)}")
    lines.append(
        f"{INDENT}Replicas:    {status.get('readyReplicas', 0)}/{status.get('replicas', 0)} ready;"
        f" batch log {status.get('batchLog', '-')}"
    )
    action = status.get("lastAction")
    if isinstance(action, Mapping):
        lines.append(f"{INDENT}Last action: {action.get('action', '')} at {when(action.get('time'))}")
    for section in (_conditions, _pods, _downgrade, _verifier, _offload_audit, _placement):
        lines.extend(section(status))
    return "\n".join(lines)


def _event_time(event: Obj) -> str:
    meta = event.get("metadata") or {}
    for raw in (event.get("firstTimestamp"), event.get("eventTime"), event.get("lastTimestamp"),
                meta.get("creationTimestamp")):  # fmt: skip
        if raw:
            return when(raw)
    return "-"


def history_text(obj: Obj, events: Sequence[Obj]) -> str:
    """The resource's Events (the operator's handler log lines left out), oldest first, then its
    status.lastAction."""
    meta = obj.get("metadata") or {}
    title = f"{obj.get('kind', '?')} {meta.get('namespace', '')}/{meta.get('name', '?')}"
    steps = [e for e in events if e.get("reason") != LOG_LINE_REASON]
    ordered = sorted(steps, key=lambda e: (_event_time(e), str((e.get("metadata") or {}).get("name", ""))))
    lines = [title]
    if ordered:
        rows = [
            [
                _event_time(e),
                e.get("type", ""),
                e.get("reason", ""),
                e.get("count") or 1,
                e.get("message", ""),
            ]
            for e in ordered
        ]
        lines.extend(table(["TIME", "TYPE", "REASON", "COUNT", "MESSAGE"], rows, INDENT))
    else:
        lines.append(
            f"{INDENT}No events (the API server keeps Events for an hour by default; older rollouts are gone)"
        )
    action = (obj.get("status") or {}).get("lastAction")
    if isinstance(action, Mapping):
        lines.append(f"{INDENT}Last action: {action.get('action', '')} at {when(action.get('time'))}")
    return "\n".join(lines)
