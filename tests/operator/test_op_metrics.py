"""The operator's /metrics endpoint: served over real HTTP, a failed reconcile counted through the kopf
handler, a deleted resource's series gone (so an alert on it resolves)."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from txnkeeper_operator import handlers, metrics
from txnkeeper_operator.engine import Phase

KEY = ("apps", "PendingAckStore", "metrics-test")


def _scrape(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("phase", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("name") == KEY[2]
    }


def test_records_are_served_over_http_and_forgotten_with_the_resource() -> None:
    port = metrics.serve(0, address="127.0.0.1", registry=CollectorRegistry())
    generated = datetime(2026, 11, 29, 1, 2, 3, tzinfo=UTC)
    metrics.RESOURCES.record(
        KEY,
        metrics.ResourceRecord(
            phase=Phase.DOWNGRADE_BLOCKED,
            verifier_scheduled=True,
            report_generated_at=generated,
            report_safe=False,
        ),
    )
    samples = _scrape(port)
    assert samples[("txnkeeper_operator_resource_phase", "DowngradeBlocked")] == 1
    assert sum(v for (name, _), v in samples.items() if name == "txnkeeper_operator_resource_phase") == 1
    assert samples[("txnkeeper_operator_verifier_scheduled", "")] == 1
    assert samples[("txnkeeper_operator_verifier_report_timestamp_seconds", "")] == generated.timestamp()
    assert samples[("txnkeeper_operator_verifier_report_safe", "")] == 0
    assert samples[("txnkeeper_operator_reconciles_total", "")] == 1
    assert samples[("txnkeeper_operator_reconcile_errors_total", "")] == 0

    metrics.RESOURCES.forget(KEY)
    assert _scrape(port) == {}


async def test_a_failed_reconcile_is_counted_by_the_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(body: Any, ctx: Any) -> None:
        raise RuntimeError("apiserver said no")

    monkeypatch.setattr(handlers, "reconcile", broken)
    body = {"kind": KEY[1], "metadata": {"namespace": KEY[0], "name": KEY[2], "uid": "u-1"}}
    memo = kopf.Memo(locks={}, context=None)
    try:
        for _ in range(2):
            with pytest.raises(kopf.TemporaryError, match="apiserver said no"):
                await handlers._reconcile(body, memo)  # type: ignore[arg-type]
        errors = {
            s.labels["name"]: s.value
            for family in metrics.RESOURCES.collect()
            for s in family.samples
            if s.name == "txnkeeper_operator_reconcile_errors_total"
        }
        assert errors[KEY[2]] == 2
    finally:
        metrics.RESOURCES.forget(KEY)
