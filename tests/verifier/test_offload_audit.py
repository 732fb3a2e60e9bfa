"""verify-offload on real Spark (local[2]): real segments a managed ledger offloaded to a filesystem
blob store, the pods' summaries served over HTTP, objects read back directly from the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.ledger.offload.restore import inventory
from txnkeeper.verifier.offload_audit import audit, run
from txnkeeper.verifier.synthetic import PodAnswer, SyntheticPods

from .tiers import TOPIC

pytestmark = pytest.mark.spark


def _serve(pods: SyntheticPods, root: Path) -> Any:
    summary = {"pod": "pas-0", **inventory(root).to_json()}
    return [pods.add_pod("pas-0", PodAnswer.document(summary))]


def test_a_sound_tier_passes(spark: Any, pods: SyntheticPods, tiered: tuple[Path, Path]) -> None:
    root, tier = tiered
    settings = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)}
    report = audit(_serve(pods, root), settings, spark=spark, sample_blocks=100)
    assert report["ok"] is True and report["findings"] == []
    assert report["segmentsChecked"] == report["segments"] >= 2
    assert report["blocksSampled"] >= report["segments"]
    assert report["objects"] == 2 * report["segments"]
    assert [row["executor"] for row in report["executors"]] == ["driver"]  # local mode
    assert report["executors"][0]["tasks"] == min(report["segments"], 4)  # 2 cores x 2


def test_damage_missing_objects_and_orphans_are_findings(
    spark: Any, pods: SyntheticPods, tiered: tuple[Path, Path]
) -> None:
    root, tier = tiered
    uuids = [s["uuid"] for s in inventory(root).to_json()["stores"][0]["segmentList"]]
    damaged, missing = uuids[0], uuids[1]
    data = tier / damaged
    raw = bytearray(data.read_bytes())
    raw[200] ^= 0xFF  # inside the first block's entries
    data.write_bytes(bytes(raw))
    (tier / f"{missing}-index").unlink()
    (tier / "stray-object").write_bytes(b"left behind by a crashed upload")
    settings = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)}
    report = audit(_serve(pods, root), settings, spark=spark, sample_blocks=100)
    assert report["ok"] is False
    kinds = {(f["kind"], f.get("uuid")) for f in report["findings"]}
    assert ("corrupt", damaged) in kinds
    assert ("missing-object", missing) in kinds
    assert ("orphan", "stray-object") in kinds
    corrupt = next(f for f in report["findings"] if f["kind"] == "corrupt")
    assert corrupt["pod"] == "pas-0" and corrupt["store"] == TOPIC and damaged in corrupt["detail"]


def test_cli_exit_codes(spark: Any, pods: SyntheticPods, tiered: tuple[Path, Path], tmp_path: Path) -> None:
    import argparse

    from txnkeeper.verifier.offload_audit import add_arguments

    root, tier = tiered
    endpoint = _serve(pods, root)[0]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "report.json"
    settings = json.dumps({"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)})
    ns = parser.parse_args(
        ["--endpoint", f"pas-0={endpoint.url}", "--offload-json", settings, "--output", str(out)]
    )
    assert run(ns) == 0 and json.loads(out.read_text())["ok"] is True
    (tier / "orphan-1").write_bytes(b"x")
    assert run(ns) == 1 and json.loads(out.read_text())["findings"][0]["kind"] == "orphan"
    bad = parser.parse_args(
        ["--endpoint", f"pas-0={endpoint.url}", "--offload-json", '{"managedLedgerOffloadDriver": "gcs"}']
    )
    assert run(bad) == 2


def test_selector_discovery_and_configmap_report(
    spark: Any, pods: SyntheticPods, tiered: tuple[Path, Path], tmp_path: Path
) -> None:
    """How the operator's CronJob runs it: pods found by label selector (a pod without an IP is a
    finding, never skipped), the report patched into the pre-created ConfigMap, and a run that cannot
    audit still publishes ``ok: false`` with the error."""
    import argparse

    from txnkeeper.verifier.offload_audit import add_arguments

    from .fake_kube import FakeKubeApi

    root, tier = tiered
    endpoint = _serve(pods, root)[0]
    assert endpoint.url is not None
    port = endpoint.url.rsplit(":", 1)[1]
    namespace, labels = "txn", {"app.kubernetes.io/instance": "pas-main"}
    settings = json.dumps({"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with FakeKubeApi() as kube:
        kube.add_pod(namespace, "pas-0", labels, "127.0.0.1", "Running")
        kube.add_pod(namespace, "other-0", {"app.kubernetes.io/instance": "other"}, "127.0.0.9", "Running")
        common = [
            "--kubeconfig", str(kube.kubeconfig(tmp_path, namespace)), "--namespace", namespace,
            "--selector", "app.kubernetes.io/instance=pas-main", "--admin-port", port,
            "--output", "configmap:pas-main-offload-audit",
        ]  # fmt: skip
        assert run(parser.parse_args([*common, "--offload-json", settings])) == 0
        stored = kube.configmaps[(namespace, "pas-main-offload-audit")]
        report = json.loads(stored["data"]["report.json"])
        assert report["ok"] is True and report["pods"] == 1 and report["segments"] >= 2

        kube.add_pod(namespace, "pas-1", labels, None, "Pending")
        assert run(parser.parse_args([*common, "--offload-json", settings])) == 1
        report = json.loads(kube.configmaps[(namespace, "pas-main-offload-audit")]["data"]["report.json"])
        assert report["ok"] is False
        assert [(f["kind"], f["pod"]) for f in report["findings"]] == [("pod-unreadable", "pas-1")]

        bad = json.dumps({"managedLedgerOffloadDriver": "gcs"})
        assert run(parser.parse_args([*common, "--offload-json", bad])) == 2
        report = json.loads(kube.configmaps[(namespace, "pas-main-offload-audit")]["data"]["report.json"])
        assert report["ok"] is False and "gcs" in report["error"]
        # What the operator's suspended CronJob carries when the resource has no usable offload.
        assert run(parser.parse_args([*common, "--offload-json", "{}"])) == 2
        report = json.loads(kube.configmaps[(namespace, "pas-main-offload-audit")]["data"]["report.json"])
        assert "no offload settings" in report["error"] and "spec.offload" in report["error"]
