"""The verifier end to end on real Spark (local[2]) against real HTTP endpoints (synthetic pods)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from txnkeeper.verifier import RolloverMarkers, VerifierInputError, report_is_fresh, staleness_reason, verify
from txnkeeper.verifier.model import PodEndpoint, Report
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry

pytestmark = pytest.mark.spark

LAST_BATCHED = 7


def txnlog(coordinator: int, ledgers: list[int] | None = None, **kwargs: Any) -> dict[str, Any]:
    return store_entry(f"__transaction_log_{coordinator}", ledgers or [8, 9], **kwargs)


def pending_ack(topic: int, ledgers: list[int] | None = None, **kwargs: Any) -> dict[str, Any]:
    name = f"persistent://public/default/orders-{topic}-billing__transaction_pending_ack"
    return store_entry(name, ledgers or [8, 9], kind="pendingack", **kwargs)


def fleet(pods: SyntheticPods, layout: dict[str, list[dict[str, Any]]]) -> list[PodEndpoint]:
    return [
        pods.add_pod(name, PodAnswer.document(pod_document(name, stores))) for name, stores in layout.items()
    ]


def markers_for(
    *layouts: dict[str, list[dict[str, Any]]], taken_at: datetime | None = None
) -> RolloverMarkers:
    names = [store["name"] for layout in layouts for stores in layout.values() for store in stores]
    when = taken_at if taken_at is not None else datetime.now(UTC) - timedelta(seconds=1)
    return RolloverMarkers(taken_at=when, ledgers=dict.fromkeys(names, LAST_BATCHED))


def healthy_layout() -> dict[str, list[dict[str, Any]]]:
    return {
        "tc-0": [txnlog(0), txnlog(1)],
        "tc-1": [txnlog(2), txnlog(3)],
        "store-0": [pending_ack(0), pending_ack(1)],
        "store-1": [pending_ack(2), pending_ack(3, ledgers=[12])],
    }


def verdict(report: Report, store: str) -> Any:
    [found] = [row for row in report.stores if row.store == store]
    return found


def test_all_invalidated_is_safe(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    markers = markers_for(layout)
    report = verify(fleet(pods, layout), markers, spark=spark)
    assert report.safe, report.reason
    assert len(report.stores) == 8 and all(row.safe for row in report.stores)
    assert [outcome.ok for outcome in report.pods] == [True] * 4
    assert verdict(report, "__transaction_log_2").reason == (
        "oldest ledger 8 > LastBatchedLedger 7; no live batched entries"
    )
    assert verdict(report, pending_ack(3)["name"]).oldest_live_ledger == 12
    assert report_is_fresh(report, markers)
    # Local mode: the driver's JVM is the one executor, one task per partition (4 pods, 2 cores x 2).
    assert [(row.executor, row.tasks) for row in report.executors] == [("driver", 4)]


def test_batched_entry_behind_a_newer_oldest_ledger_is_caught_by_the_data_scan(
    spark: Any, pods: SyntheticPods
) -> None:
    layout = healthy_layout()
    sneaky = pending_ack(1, ledgers=[10, 11], batched=2, positions=["10:4", "10:5"])
    layout["store-0"][1] = sneaky
    report = verify(fleet(pods, layout), markers_for(layout), spark=spark)
    assert not report.safe
    blocked = report.blocking()
    assert [row.store for row in blocked] == [sneaky["name"]]
    row = blocked[0]
    # PIP-160's ledger-id check alone would have passed this store:
    assert row.oldest_live_ledger == 10 and row.last_batched_ledger == LAST_BATCHED < 10
    assert row.live_batched_entries == 2
    assert "2 live entries carry the batched magic (at 10:4, 10:5)" in row.reason
    assert f"1 of 8 stores not safe: {sneaky['name']}@store-0" in report.reason


def test_ledgers_not_yet_trimmed_are_not_safe(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    layout["tc-1"][0] = txnlog(2, ledgers=[6, 7, 8])
    report = verify(fleet(pods, layout), markers_for(layout), spark=spark)
    assert not report.safe
    row = verdict(report, "__transaction_log_2")
    assert not row.safe and "oldest ledger 6 <= LastBatchedLedger 7" in row.reason


def test_unreachable_and_silent_pods_are_not_safe(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    endpoints = fleet(
        pods, {name: stores for name, stores in layout.items() if name not in ("tc-1", "store-1")}
    )
    endpoints.append(pods.dead_endpoint("tc-1"))
    endpoints.append(pods.add_pod("store-1", PodAnswer.hanging()))
    report = verify(endpoints, markers_for(layout), spark=spark, timeout_s=1.0)
    assert not report.safe
    failed = {outcome.pod: outcome.error or "" for outcome in report.pods if not outcome.ok}
    assert set(failed) == {"tc-1", "store-1"}
    assert "Connection refused" in failed["tc-1"]
    assert "timed out after 1 s" in failed["store-1"]
    # The stores those pods hold are named as missing, with the pods that could not be checked.
    missing = [row for row in report.stores if row.pod is None]
    assert {row.store for row in missing} == {
        "__transaction_log_2",
        "__transaction_log_3",
        pending_ack(2)["name"],
        pending_ack(3)["name"],
    }
    assert all(
        "not reported by any pod" in row.reason and "tc-1: unreachable" in row.reason for row in missing
    )
    assert "2 of 4 pods could not be checked" in report.reason


def test_malformed_documents_are_not_safe_and_named(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    broken_store = txnlog(3)
    broken_store["liveEntries"] = {"batched": "unknown", "unbatched": 3}
    layout["tc-1"][1] = broken_store
    endpoints = fleet(pods, {name: layout[name] for name in ("tc-0", "tc-1")})
    endpoints.append(pods.add_pod("store-0", PodAnswer.raw(b"stores: [oops")))
    endpoints.append(pods.add_pod("store-1", PodAnswer.document({"pod": "store-1", "stores": "none"})))
    endpoints.append(pods.add_pod("store-2", PodAnswer.document({"error": "scan failed: EIO"}, status=500)))
    report = verify(endpoints, markers_for(layout), spark=spark)
    assert not report.safe
    errors = {outcome.pod: outcome.error or "" for outcome in report.pods}
    assert errors["store-0"].startswith("malformed document: not JSON")
    assert errors["store-1"] == "malformed document: 'stores' must be a list"
    assert errors["store-2"].startswith("HTTP 500") and "scan failed: EIO" in errors["store-2"]
    row = verdict(report, "__transaction_log_3")
    assert row.pod == "tc-1" and "liveEntries.batched must be a non-negative integer" in row.reason
    assert verdict(report, "__transaction_log_2").safe


def test_missing_store_and_unmarked_store(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    markers = markers_for(layout)
    markers = RolloverMarkers(markers.taken_at, {**markers.ledgers, "__transaction_log_9": 7})
    layout["tc-0"].append(txnlog(4))
    report = verify(fleet(pods, layout), markers, spark=spark)
    assert not report.safe
    assert (
        "expected by the rollover markers but not reported" in verdict(report, "__transaction_log_9").reason
    )
    assert "no rollover marker" in verdict(report, "__transaction_log_4").reason
    assert len(report.blocking()) == 2


def test_stale_reports_are_never_accepted(spark: Any, pods: SyntheticPods) -> None:
    layout = healthy_layout()
    endpoints = fleet(pods, layout)
    first = markers_for(layout)
    report = verify(endpoints, first, spark=spark)
    assert report.safe and report_is_fresh(report, first)
    # The operator rolls the stores over again: new markers, so the safe report no longer counts.
    second = RolloverMarkers(datetime.now(UTC), dict.fromkeys(first.ledgers, 9))
    reason = staleness_reason(report.to_dict(), second.to_dict())
    assert reason is not None and "computed against markers taken at" in reason
    assert not report_is_fresh(report, second)
    # Markers stamped after collection began (skewed clock): the report is not safe and not fresh.
    future = RolloverMarkers(datetime.now(UTC) + timedelta(hours=1), first.ledgers)
    skewed = verify(endpoints, future, spark=spark)
    assert not skewed.safe and "collection began before the rollover markers" in skewed.reason
    assert not report_is_fresh(skewed, future)


def test_thousands_of_stores(spark: Any, pods: SyntheticPods) -> None:
    pod_count, per_pod = 30, 100
    layout = {
        f"store-{p}": [pending_ack(p * per_pod + s, ledgers=[8 + s % 3, 20]) for s in range(per_pod)]
        for p in range(pod_count)
    }
    chooser = random.Random(6)
    bad = {chooser.randrange(pod_count * per_pod) for _ in range(3)}
    for index in bad:
        layout[f"store-{index // per_pod}"][index % per_pod]["liveEntries"]["batched"] = 1
    report = verify(fleet(pods, layout), markers_for(layout), spark=spark)
    assert len(report.stores) == pod_count * per_pod
    assert {row.store for row in report.blocking()} == {pending_ack(index)["name"] for index in bad}
    assert not report.safe and f"{len(bad)} of {pod_count * per_pod} stores not safe" in report.reason


def test_nothing_to_check_is_an_input_error(spark: Any) -> None:
    markers = RolloverMarkers(datetime.now(UTC), {"log0": 7})
    with pytest.raises(VerifierInputError, match="no pod endpoints"):
        verify([], markers, spark=spark)


def test_pods_without_stores_are_safe_only_when_every_pod_answers(spark: Any, pods: SyntheticPods) -> None:
    # A PendingAckStore with no subscription yet: the rollover marked nothing, the pods report nothing.
    markers = RolloverMarkers(datetime.now(UTC) - timedelta(seconds=1))
    empty = fleet(pods, {"store-0": [], "store-1": []})
    report = verify(empty, markers, spark=spark)
    assert report.safe and "host no store" in report.reason
    unreachable = [*empty, PodEndpoint("store-2", "http://127.0.0.1:1")]
    report = verify(unreachable, markers, spark=spark, timeout_s=2.0)
    assert not report.safe and "store-2" in report.reason
    grown = fleet(pods, {"store-3": [pending_ack(0)]})
    report = verify([*empty, *grown], markers, spark=spark)
    assert not report.safe and verdict(report, pending_ack(0)["name"]).safe is False


def test_offloaded_data_on_any_pod_holds_the_downgrade(spark: Any, pods: SyntheticPods) -> None:
    """A pod whose ledgers document reports tier-only ledgers or metadata version 2 makes the report
    not safe, naming it, even when every store's batched data is invalidated; pods of releases that
    report no offload state (older ones) and clean pods are fine."""
    layout = healthy_layout()
    documents = {name: pod_document(name, stores) for name, stores in layout.items()}
    documents["store-0"]["offload"] = {"tierOnlyLedgers": 2, "maxMetadataVersion": 2}
    documents["store-1"]["offload"] = {"tierOnlyLedgers": 0, "maxMetadataVersion": 1}
    endpoints = [pods.add_pod(name, PodAnswer.document(doc)) for name, doc in documents.items()]
    report = verify(endpoints, markers_for(layout), spark=spark)
    assert not report.safe
    assert "1 pod(s) hold offloaded data" in report.reason
    assert "store-0: 2 tier-only ledger(s), metadata version 2" in report.reason
    by_pod = {row["pod"]: row for row in report.to_dict()["pods"]}
    assert by_pod["store-0"]["tierOnlyLedgers"] == 2 and by_pod["store-0"]["maxMetadataVersion"] == 2
    assert by_pod["tc-0"]["tierOnlyLedgers"] is None
    assert all(row.safe for row in report.stores)

    documents["store-0"]["offload"] = {"tierOnlyLedgers": 0, "maxMetadataVersion": 1}
    endpoints = [pods.add_pod(name, PodAnswer.document(doc)) for name, doc in documents.items()]
    assert verify(endpoints, markers_for(layout), spark=spark).safe
