"""Fetching ledgers documents from real sockets: every failure is a named error, never an exception."""

from __future__ import annotations

from txnkeeper.verifier.fetch import fetch_all, fetch_ledgers
from txnkeeper.verifier.model import PodEndpoint
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry


def test_fetches_a_document(pods: SyntheticPods) -> None:
    document = pod_document("tc-0", [store_entry("log0", [8])])
    endpoint = pods.add_pod("tc-0", PodAnswer.document(document))
    result = fetch_ledgers(endpoint)
    assert result.error is None
    assert result.document == document


def test_refused_connection(pods: SyntheticPods) -> None:
    endpoint = pods.dead_endpoint("tc-9")
    result = fetch_ledgers(endpoint, timeout_s=2)
    assert result.document is None
    assert result.error is not None and result.error.startswith("unreachable:")
    assert "Connection refused" in result.error and str(endpoint.url) in result.error


def test_pod_that_never_answers_times_out(pods: SyntheticPods) -> None:
    endpoint = pods.add_pod("tc-1", PodAnswer.hanging())
    result = fetch_ledgers(endpoint, timeout_s=0.5)
    assert result.error is not None and "timed out after 0.5 s" in result.error


def test_http_error_carries_the_pods_message(pods: SyntheticPods) -> None:
    endpoint = pods.add_pod("tc-2", PodAnswer.document({"error": "store log0 is recovering"}, status=503))
    result = fetch_ledgers(endpoint)
    assert result.error is not None
    assert result.error.startswith("HTTP 503") and "store log0 is recovering" in result.error


def test_not_json(pods: SyntheticPods) -> None:
    endpoint = pods.add_pod("tc-3", PodAnswer.raw(b"<html>gateway</html>"))
    result = fetch_ledgers(endpoint)
    assert result.error is not None and result.error.startswith("malformed document: not JSON")


def test_oversized_document(pods: SyntheticPods) -> None:
    endpoint = pods.add_pod("tc-4", PodAnswer.raw(b"[" + b"0," * 4096 + b"0]"))
    result = fetch_ledgers(endpoint, max_bytes=1024)
    assert result.error is not None and "larger than 1024 bytes" in result.error


def test_pod_without_address() -> None:
    result = fetch_ledgers(PodEndpoint(pod="tc-5", url=None, note="phase Pending, no pod IP"))
    assert result.error == "unreachable: no address (phase Pending, no pod IP)"


def test_fetch_all_keeps_order_with_mixed_outcomes(pods: SyntheticPods) -> None:
    endpoints = [
        pods.add_pod(f"p{i}", PodAnswer.document(pod_document(f"p{i}", [])))
        if i % 3
        else pods.dead_endpoint(f"p{i}")
        for i in range(12)
    ]
    results = list(fetch_all(endpoints, timeout_s=2, concurrency=4))
    assert [result.endpoint for result in results] == endpoints
    assert [result.error is None for result in results] == [i % 3 != 0 for i in range(12)]
