"""txnkeeper_pod_ready follows the pod's readiness (the "coordinator not ready" alert reads it; a pod's
/metrics answers before it is ready). The ready case is scraped from real pods by
test_prometheus_scrape.py; the not-ready states are held only briefly by a real pod, so the gauge's
function is checked here on readiness values (pure logic)."""

from __future__ import annotations

import pytest

from txnkeeper.server.pod import ready_metric


@pytest.mark.parametrize(("not_ready", "value"), [(None, 1), ("recovering stores", 0), ("shutting down", 0)])
def test_pod_ready_gauge_follows_readiness(not_ready: str | None, value: int) -> None:
    (sample,) = ready_metric(not_ready).samples
    assert (sample.name, sample.labels, sample.value) == ("txnkeeper_pod_ready", {}, value)
