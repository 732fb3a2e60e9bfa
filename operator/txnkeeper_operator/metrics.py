"""The operator's Prometheus metrics: what each resource's rollout is doing and what blocks it.

Why: the alerts "downgrade blocked for hours", "verifier report stale" and the operator dashboard
(docs/monitoring.md) need the rollout phase, the verifier's last verdict and reconcile failures as
time series; the resources' status says the same but no Prometheus reads it. Reconcile records what it
decided after each pass (`RESOURCES.record`), the Kopf handlers count failed passes, and the collector
turns the last record of every resource into samples at scrape time. `serve` starts the HTTP endpoint
(`txnkeeper-operator --metrics-port`, the chart's `metrics` port).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from txnkeeper_operator.engine.model import Phase

_Key = tuple[str, str, str]  # namespace, kind, name
_LABELS = ["namespace", "kind", "name"]


@dataclass(frozen=True, slots=True)
class ResourceRecord:
    phase: Phase
    verifier_scheduled: bool
    report_generated_at: datetime | None
    report_safe: bool | None


class ResourceMetrics(Collector):
    """The last reconcile outcome of every resource this operator reconciled, and failure counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # recorded on the loop, collected on the HTTP server's thread
        self._records: dict[_Key, ResourceRecord] = {}
        self._errors: dict[_Key, int] = {}
        self._passes: dict[_Key, int] = {}

    def record(self, key: _Key, record: ResourceRecord) -> None:
        with self._lock:
            self._records[key] = record
            self._passes[key] = self._passes.get(key, 0) + 1

    def failed(self, key: _Key) -> None:
        with self._lock:
            self._errors[key] = self._errors.get(key, 0) + 1

    def forget(self, key: _Key) -> None:
        """A deleted resource: its series end (a Prometheus alert on it then resolves)."""
        with self._lock:
            self._records.pop(key, None)
            self._errors.pop(key, None)
            self._passes.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            records = dict(self._records)
            errors = dict(self._errors)
            passes = dict(self._passes)
        phase = GaugeMetricFamily(
            "txnkeeper_operator_resource_phase",
            "1 for the resource's current rollout phase (status.phase), 0 for every other phase",
            labels=[*_LABELS, "phase"],
        )
        scheduled = GaugeMetricFamily(
            "txnkeeper_operator_verifier_scheduled",
            "1 when spec.verifier.schedule runs the downgrade verifier periodically",
            labels=_LABELS,
        )
        generated = GaugeMetricFamily(
            "txnkeeper_operator_verifier_report_timestamp_seconds",
            "When the last verifier report was generated (Unix seconds)",
            labels=_LABELS,
        )
        safe = GaugeMetricFamily(
            "txnkeeper_operator_verifier_report_safe",
            "The last verifier report's verdict: 1 safe to downgrade, 0 not safe",
            labels=_LABELS,
        )
        for key, rec in sorted(records.items()):
            labels = list(key)
            for candidate in Phase:
                phase.add_metric([*labels, str(candidate)], 1 if candidate is rec.phase else 0)
            scheduled.add_metric(labels, 1 if rec.verifier_scheduled else 0)
            if rec.report_generated_at is not None:
                generated.add_metric(labels, rec.report_generated_at.timestamp())
            if rec.report_safe is not None:
                safe.add_metric(labels, 1 if rec.report_safe else 0)
        passes_family = CounterMetricFamily(
            "txnkeeper_operator_reconciles", "Reconcile passes that completed", labels=_LABELS
        )
        errors_family = CounterMetricFamily(
            "txnkeeper_operator_reconcile_errors",
            "Reconcile passes that failed (retried by the next trigger; the log says why)",
            labels=_LABELS,
        )
        for key in sorted(set(passes) | set(errors)):
            passes_family.add_metric(list(key), passes.get(key, 0))
            errors_family.add_metric(list(key), errors.get(key, 0))
        yield from (phase, scheduled, generated, safe, passes_family, errors_family)


RESOURCES = ResourceMetrics()


class CertificateMetrics(Collector):
    """When each certificate Secret the operator manages (or waits for, in cert-manager mode) ends:
    the alert on certificates about to expire works even where no pod is up to report its own."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._not_after: dict[tuple[str, str], datetime] = {}
        self._clock = clock

    def record(self, namespace: str, secret: str, not_after: datetime) -> None:
        with self._lock:
            self._not_after[(namespace, secret)] = not_after

    def forget(self, namespace: str, secret: str) -> None:
        with self._lock:
            self._not_after.pop((namespace, secret), None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            records = dict(self._not_after)
        family = GaugeMetricFamily(
            "txnkeeper_operator_certificate_expiry_seconds",
            "Seconds until the certificate in the Secret ends (notAfter - now; negative: expired)",
            labels=["namespace", "secret"],
        )
        now = self._clock()
        for (namespace, secret), not_after in sorted(records.items()):
            family.add_metric([namespace, secret], not_after.timestamp() - now)
        yield family


CERTIFICATES = CertificateMetrics()


def serve(port: int, *, address: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> int:
    """Serve /metrics (these metrics and, by default, the process's) on ``port`` (0: any); returns
    the port."""
    registry.register(RESOURCES)
    registry.register(CERTIFICATES)
    server, _thread = start_http_server(port, address, registry=registry)
    return int(server.server_port)
