"""Whether a verifier report may be trusted for a given set of rollover markers (contracts §7).

A report proves something only about the markers it was computed against and only about data fetched
after those markers were taken; anything else is stale and must never unlock a downgrade. The rule lives
in the contract package (standard library only) because three parties apply it: the verifier on its
own documents, the local fleet and the operator's rollout engine on typed values (`staleness`), and
the rule must be one and the same for all of them.
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


def staleness(
    *,
    markers_taken_at: datetime | None,
    markers: Mapping[str, int],
    report_markers_taken_at: datetime | None,
    report_markers: Mapping[str, int],
    generated_at: datetime | None,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> str | None:
    """The rule on typed values: None when fresh, otherwise why the report must not be accepted.

    Fresh means: the report names the markers' takenAt (a report that does not say which markers it
    was computed against proves nothing), was computed against exactly these markers (equal, not
    merely covering them), and its collection began at or after they were taken.
    """
    if markers_taken_at is None:
        return "rollover markers carry no valid takenAt"
    if report_markers_taken_at is None:
        return "report does not say which rollover markers it was computed against"
    if report_markers_taken_at != markers_taken_at:
        return (
            f"report was computed against markers taken at {report_markers_taken_at.isoformat()}, "
            f"current markers were taken at {markers_taken_at.isoformat()}"
        )
    if dict(markers) != dict(report_markers):
        return "report was computed against different LastBatchedLedger markers"
    if generated_at is None:
        return "report has no valid generatedAt"
    if generated_at < markers_taken_at:
        return (
            f"report collection began at {generated_at.isoformat()}, before the markers were taken "
            f"at {markers_taken_at.isoformat()}"
        )
    if max_age is not None:
        current = now if now is not None else datetime.now(UTC)
        if current - generated_at > max_age:
            return f"report generated at {generated_at.isoformat()} is older than {max_age}"
    return None


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
    expected = markers.get("stores")
    if not isinstance(expected, Mapping):
        return "rollover markers carry no stores mapping"
    return staleness(
        markers_taken_at=_instant(markers.get("takenAt")),
        markers=expected,
        report_markers_taken_at=_instant(report.get("markersTakenAt")),
        report_markers=report.get("markers") or {},
        generated_at=_instant(report.get("generatedAt")),
        now=now,
        max_age=max_age,
    )


def report_is_fresh(
    report: Mapping[str, Any],
    markers: Mapping[str, Any],
    *,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> bool:
    """True only when the report was computed against exactly these markers, after they were taken."""
    return staleness_reason(report, markers, now=now, max_age=max_age) is None
