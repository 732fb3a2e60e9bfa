"""The chart's monitoring templates (docs/monitoring.md), rendered by the real helm: off by default; the
runtime PodMonitor selects exactly the pods the operator's StatefulSets create (by their labels and the
admin port's name, taken from the operator's own builders) and not the verifier's; the operator's
PodMonitor names a port its Deployment has; one dashboard ConfigMap per JSON file with the sidecar's
label; values.schema.json refuses bad monitoring values."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_chart import CHART, HELM, helm, render

from txnkeeper_operator import builders, naming
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found: run `make helm`")
ALL_ON = (
    "metrics.podMonitor.enabled=true",
    "metrics.dashboards.enabled=true",
    "metrics.prometheusRule.enabled=true",
)
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}


def _kinds(docs: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in docs]


def test_monitoring_is_off_by_default_and_lints_clean_when_on() -> None:
    docs = render()
    assert not MONITORING_KINDS & set(_kinds(docs))
    assert not [
        d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    args = ["lint", "--strict", str(CHART), "--kube-version", "1.29.0"]
    for value in ALL_ON:
        args += ["--set", value]
    result = helm(*args)
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def _runtime_pod(kind: str) -> dict[str, Any]:
    body = {
        "apiVersion": "txnkeeper.io/v1",
        "kind": kind,
        "metadata": {"name": "orders", "namespace": "apps", "uid": "u-1", "generation": 1},
        "spec": {"version": "2.0.0", "replicas": 1, "coordinators": 1},
    }
    settings = OperatorSettings(image="txnkeeper:test", verifier_image="txnkeeper-verifier:test")
    sts = builders.statefulset(Resource.from_body(body), Template("2.0.0", BatchSettings()), settings)
    template: dict[str, Any] = sts["spec"]["template"]
    return template


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector["matchLabels"].items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_runtime_pod_monitor_selects_the_operators_pods_on_their_admin_port() -> None:
    docs = render(*ALL_ON, "operator.watchNamespaces={apps,data}")
    pods_monitor, operator_monitor = (d for d in docs if d["kind"] == "PodMonitor")
    selector = pods_monitor["spec"]["selector"]
    assert pods_monitor["spec"]["namespaceSelector"] == {"matchNames": ["apps", "data"]}
    (endpoint,) = pods_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
    assert "scrapeTimeout" not in endpoint  # empty by default: Prometheus's own (never above interval)
    for kind in ("TransactionCoordinator", "PendingAckStore"):
        pod = _runtime_pod(kind)
        assert _selects(selector, pod["metadata"]["labels"]), kind
        (container,) = pod["spec"]["containers"]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
    assert not _selects(selector, naming.verifier_labels("orders"))
    assert not _selects(selector, naming.offload_audit_labels("orders"))
    relabeled = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert relabeled == {"role", "resource"}  # what the rules and dashboards group by
    cluster_wide = next(d for d in render(*ALL_ON) if d["kind"] == "PodMonitor")
    assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}

    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (op_endpoint,) = operator_monitor["spec"]["podMetricsEndpoints"]
    assert op_endpoint["port"] == "metrics" and f"--metrics-port={ports['metrics']}" in container["args"]
    assert op_endpoint["honorLabels"] is True  # the metrics' namespace is the resource's
    assert _selects(
        operator_monitor["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]
    )


def test_one_dashboard_config_map_per_json_file_for_the_grafana_sidecar() -> None:
    docs = render(
        "metrics.dashboards.enabled=true",
        "metrics.dashboards.namespace=monitoring",
        "metrics.dashboards.annotations.grafana_folder=txnkeeper",
    )
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard")]
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(maps) == len(files) >= 6
    for doc in maps:
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["metadata"]["namespace"] == "monitoring"
        assert doc["metadata"]["annotations"] == {"grafana_folder": "txnkeeper"}
        ((key, text),) = doc["data"].items()
        source = CHART / "dashboards" / key.removeprefix("txnkeeper-")
        assert json.loads(text) == json.loads(source.read_text())
    uids = [json.loads(f.read_text())["uid"] for f in files]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("metrics.podMonitor.interval=30", "interval"),
        ("metrics.podMonitor.enabeld=true", "enabeld"),
        ("metrics.prometheusRule.alerts.downgradeBlockedHours=0", "downgradeBlockedHours"),
        ("metrics.prometheusRule.alerts.coordinatorNotReadyFor=5 minutes", "coordinatorNotReadyFor"),
        ("metrics.prometheusRule.runbookUrl=docs/monitoring.md", "runbookUrl"),
        ("metrics.dashboards.namespace=Bad_NS", "namespace"),
    ],
)
def test_values_schema_rejects_bad_monitoring_values(bad: str, message: str) -> None:
    result = helm("template", "t", str(CHART), "--kube-version", "1.29.0", "--set", bad, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
