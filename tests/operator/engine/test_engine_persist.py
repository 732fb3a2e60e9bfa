"""The engine's persisted memory (lossless and strict) and its view of the shared release table."""

from __future__ import annotations

from datetime import timedelta

import pytest

from txnkeeper.contract.formats import UnknownReleaseError, format_level
from txnkeeper_operator.engine import DowngradeProgress, Progress, StoreVerdict, VerifierReport
from txnkeeper_operator.engine.persist import (
    MalformedReportError,
    progress_from_status,
    progress_to_status,
    report_from_json,
    report_to_json,
)

from .opsim import T0


@pytest.mark.parametrize("release", ["9.0.0", "2.0", "latest", ""])
def test_unknown_releases_are_rejected(release: str) -> None:
    with pytest.raises(UnknownReleaseError):
        format_level(release)


def test_progress_round_trips_through_status() -> None:
    progress = Progress(
        DowngradeProgress(
            started_at=T0,
            markers={"tc-0": {"__transaction_log_0": 7}, "tc-1": {}},
            markers_complete_at=T0 + timedelta(seconds=1, microseconds=5),
            verifier_requested_at=T0 + timedelta(seconds=2),
            blocked_since=T0 + timedelta(seconds=3),
            verified_at=None,
        )
    )
    status = progress_to_status(progress)
    assert status is not None and status["rolledOver"][1] == {"pod": "tc-1", "stores": []}
    assert progress_from_status(status) == progress
    assert progress_to_status(Progress()) is None
    assert progress_from_status(None) == Progress()


def test_report_parsing_is_strict_and_distrusts_contradictions() -> None:
    report = VerifierReport(T0, {"s": 3}, True, (StoreVerdict("tc-0", "s", True, "ok"),))
    assert report_from_json(report_to_json(report)) == report
    # A newer verifier's fields (contracts §7: "executors", where its tasks ran) are accepted and ignored.
    executors = [{"executor": "0", "host": "10.0.0.7", "tasks": 3}]
    assert report_from_json({**report_to_json(report), "executors": executors}) == report
    doc = report_to_json(report)
    doc["stores"][0]["safe"] = False
    assert report_from_json(doc).safe is False
    for broken in ({}, {**doc, "safe": "yes"}, {**doc, "markers": {"s": "x"}}, {**doc, "generatedAt": 5}):
        with pytest.raises(MalformedReportError):
            report_from_json(broken)
