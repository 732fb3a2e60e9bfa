"""Progress <-> the resource's ``status.downgrade`` block, and the verifier report's JSON form.

The engine's only memory between decisions is what this module writes into the custom resource's status
(and what the local fleet writes to its state file), so the round trip must be lossless: an operator
restart is exactly "decode what was persisted and decide again". Pure functions on JSON-able values.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from txnkeeper.contract.names import API_VERSION
from txnkeeper_operator.engine.model import DowngradeProgress, Progress, StoreVerdict, VerifierReport


class MalformedReportError(ValueError):
    """A verifier report that does not have the shape of docs/contracts.md §7."""


def format_time(moment: datetime) -> str:
    """RFC 3339 with microseconds, so ordering survives the round trip."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def _opt_time(value: Any) -> datetime | None:
    return parse_time(value) if isinstance(value, str) and value else None


def progress_to_status(progress: Progress) -> dict[str, Any] | None:
    """The ``status.downgrade`` value (None when no downgrade is under way)."""
    d = progress.downgrade
    if d is None:
        return None
    out: dict[str, Any] = {
        "startedAt": format_time(d.started_at),
        **({"fromVersion": d.from_version} if d.from_version else {}),
        "rolledOver": [
            {
                "pod": pod,
                "stores": [
                    {"store": store, "lastBatchedLedger": ledger} for store, ledger in sorted(stores.items())
                ],
            }
            for pod, stores in sorted(d.markers.items())
        ],
    }
    for key, moment in (
        ("markersCompleteAt", d.markers_complete_at),
        ("verifierRequestedAt", d.verifier_requested_at),
        ("blockedSince", d.blocked_since),
        ("verifiedAt", d.verified_at),
    ):
        if moment is not None:
            out[key] = format_time(moment)
    return out


def progress_from_status(value: Mapping[str, Any] | None) -> Progress:
    """Decode ``status.downgrade``; anything unreadable restarts the downgrade from its safe start."""
    if not value or not isinstance(value.get("startedAt"), str):
        return Progress()
    markers: dict[str, dict[str, int]] = {}
    for entry in value.get("rolledOver") or []:
        stores = {s["store"]: int(s["lastBatchedLedger"]) for s in entry.get("stores") or []}
        markers[str(entry["pod"])] = stores
    return Progress(
        DowngradeProgress(
            started_at=parse_time(value["startedAt"]),
            from_version=str(value["fromVersion"]) if value.get("fromVersion") else None,
            markers=markers,
            markers_complete_at=_opt_time(value.get("markersCompleteAt")),
            verifier_requested_at=_opt_time(value.get("verifierRequestedAt")),
            blocked_since=_opt_time(value.get("blockedSince")),
            verified_at=_opt_time(value.get("verifiedAt")),
        )
    )


def report_from_json(doc: Any) -> VerifierReport:
    """Parse a verifier report (docs/contracts.md §7) strictly: a malformed one must never pass the gate."""
    if not isinstance(doc, Mapping) or doc.get("kind") != "VerifierReport":
        raise MalformedReportError("not a VerifierReport document")
    try:
        generated = parse_time(str(doc["generatedAt"]))
        markers = {str(k): int(v) for k, v in dict(doc["markers"]).items()}
        safe = doc["safe"]
        if not isinstance(safe, bool):
            raise MalformedReportError("'safe' must be a boolean")
        verdicts = tuple(
            StoreVerdict(
                pod=str(s.get("pod") or ""),  # a store no pod reported has "pod": null
                store=str(s["store"]),
                safe=bool(s["safe"]),
                reason=str(s.get("reason", "")),
            )
            for s in doc.get("stores") or []
        )
    except (KeyError, TypeError, ValueError) as err:
        raise MalformedReportError(f"malformed VerifierReport: {err}") from err
    taken_raw = doc.get("markersTakenAt")
    try:
        taken = parse_time(taken_raw) if isinstance(taken_raw, str) else None
    except ValueError as err:
        raise MalformedReportError(f"malformed markersTakenAt: {err}") from err
    # An overall "safe" contradicted by a store verdict is not believed.
    return VerifierReport(generated, markers, safe and all(v.safe for v in verdicts), verdicts, taken)


def report_to_json(report: VerifierReport) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "VerifierReport",
        "generatedAt": format_time(report.generated_at),
        "markers": dict(report.markers),
        **({"markersTakenAt": format_time(report.markers_taken_at)} if report.markers_taken_at else {}),
        "safe": report.safe,
        "stores": [
            {"pod": v.pod, "store": v.store, "safe": v.safe, "reason": v.reason} for v in report.stores
        ],
    }
