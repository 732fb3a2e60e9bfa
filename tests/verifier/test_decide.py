"""The pure decision rules: document validation, per-store verdicts, the overall verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnkeeper.verifier.decide import (
    MalformedDocument,
    finalize,
    judge_document,
    judge_failure,
    judge_store,
    parse_store,
)
from txnkeeper.verifier.model import PodEndpoint, RolloverMarkers
from txnkeeper.verifier.synthetic import pod_document, store_entry

T0 = datetime(2026, 11, 21, 20, 0, tzinfo=UTC)
POD = PodEndpoint(pod="tc-0", url="http://10.0.0.1:8080")


def markers(**ledgers: int) -> RolloverMarkers:
    return RolloverMarkers(taken_at=T0, ledgers=ledgers)


def test_store_past_marker_without_batched_entries_is_safe() -> None:
    verdict = judge_store("tc-0", parse_store(store_entry("log0", [8, 9])), 7)
    assert verdict.safe
    assert verdict.oldest_live_ledger == 8
    assert "oldest ledger 8 > LastBatchedLedger 7" in verdict.reason


def test_oldest_ledger_equal_to_marker_is_not_safe() -> None:
    verdict = judge_store("tc-0", parse_store(store_entry("log0", [7, 8])), 7)
    assert not verdict.safe
    assert "oldest ledger 7 <= LastBatchedLedger 7" in verdict.reason


def test_live_batched_entry_blocks_even_when_ledgers_are_past_the_marker() -> None:
    entry = store_entry("log0", [9, 10], batched=2, positions=["9:3", "9:4"])
    verdict = judge_store("tc-0", parse_store(entry), 7)
    assert not verdict.safe
    assert verdict.oldest_live_ledger is not None and verdict.oldest_live_ledger > 7
    assert "2 live entries carry the batched magic (at 9:3, 9:4)" in verdict.reason


def test_oldest_existing_ledger_counts_not_the_oldest_with_live_data() -> None:
    entry = store_entry("log0", [3, 8, 9])
    entry["oldestLiveLedger"] = 8  # a pod may report the oldest ledger holding live entries
    verdict = judge_store("tc-0", parse_store(entry), 7)
    assert not verdict.safe
    assert "oldest ledger 3 <= LastBatchedLedger 7" in verdict.reason


def test_store_without_marker_is_not_safe() -> None:
    verdict = judge_store("tc-0", parse_store(store_entry("log0", [8])), None)
    assert not verdict.safe
    assert "no rollover marker" in verdict.reason


def test_store_without_ledgers_is_safe_when_nothing_is_live() -> None:
    verdict = judge_store("tc-0", parse_store(store_entry("log0", [], unbatched=0)), 7)
    assert verdict.safe
    assert "no ledgers" in verdict.reason


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.pop("name"), "no name"),
        (lambda e: e.update(kind="topic"), "kind must be one of"),
        (lambda e: e.update(ledgers="8,9"), "ledgers must be a list"),
        (lambda e: e.update(ledgers=[8, -1]), "ledgers[] must be a non-negative integer"),
        (lambda e: e.update(ledgers=[8, True]), "ledgers[] must be a non-negative integer"),
        (lambda e: e.pop("oldestLiveLedger"), "oldestLiveLedger is missing"),
        (lambda e: e.update(oldestLiveLedger=4), "oldestLiveLedger 4 is not among the ledgers"),
        (lambda e: e.pop("currentLedger"), "currentLedger must be"),
        (lambda e: e.pop("liveEntries"), "liveEntries must be an object"),
        (lambda e: e.update(liveEntries={"batched": "none", "unbatched": 1}), "liveEntries.batched"),
        (lambda e: e.update(liveEntries={"batched": 0}), "liveEntries.unbatched"),
        (lambda e: e.update(liveBatchedPositions=[9]), "liveBatchedPositions must be a list"),
        (lambda e: e.update(liveBatchedPositions=["9:1"]), "but liveEntries.batched is 0"),
    ],
)
def test_malformed_store_entries_are_rejected(mutate: Any, message: str) -> None:
    entry = store_entry("log0", [8, 9])
    mutate(entry)
    with pytest.raises(MalformedDocument, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_store(entry)


def test_malformed_named_entry_fails_only_that_store() -> None:
    bad = store_entry("log1", [8])
    bad["liveEntries"] = {"batched": -1, "unbatched": 0}
    document = pod_document("tc-0", [store_entry("log0", [8]), bad])
    outcome, verdicts = judge_document(POD, document, {"log0": 7, "log1": 7})
    assert outcome.ok
    by_name = {verdict.store: verdict for verdict in verdicts}
    assert by_name["log0"].safe
    assert not by_name["log1"].safe
    assert "malformed store entry from pod tc-0" in by_name["log1"].reason


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([1, 2], "expected a JSON object, got list"),
        ({"pod": "tc-0"}, "'stores' must be a list"),
        ({"pod": 3, "stores": []}, "pod must be a string"),
        ({"pod": "tc-1", "stores": []}, "answered as pod 'tc-1', not 'tc-0'"),
        ({"pod": "tc-0", "stores": [{"kind": "txnlog"}]}, "stores[0]: store entry has no name"),
    ],
)
def test_broken_documents_fail_the_whole_pod(document: object, message: str) -> None:
    outcome, verdicts = judge_document(POD, document, {"log0": 7})
    assert not outcome.ok
    assert verdicts == []
    assert outcome.error is not None and message in outcome.error


def test_duplicate_store_in_one_document_is_not_safe() -> None:
    document = pod_document("tc-0", [store_entry("log0", [8]), store_entry("log0", [9])])
    _, verdicts = judge_document(POD, document, {"log0": 7})
    assert [verdict.safe for verdict in verdicts] == [True, False]
    assert "reported twice" in verdicts[1].reason


def test_unnamed_endpoint_takes_the_documents_pod_name() -> None:
    endpoint = PodEndpoint(pod=None, url="http://10.0.0.9:8080")
    outcome, verdicts = judge_document(endpoint, pod_document("store-4", [store_entry("s", [8])]), {"s": 1})
    assert outcome.pod == "store-4"
    assert verdicts[0].pod == "store-4"


def test_finalize_all_safe() -> None:
    outcome, verdicts = judge_document(POD, pod_document("tc-0", [store_entry("log0", [8])]), {"log0": 7})
    report = finalize(T0 + timedelta(seconds=1), markers(log0=7), [outcome], verdicts)
    assert report.safe
    assert report.reason.startswith("safe: all 1 stores on 1 pods")


def test_finalize_names_missing_stores_and_failed_pods() -> None:
    ok, verdicts = judge_document(POD, pod_document("tc-0", [store_entry("log0", [8])]), {"log0": 7})
    dead, _ = judge_failure(PodEndpoint(pod="tc-1", url="http://10.0.0.2:8080"), "unreachable: refused")
    report = finalize(T0 + timedelta(seconds=1), markers(log0=7, log1=7), [ok, dead], verdicts)
    assert not report.safe
    missing = [verdict for verdict in report.stores if verdict.store == "log1"]
    assert len(missing) == 1 and missing[0].pod is None
    assert "not reported by any pod" in missing[0].reason
    assert "tc-1: unreachable: refused" in missing[0].reason
    assert "1 of 2 pods could not be checked" in report.reason
    assert "log1@?" in report.reason
    # Blocking stores sort first so a truncated view still shows them.
    assert not report.stores[0].safe


def test_finalize_rejects_collection_before_markers() -> None:
    outcome, verdicts = judge_document(POD, pod_document("tc-0", [store_entry("log0", [8])]), {"log0": 7})
    report = finalize(T0 - timedelta(seconds=1), markers(log0=7), [outcome], verdicts)
    assert not report.safe
    assert "collection began before the rollover markers were taken" in report.reason


def test_finalize_with_nothing_checked_is_not_safe() -> None:
    report = finalize(T0, RolloverMarkers(taken_at=T0), [], [])
    assert not report.safe
    assert "no pods were checked" in report.reason


store_states = st.fixed_dictionaries(
    {
        "ledgers": st.lists(st.integers(0, 30), max_size=5, unique=True).map(sorted),
        "batched": st.integers(0, 3),
        "marker": st.one_of(st.none(), st.integers(0, 30)),
    }
)


@settings(deadline=None)  # the machine is shared; a per-example time limit would only add flakiness
@given(st.lists(store_states, min_size=1, max_size=8))
def test_overall_safe_iff_every_store_meets_both_conditions(states: list[dict[str, Any]]) -> None:
    stores = [
        store_entry(f"s{i}", state["ledgers"], batched=state["batched"]) for i, state in enumerate(states)
    ]
    marks = {f"s{i}": state["marker"] for i, state in enumerate(states) if state["marker"] is not None}
    outcome, verdicts = judge_document(POD, pod_document("tc-0", stores), marks)
    report = finalize(T0, RolloverMarkers(taken_at=T0, ledgers=marks), [outcome], verdicts)
    expected = all(
        state["marker"] is not None
        and state["batched"] == 0
        and (not state["ledgers"] or min(state["ledgers"]) > state["marker"])
        for state in states
    )
    assert report.safe is expected
    assert len(report.stores) == len(states)


@pytest.mark.parametrize(
    "offload", [[], {"tierOnlyLedgers": -1, "maxMetadataVersion": 1}, {"tierOnlyLedgers": 0}]
)
def test_a_malformed_offload_state_fails_the_pod(offload: Any) -> None:
    document = pod_document("tc-0", [store_entry("log0", [8, 9])])
    document["offload"] = offload
    outcome, _ = judge_document(POD, document, {"log0": 7})
    assert not outcome.ok and outcome.error is not None and "offload" in outcome.error
