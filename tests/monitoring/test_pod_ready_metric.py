"""txnkeeper_pod_ready follows the pod's readiness (the "coordinator not ready" alert reads it; a pod's
/metrics answers before it is ready). The ready case is scraped from real pods by
test_prometheus_scrape.py; the not-ready states are held only briefly by a real pod, so the collector
is read here over a stand-in with just the attributes it reads (pure logic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from txnkeeper.server.pod import _PodCollector


@dataclass
class _Pod:
    not_ready: str | None
    coordinators: dict[int, Any] = field(default_factory=dict)
    topics: None = None
    offloads: None = None
    _protocol: None = None

    def readiness(self) -> str | None:
        return self.not_ready

    def ledger_index_bytes(self) -> int | None:
        return None


@pytest.mark.parametrize(("not_ready", "value"), [(None, 1), ("recovering stores", 0), ("shutting down", 0)])
def test_pod_ready_gauge_follows_readiness(not_ready: str | None, value: int) -> None:
    samples = {
        s.name: s.value
        for family in _PodCollector(_Pod(not_ready)).collect()  # type: ignore[arg-type]
        for s in family.samples
    }
    assert samples["txnkeeper_pod_ready"] == value
