"""Manifests the operator writes: valid on every supported Kubernetes, restricted, owned, and running
exactly the runtime command line of contracts §6."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from txnkeeper_operator import builders, naming
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

K8S_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]
SETTINGS = OperatorSettings(image="txnkeeper:test", verifier_image="txnkeeper-verifier:test")
ON = BatchSettings(enabled=True, max_records=100, max_size_bytes=65536, max_delay_millis=2)


def body(kind: str = "TransactionCoordinator", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "txnkeeper.io/v1",
        "kind": kind,
        "metadata": {"name": "txn", "namespace": "prod", "uid": "u-1", "generation": 3},
        "spec": {"version": "2.0.0", "replicas": 3, "coordinators": 6, **spec},
    }


TC = Resource.from_body(body(resources={"requests": {"cpu": "100m"}}, storage={"size": "2Gi"}))
PAS = Resource.from_body(body("PendingAckStore", verifier={"schedule": "*/15 * * * *"}))


def all_manifests(cr: Resource) -> list[dict[str, Any]]:
    return [
        *builders.children(cr, SETTINGS),
        builders.statefulset(cr, Template("2.0.0", ON), SETTINGS),
        builders.config_map(cr, ON),
        builders.token_secret(cr, "s3cret"),
        builders.markers_config_map(cr, {"__transaction_log_0": 4}, "2026-11-21T22:00:00.000000Z"),
        builders.report_config_map(cr),
        builders.verifier_job(cr, SETTINGS, 1763762400),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("cr", [TC, PAS], ids=["tc", "pas"])
def test_every_manifest_validates_strictly(cr: Resource, version: str) -> None:
    for manifest in all_manifests(cr):
        kubernetes_validate.validate(manifest, version, strict=True)


def test_everything_is_owned_by_the_resource() -> None:
    for manifest in all_manifests(TC):
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert (
            owner["uid"] == "u-1"
            and owner["controller"] is True
            and owner["kind"] == "TransactionCoordinator"
        )


def test_statefulset_is_rolled_by_the_operator_and_restricted() -> None:
    sts = builders.statefulset(TC, Template("1.0.0", BatchSettings()), SETTINGS)
    spec = sts["spec"]
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and not pod["automountServiceAccountToken"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert container["resources"] == {"requests": {"cpu": "100m"}}


def test_runtime_command_line_is_contract_section_6() -> None:
    sts = builders.statefulset(TC, Template("1.0.0", BatchSettings()), SETTINGS)
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert container["command"] == ["txnkeeper"] and args[0] == "serve"
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags == {
        "--role": "coordinator",
        "--data-dir": "/data",
        "--release": "1.0.0",
        "--listen": "$(POD_IP):6650",
        "--admin-listen": "$(POD_IP):8080",
        "--pod-name": "$(POD_NAME)",
        "--admin-token-file": naming.TOKEN_FILE,
        "--cluster-secret-file": naming.CLUSTER_SECRET_FILE,
        "--config": naming.CONFIG_FILE,
        "--coordinators": "6",
        "--coordinator-ids": "auto",
        "--replicas": "3",
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["TXNKEEPER_RELEASE"]["value"] == "1.0.0"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/data", naming.CONFIG_DIR, naming.TOKEN_DIR, naming.CLUSTER_SECRET_DIR, "/tmp"} <= mounts
    store = builders.statefulset(PAS, Template("2.0.0", ON), SETTINGS)["spec"]["template"]["spec"]
    assert "--coordinators" not in store["containers"][0]["args"]
    assert store["containers"][0]["args"][2] == "store"


def test_template_round_trips_and_matches_the_config_map() -> None:
    template = Template("2.0.0", ON)
    assert builders.template_of(builders.statefulset(TC, template, SETTINGS)) == template
    assert builders.template_of(None) is None
    cm = json.loads(builders.config_map(TC, ON)["data"]["config.json"])
    assert cm == {
        "batchedWrite": {"enabled": True, "maxRecords": 100, "maxSizeBytes": 65536, "maxDelayMillis": 2}
    }


def test_verifier_job_runs_the_verifier_cli_against_this_resource() -> None:
    job = builders.verifier_job(TC, SETTINGS, 42)
    assert job["metadata"]["name"] == "txn-verify-42"
    assert job["metadata"]["labels"][naming.VERIFIER_OF_LABEL] == "txn"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    runtime_selector = naming.selector_labels(TC.kind, "txn")
    assert not runtime_selector.items() <= pod_labels.items(), "verifier pods must not look like runtime pods"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "verify-invalidation" and container["image"] == "txnkeeper-verifier:test"
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags["--selector"] == naming.selector_string(TC.kind, "txn")
    assert flags["--markers-configmap"] == "txn-verifier-markers"
    assert flags["--output"] == "configmap:txn-verifier-report"
    cron = builders.verifier_cron_job(TC, SETTINGS)
    assert cron["spec"]["suspend"] is True  # no schedule: template for on-demand runs only
    scheduled = builders.verifier_cron_job(PAS, SETTINGS)["spec"]
    assert scheduled["suspend"] is False and scheduled["schedule"] == "*/15 * * * *"


def test_verifier_role_is_least_privilege() -> None:
    rules = builders.verifier_role(TC)["rules"]
    assert rules[0] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    assert set(rules[1]["resourceNames"]) == {"txn-verifier-markers", "txn-verifier-report"}
    assert "create" not in rules[1]["verbs"] and "delete" not in rules[1]["verbs"]


def test_markers_document_is_what_the_verifier_reads() -> None:
    cm = builders.markers_config_map(TC, {"b": 2, "a": 1}, "2026-11-21T22:00:00.000000Z")
    doc = json.loads(cm["data"][naming.MARKERS_KEY])
    assert doc == {"takenAt": "2026-11-21T22:00:00.000000Z", "stores": {"a": 1, "b": 2}}
    parse = pytest.importorskip("txnkeeper.verifier.inputs").parse_markers
    assert parse(cm["data"][naming.MARKERS_KEY]) is not None
