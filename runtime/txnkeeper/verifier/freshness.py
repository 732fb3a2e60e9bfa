"""Whether a verifier report may be trusted for a given set of rollover markers (contracts §7).

A report proves something only about the markers it was computed against and only about data fetched
after those markers were taken; anything else is stale and must never unlock a downgrade. This module
works on the plain JSON documents and imports nothing from txnkeeper, so the operator (which never
imports the runtime) can use the same rule, or copy it verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any


def _instant(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return None if moment.tzinfo is None else moment.astimezone(UTC)


def staleness_reason(
    report: Mapping[str, Any],
    markers: Mapping[str, Any],
    *,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> str | None:
    """None when `report` is fresh for `markers`; otherwise why it must not be accepted.

    `report` is a VerifierReport document, `markers` a RolloverMarkers document
    (`{"takenAt": RFC3339, "stores": {name: lastBatchedLedger}}`).
    """
    if report.get("kind") != "VerifierReport":
        return "not a VerifierReport document"
    taken_at = _instant(markers.get("takenAt"))
    if taken_at is None:
        return "rollover markers carry no valid takenAt"
    report_markers_at = _instant(report.get("markersTakenAt"))
    if report_markers_at is None:
        return "report does not say which rollover markers it was computed against"
    if report_markers_at != taken_at:
        return (
            f"report was computed against markers taken at {report.get('markersTakenAt')}, "
            f"current markers were taken at {markers.get('takenAt')}"
        )
    expected = markers.get("stores")
    if not isinstance(expected, Mapping) or dict(expected) != dict(report.get("markers") or {}):
        return "report was computed against different LastBatchedLedger markers"
    generated_at = _instant(report.get("generatedAt"))
    if generated_at is None:
        return "report has no valid generatedAt"
    if generated_at < taken_at:
        return (
            f"report collection began at {report.get('generatedAt')}, before the markers were taken "
            f"at {markers.get('takenAt')}"
        )
    if max_age is not None:
        current = now if now is not None else datetime.now(UTC)
        if current - generated_at > max_age:
            return f"report generated at {report.get('generatedAt')} is older than {max_age}"
    return None


def report_is_fresh(
    report: Mapping[str, Any],
    markers: Mapping[str, Any],
    *,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> bool:
    """True only when the report was computed against exactly these markers, after they were taken."""
    return staleness_reason(report, markers, now=now, max_age=max_age) is None
