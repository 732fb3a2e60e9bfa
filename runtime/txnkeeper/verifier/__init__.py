"""The Spark verifier: proves no batched transaction-log / pending-ack entry is live before a downgrade.

Public API (what the operator's Job, the local fleet and tests call):
- `verify(endpoints, markers, master="local[*]") -> Report` (see `job.verify`);
- `PodEndpoint`, `RolloverMarkers`, `Report`, `StoreVerdict`, `PodOutcome` (see `model`);
- `report_is_fresh(report, markers)` / `staleness_reason(...)`: whether a report may be trusted for the
  current markers (accepts documents or the typed objects).
The command is `txnkeeper verify-invalidation` (see `cli`). Spark is imported only when a job runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from txnkeeper.verifier import freshness
from txnkeeper.verifier.job import verify
from txnkeeper.verifier.model import (
    PodEndpoint,
    PodOutcome,
    Report,
    RolloverMarkers,
    StoreVerdict,
    VerifierInfraError,
    VerifierInputError,
)

__all__ = [
    "PodEndpoint",
    "PodOutcome",
    "Report",
    "RolloverMarkers",
    "StoreVerdict",
    "VerifierInfraError",
    "VerifierInputError",
    "report_is_fresh",
    "staleness_reason",
    "verify",
]


def _as_document(value: Report | RolloverMarkers | Mapping[str, Any]) -> Mapping[str, Any]:
    return value.to_dict() if isinstance(value, Report | RolloverMarkers) else value


def staleness_reason(
    report: Report | Mapping[str, Any],
    markers: RolloverMarkers | Mapping[str, Any],
    *,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> str | None:
    """None when the report is fresh for these markers, else why it must not be accepted."""
    return freshness.staleness_reason(_as_document(report), _as_document(markers), now=now, max_age=max_age)


def report_is_fresh(
    report: Report | Mapping[str, Any],
    markers: RolloverMarkers | Mapping[str, Any],
    *,
    now: datetime | None = None,
    max_age: timedelta | None = None,
) -> bool:
    """True only for a report computed against exactly these markers, collected after they were taken."""
    return staleness_reason(report, markers, now=now, max_age=max_age) is None
