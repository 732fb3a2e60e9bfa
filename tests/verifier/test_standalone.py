"""Both verifier jobs on a real Spark standalone cluster: a master and two workers from the installed
pyspark, each worker (and its executor) on a loopback address of its own, as on two hosts.

The executors' Python cannot import txnkeeper (no site-packages processing, only the third-party
packages), like a worker host that has only pyspark: every line of the jobs' executor code reaches them
through the zip the driver ships. Both jobs run through their CLI (`--master spark://...`) in one
driver process of their own, on one session the driver started first, as a caller's session is reused:
one application for both saves a driver and two executor start-ups on a busy machine, and shows the
zip shipped once serving both. Verdicts must be what local mode decides for the same inputs, and each
report must show its tasks spread over both executors (Spark waits for both before its first task, so
that is deterministic, not a race).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.ledger.offload.restore import inventory
from txnkeeper.verifier.decide import finalize
from txnkeeper.verifier.job import FetchSettings, check_pods
from txnkeeper.verifier.model import PodEndpoint, RolloverMarkers
from txnkeeper.verifier.standalone import ClusterSettings, StandaloneCluster
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods, pod_document, store_entry

pytestmark = pytest.mark.spark

WORKER_HOSTS = {"127.0.0.2", "127.0.0.3"}
DRIVER_TIMEOUT_S = 240


def _host_without_txnkeeper(directory: Path) -> Path:
    """An interpreter for the executors: this Python, but without txnkeeper (its editable install is a
    site hook, which -S skips); pyspark and the other third-party packages stay importable."""
    script = directory / "python-without-txnkeeper"
    packages = sysconfig.get_paths()["purelib"]
    script.write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{packages}" exec {sys.executable} -S "$@"\n'
    )
    script.chmod(0o755)
    probe = subprocess.run(
        [str(script), "-c", "import pyspark, txnkeeper"], capture_output=True, text=True, check=False
    )
    assert "No module named 'txnkeeper'" in probe.stderr, probe.stderr
    return script


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    root = tmp_path_factory.mktemp("spark-standalone")
    python = _host_without_txnkeeper(root)
    spark = StandaloneCluster(ClusterSettings(workers=2, python=str(python)), root=root / "cluster")
    # The master's web UI port is taken between picking it and the master's bind, as another process
    # on a busy CI machine once did (Spark then bound the next port and the start waited on the
    # first until it gave up): the cluster must start again on fresh ports.
    taken = int(spark.master_ui.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        spark.start()
    try:
        assert spark.master_ui != f"http://127.0.0.1:{taken}"
        assert {worker["host"] for worker in spark.alive_workers()} == WORKER_HOSTS
        yield spark
    finally:
        spark.stop()
    # stop() raised if anything survived; this says it once more, independently of how it stopped.
    assert spark.leftovers() == []


DRIVER = """
import json, sys
from txnkeeper.cli import main
from txnkeeper.verifier.job import spark_session
session = spark_session(sys.argv[1])
codes = [main(argv) for argv in json.loads(sys.argv[2])]
session.stop()
print(json.dumps(codes))
"""


def _driver(cluster: StandaloneCluster, *commands: list[str]) -> list[int]:
    """Run CLI commands in one driver process on `cluster`; their exit codes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.update(cluster.driver_env())
    argvs = [[command[0], "--master", cluster.master_url, *command[1:]] for command in commands]
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.master_url, json.dumps(argvs)],
        env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    codes: list[int] = json.loads(run.stdout.splitlines()[-1])
    return codes


def _spread_over_both_executors(report: Mapping[str, Any], tasks: int) -> None:
    rows = report["executors"]
    assert {row["executor"] for row in rows} == {"0", "1"}, rows
    assert {row["host"] for row in rows} == WORKER_HOSTS, rows
    assert all(row["tasks"] > 0 for row in rows), rows
    assert sum(row["tasks"] for row in rows) == tasks, rows


def _layout() -> dict[str, list[dict[str, Any]]]:
    """Six pods (four tasks on two cores); one pending-ack store still holds batched entries."""

    def log(n: int) -> dict[str, Any]:
        return store_entry(f"__transaction_log_{n}", [8, 9])

    def ack(n: int, **kwargs: Any) -> dict[str, Any]:
        name = f"persistent://public/default/orders-{n}-billing__transaction_pending_ack"
        return store_entry(name, kwargs.pop("ledgers", [8, 9]), kind="pendingack", **kwargs)

    return {
        "tc-0": [log(0), log(1)],
        "tc-1": [log(2), log(3)],
        "store-0": [ack(0), ack(1, ledgers=[10, 11], batched=2, positions=["10:4", "10:5"])],
        "store-1": [ack(2), ack(3, ledgers=[12])],
        "store-2": [ack(4)],
        "store-3": [],
    }


