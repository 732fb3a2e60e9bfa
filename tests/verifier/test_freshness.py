"""The staleness rule: a report counts only for the markers it was computed against."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from txnkeeper.contract.freshness import staleness
from txnkeeper.verifier import report_is_fresh, staleness_reason
from txnkeeper.verifier.decide import finalize, judge_document
from txnkeeper.verifier.model import PodEndpoint, Report, RolloverMarkers
from txnkeeper.verifier.synthetic import pod_document, store_entry

T0 = datetime(2026, 11, 21, 20, 0, tzinfo=UTC)


def report_for(markers: RolloverMarkers, generated_at: datetime) -> Report:
    endpoint = PodEndpoint(pod="tc-0", url="http://10.0.0.1:8080")
    outcome, verdicts = judge_document(
        endpoint, pod_document("tc-0", [store_entry("log0", [8])]), {"log0": 7}
    )
    return finalize(generated_at, markers, [outcome], verdicts)


def test_report_is_fresh_for_its_own_markers_as_objects_and_documents() -> None:
    markers = RolloverMarkers(taken_at=T0, ledgers={"log0": 7})
    report = report_for(markers, T0 + timedelta(seconds=5))
    assert report_is_fresh(report, markers)
    assert report_is_fresh(report.to_dict(), markers.to_dict())
    assert Report.from_dict(report.to_dict()) == report


def test_report_against_earlier_markers_is_stale() -> None:
    old = RolloverMarkers(taken_at=T0, ledgers={"log0": 7})
    report = report_for(old, T0 + timedelta(seconds=5))
    new = RolloverMarkers(taken_at=T0 + timedelta(minutes=1), ledgers={"log0": 9})
    reason = staleness_reason(report, new)
    assert reason is not None and "computed against markers taken at 2026-11-21T20:00:00" in reason
    assert not report_is_fresh(report, new)


def test_same_instant_but_different_ledgers_is_stale() -> None:
    report = report_for(RolloverMarkers(taken_at=T0, ledgers={"log0": 7}), T0 + timedelta(seconds=5))
    other = RolloverMarkers(taken_at=T0, ledgers={"log0": 8})
    assert (
        staleness_reason(report, other) == "report was computed against different LastBatchedLedger markers"
    )


def test_collection_before_markers_is_stale() -> None:
    markers = RolloverMarkers(taken_at=T0, ledgers={"log0": 7})
    report = report_for(markers, T0 - timedelta(seconds=1))
    reason = staleness_reason(report, markers)
    assert reason is not None and "before the markers were taken" in reason


def test_max_age() -> None:
    markers = RolloverMarkers(taken_at=T0, ledgers={"log0": 7})
    report = report_for(markers, T0 + timedelta(seconds=5))
    later = T0 + timedelta(minutes=30)
    assert report_is_fresh(report, markers, now=later, max_age=timedelta(hours=1))
    assert not report_is_fresh(report, markers, now=later, max_age=timedelta(minutes=10))


def test_timestamps_compare_as_instants_not_strings() -> None:
    markers = RolloverMarkers(taken_at=T0, ledgers={"log0": 7})
    document = report_for(markers, T0 + timedelta(seconds=5)).to_dict()
    markers_doc = {"takenAt": "2026-11-21T22:00:00+02:00", "stores": {"log0": 7}}
    assert report_is_fresh(document, markers_doc)


def test_garbage_is_never_fresh() -> None:
    markers = {"takenAt": "2026-11-21T20:00:00Z", "stores": {"log0": 7}}
    assert staleness_reason({"kind": "Other"}, markers) == "not a VerifierReport document"
    assert not report_is_fresh({"kind": "VerifierReport"}, markers)
    assert not report_is_fresh({"kind": "VerifierReport", "markersTakenAt": "x"}, {"takenAt": "yesterday"})


def test_the_typed_rule_the_engine_uses_is_the_document_rule() -> None:
    """contract.freshness.staleness (the operator's entry point) refuses exactly what documents refuse."""
    markers = {"log0": 7}
    fresh = staleness(
        markers_taken_at=T0,
        markers=markers,
        report_markers_taken_at=T0,
        report_markers=markers,
        generated_at=T0 + timedelta(seconds=5),
    )
    assert fresh is None
    no_taken_at = staleness(
        markers_taken_at=T0,
        markers=markers,
        report_markers_taken_at=None,
        report_markers=markers,
        generated_at=T0 + timedelta(seconds=5),
    )
    assert no_taken_at == "report does not say which rollover markers it was computed against"
    superset = staleness(
        markers_taken_at=T0,
        markers=markers,
        report_markers_taken_at=T0,
        report_markers={**markers, "log1": 3},
        generated_at=T0 + timedelta(seconds=5),
    )
    assert superset == "report was computed against different LastBatchedLedger markers"
    report = report_for(RolloverMarkers(taken_at=T0, ledgers=markers), T0 + timedelta(seconds=5)).to_dict()
    del report["markersTakenAt"]
    assert staleness_reason(report, {"takenAt": "2026-11-21T20:00:00Z", "stores": markers}) == no_taken_at
