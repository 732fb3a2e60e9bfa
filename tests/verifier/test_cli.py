"""`txnkeeper verify-invalidation` as operators and the fleet run it: exit codes, files, ConfigMaps."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from txnkeeper import cli as txnkeeper_cli
from txnkeeper.verifier import RolloverMarkers, k8s, report_is_fresh
from txnkeeper.verifier.job import DRIVER_JAVA_OPTIONS
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry

from .fake_kube import FakeKubeApi

REPO = Path(__file__).resolve().parents[2]
MAIN_FILE = REPO / "runtime" / "txnkeeper" / "verifier" / "__main__.py"


def markers_doc(*names: str, taken_at: datetime | None = None) -> dict[str, Any]:
    when = taken_at if taken_at is not None else datetime.now(UTC) - timedelta(seconds=1)
    return RolloverMarkers(when, dict.fromkeys(names, 7)).to_dict()


def run_cli(*args: str) -> int:
    return txnkeeper_cli.main(["verify-invalidation", *args])


@pytest.fixture
def two_pods(pods: SyntheticPods) -> list[str]:
    urls = []
    for i in range(2):
        document = pod_document(f"tc-{i}", [store_entry(f"__transaction_log_{i}", [8, 9])])
        endpoint = pods.add_pod(f"tc-{i}", PodAnswer.document(document))
        urls.append(f"{endpoint.pod}={endpoint.url}")
    return urls


@pytest.mark.spark
def test_safe_run_writes_a_fresh_report_and_exits_0(spark: Any, two_pods: list[str], tmp_path: Path) -> None:
    markers = markers_doc("__transaction_log_0", "__transaction_log_1")
    (tmp_path / "markers.json").write_text(json.dumps(markers))
    (tmp_path / "endpoints.json").write_text(json.dumps([two_pods[1]]))
    out = tmp_path / "report.json"
    code = run_cli(
        "--endpoint",
        two_pods[0],
        "--endpoints-file",
        str(tmp_path / "endpoints.json"),
        "--markers",
        str(tmp_path / "markers.json"),
        "--output",
        f"file:{out}",
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["safe"] is True and len(report["stores"]) == 2
    assert report_is_fresh(report, markers)


@pytest.mark.spark
def test_not_safe_run_exits_1(spark: Any, two_pods: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    markers = markers_doc("__transaction_log_0", "__transaction_log_1", "__transaction_log_2")
    code = run_cli(*(f"--endpoint={url}" for url in two_pods), "--markers-json", json.dumps(markers))
    assert code == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["safe"] is False
    assert "__transaction_log_2" in report["reason"]
    assert '"blocking": 1' in captured.err


def test_no_pods_is_exit_2_and_publishes_a_not_safe_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = run_cli("--markers-json", json.dumps(markers_doc("log0")), "--output", str(out))
    assert code == 2
    report = json.loads(out.read_text())
    assert report["safe"] is False
    assert "no pods to check" in report["reason"]


@pytest.mark.parametrize(
    "args",
    [
        ["--endpoint", "http://127.0.0.1:1"],  # no markers
        ["--endpoint", "http://127.0.0.1:1", "--markers-json", '{"stores": {"a": 1}}'],  # no takenAt
        ["--endpoint", "127.0.0.1:1", "--markers-json", json.dumps(markers_doc("a"))],  # not a URL
        ["--endpoint", "http://127.0.0.1:1", "--markers", "/nonexistent/markers.json"],
        [
            "--endpoint",
            "http://127.0.0.1:1",
            "--markers-json",
            json.dumps(markers_doc("a")),
            "--output",
            "configmap:",
        ],
    ],
)
def test_bad_inputs_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(*args) == 2
    assert "verify-invalidation: error:" in capsys.readouterr().err


def test_unwritable_output_exits_2_before_any_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(
        "--endpoint",
        "http://127.0.0.1:1",
        "--markers-json",
        json.dumps(markers_doc("a")),
        "--output",
        str(tmp_path / "missing-dir" / "report.json"),
    )
    assert code == 2
    assert "missing-dir does not exist" in capsys.readouterr().err


@pytest.fixture
def kube() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as api:
        yield api


def _shared_port(hosts: list[str]) -> int:
    """A port free on every given loopback address (pods on their own IPs share the admin port)."""
    for _ in range(20):
        probe = socket.socket()
        probe.bind((hosts[0], 0))
        port = int(probe.getsockname()[1])
        probe.close()
        try:
            for host in hosts:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no shared port found")


@pytest.mark.spark
def test_in_cluster_discovery_markers_and_report_configmaps(
    spark: Any, pods: SyntheticPods, kube: FakeKubeApi, tmp_path: Path
) -> None:
    namespace, labels = "txn", {"app.kubernetes.io/instance": "tc-main"}
    hosts = ["127.0.0.2", "127.0.0.3"]
    port = _shared_port(hosts)
    for i, host in enumerate(hosts):
        document = pod_document(f"tc-main-{i}", [store_entry(f"__transaction_log_{i}", [8, 9])])
        pods.add_pod(f"tc-main-{i}", PodAnswer.document(document), host=host, port=port)
        kube.add_pod(namespace, f"tc-main-{i}", labels, host, "Running")
    kube.add_pod(namespace, "other-0", {"app.kubernetes.io/instance": "other"}, "127.0.0.9", "Running")
    markers = markers_doc("__transaction_log_0", "__transaction_log_1")
    kube.configmaps[(namespace, "tc-main-markers")] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "tc-main-markers", "namespace": namespace},
        "data": {"markers.json": json.dumps(markers)},
    }
    common = [
        "--kubeconfig",
        str(kube.kubeconfig(tmp_path, namespace)),
        "--namespace",
        namespace,
        "--selector",
        "app.kubernetes.io/instance=tc-main",
        "--admin-port",
        str(port),
        "--markers-configmap",
        "tc-main-markers",
        "--output",
        "configmap:tc-main-verifier-report",
    ]
    assert run_cli(*common) == 0
    stored = kube.configmaps[(namespace, "tc-main-verifier-report")]
    report = json.loads(stored["data"]["report.json"])
    assert report["safe"] is True
    assert sorted(pod["pod"] for pod in report["pods"]) == ["tc-main-0", "tc-main-1"]
    assert report_is_fresh(report, markers)
    # The operator pre-creates the ConfigMap with an owner reference; the job only patches its key.
    stored["metadata"]["ownerReferences"] = [
        {"apiVersion": "txnkeeper.io/v1", "kind": "TransactionCoordinator", "name": "tc-main", "uid": "u-1"}
    ]
    kube.add_pod(namespace, "tc-main-2", labels, None, "Pending")
    assert run_cli(*common) == 1
    stored = kube.configmaps[(namespace, "tc-main-verifier-report")]
    assert stored["metadata"]["ownerReferences"][0]["name"] == "tc-main"
    report = json.loads(stored["data"]["report.json"])
    assert report["safe"] is False
    [pending] = [pod for pod in report["pods"] if pod["pod"] == "tc-main-2"]
    assert pending["error"] == "unreachable: no address (phase Pending, no pod IP)"
    assert [kind for kind, _ in kube.requests].count("create-configmap") == 1


def test_pods_serving_tls_are_reached_by_the_name_their_certificate_is_for(
    kube: FakeKubeApi, tmp_path: Path
) -> None:
    labels = {"app.kubernetes.io/instance": "tc-main"}
    kube.add_pod("txn", "tc-main-0", labels, "10.0.0.5", "Running", subdomain="tc-main")
    kube.add_pod("txn", "tc-main-1", labels, "10.0.0.6", "Running")  # no headless Service: no name
    api = k8s.core_api(str(kube.kubeconfig(tmp_path, "txn")))
    selector = ["app.kubernetes.io/instance=tc-main"]
    plain = k8s.discover_pods(api, "txn", selector, 8080)
    assert [e.url for e in plain] == ["http://10.0.0.5:8080", "http://10.0.0.6:8080"]
    over_tls = k8s.discover_pods(api, "txn", selector, 8080, tls=True)
    # A pod IP is in no certificate: without a name the pod is reported unreachable, never called.
    assert [e.url for e in over_tls] == ["https://tc-main-0.tc-main.txn.svc:8080", None]
    assert "no headless Service" in str(over_tls[1].note)


def test_selector_matching_nothing_is_exit_2(kube: FakeKubeApi, tmp_path: Path) -> None:
    code = run_cli(
        "--kubeconfig",
        str(kube.kubeconfig(tmp_path, "txn")),
        "--namespace",
        "txn",
        "--selector",
        "app=absent",
        "--markers-json",
        json.dumps(markers_doc("a")),
        "--output",
        "configmap:absent-verifier-report",
    )
    assert code == 2
    report = json.loads(kube.configmaps[("txn", "absent-verifier-report")]["data"]["report.json"])
    assert report["safe"] is False and "matched no pods" in report["reason"]


@pytest.mark.spark
def test_runs_under_spark_submit(two_pods: list[str], tmp_path: Path) -> None:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    markers = tmp_path / "markers.json"
    markers.write_text(json.dumps(markers_doc("__transaction_log_0", "__transaction_log_1")))
    out = tmp_path / "report.json"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    completed = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            "--driver-java-options",
            DRIVER_JAVA_OPTIONS,
            str(MAIN_FILE),
            *(f"--endpoint={url}" for url in two_pods),
            "--markers",
            str(markers),
            "--output",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(out.read_text())["safe"] is True