def test_both_jobs_on_two_executors(
    cluster: StandaloneCluster, pods: SyntheticPods, tiered: tuple[Path, Path], tmp_path: Path
) -> None:
    invalidation, check_invalidation = _invalidation_case(pods, tmp_path)
    offload, check_offload = _offload_case(pods, tiered, tmp_path)

    codes = _driver(cluster, invalidation, offload)

    assert codes == [1, 1]  # not safe (a store still holds batched entries); the audit has findings
    check_invalidation()
    check_offload()


def _invalidation_case(pods: SyntheticPods, tmp_path: Path) -> tuple[list[str], Callable[[], None]]:
    layout = _layout()
    endpoints = [pods.add_pod(n, PodAnswer.document(pod_document(n, s))) for n, s in layout.items()]
    names = [store["name"] for stores in layout.values() for store in stores]
    markers = RolloverMarkers(datetime.now(UTC) - timedelta(seconds=1), dict.fromkeys(names, 7))
    (tmp_path / "markers.json").write_text(json.dumps(markers.to_dict()))
    (tmp_path / "pods.json").write_text(json.dumps([{"pod": e.pod, "url": e.url} for e in endpoints]))
    out = tmp_path / "report.json"
    command = [
        "verify-invalidation", "--markers", str(tmp_path / "markers.json"),
        "--endpoints-file", str(tmp_path / "pods.json"), "--output", str(out),
    ]  # fmt: skip

    def check() -> None:
        report = json.loads(out.read_text())
        blocking = [row["store"] for row in report["stores"] if not row["safe"]]
        assert blocking == ["persistent://public/default/orders-1-billing__transaction_pending_ack"]
        # The same decision local mode (and the driver alone) reaches for these inputs.
        expected = _decided_without_spark(endpoints, markers)
        assert (report["safe"], report["stores"], report["pods"]) == (
            expected["safe"], expected["stores"], expected["pods"],
        )  # fmt: skip
        _spread_over_both_executors(report, tasks=4)  # six pods in 2 cores x 2 partitions

    return command, check


def _decided_without_spark(endpoints: list[PodEndpoint], markers: RolloverMarkers) -> dict[str, Any]:
    results = list(check_pods(endpoints, markers.ledgers, FetchSettings()))
    outcomes = [outcome for outcome, _ in results]
    verdicts = [verdict for _, pod_verdicts in results for verdict in pod_verdicts]
    return finalize(datetime.now(UTC), markers, outcomes, verdicts).to_dict()


def _offload_case(
    pods: SyntheticPods, tiered: tuple[Path, Path], tmp_path: Path
) -> tuple[list[str], Callable[[], None]]:
    root, tier = tiered
    summary = {"pod": "pas-0", **inventory(root).to_json()}
    endpoint = pods.add_pod("pas-0", PodAnswer.document(summary))
    uuids = [segment["uuid"] for segment in summary["stores"][0]["segmentList"]]
    assert len(uuids) >= 4, uuids  # at least one task per core and then some
    damaged, missing = uuids[0], uuids[1]
    raw = bytearray((tier / damaged).read_bytes())
    raw[200] ^= 0xFF  # inside the first block's entries
    (tier / damaged).write_bytes(bytes(raw))
    (tier / f"{missing}-index").unlink()
    (tier / "stray-object").write_bytes(b"left behind by a crashed upload")
    settings = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)}
    out = tmp_path / "audit.json"
    command = [
        "verify-offload", "--endpoint", f"pas-0={endpoint.url}", "--offload-json", json.dumps(settings),
        "--sample-blocks", "100", "--output", str(out),
    ]  # fmt: skip

    def check() -> None:
        report = json.loads(out.read_text())
        # What local mode finds in the same damaged tier (tests/verifier/test_offload_audit.py).
        assert {(f["kind"], f.get("uuid")) for f in report["findings"]} == {
            ("corrupt", damaged), ("missing-object", missing), ("orphan", "stray-object"),
        }  # fmt: skip
        assert report["segmentsChecked"] == report["segments"] == len(uuids)
        _spread_over_both_executors(report, tasks=4)  # 2 cores x 2 partitions

    return command, check


def test_a_job_no_executor_can_join_fails_with_a_report(
    cluster: StandaloneCluster, pods: SyntheticPods, tmp_path: Path
) -> None:
    """Executors asking for more cores than any worker has are never launched (as executor pods that
    cannot be scheduled): the job must fail within its wait with a report, not hang to its deadline."""
    conf = tmp_path / "conf"
    conf.mkdir()
    for path in cluster.conf_dir.iterdir():
        text = path.read_text()
        if path.name == "spark-defaults.conf":
            text = text.replace("spark.executor.cores 1", "spark.executor.cores 4")
        (conf / path.name).write_text(text)
    invalidation, _ = _invalidation_case(pods, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.update(cluster.driver_env(), SPARK_CONF_DIR=str(conf), TXNKEEPER_VERIFIER_EXECUTOR_WAIT_SECONDS="8")
    argv = [invalidation[0], "--master", cluster.master_url, *invalidation[1:]]
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.master_url, json.dumps([argv])],
        env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == [2], run.stderr
    assert "no Spark executor registered with the driver within 8 s" in run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["safe"] is False
    assert "no Spark executor registered" in json.dumps(report)
