"""Manifests the operator writes: valid on every supported Kubernetes, restricted, owned, and running
exactly the runtime command line of contracts §6."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from txnkeeper_operator import builders, gated, naming, podsettings
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
SPARK_K8S = "k8s://https://kubernetes.default.svc"
ON_K8S = Resource.from_body(body("PendingAckStore", verifier={"sparkMaster": SPARK_K8S}))


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
@pytest.mark.parametrize("cr", [TC, PAS, ON_K8S], ids=["tc", "pas", "spark-on-k8s"])
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
    # Scaled-away pods held nothing (the operator shrinks only then): their claims go; a deleted
    # resource keeps its ledgers.
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Delete"}
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
        "--listen": "0.0.0.0:6650",
        "--admin-listen": "0.0.0.0:8080",
        "--pod-name": "$(POD_NAME)",
        "--admin-token-file": naming.TOKEN_FILE,
        "--cluster-secret-file": naming.CLUSTER_SECRET_FILE,
        "--config": naming.CONFIG_FILE,
        "--coordinators": "6",
        "--coordinator-ids": "auto",
        "--replicas": "3",
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "POD_IP" not in env  # pods listen on every address of their own network namespace
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
    assert set(rules[1]["resourceNames"]) == {
        "txn-verifier-markers",
        "txn-verifier-report",
        "txn-offload-audit",  # verify-offload's report (same account)
    }
    assert "create" not in rules[1]["verbs"] and "delete" not in rules[1]["verbs"]


def _verifier_containers(cr: Resource) -> list[dict[str, Any]]:
    cron = builders.verifier_cron_job(cr, SETTINGS)
    audit = builders.offload_audit_cron_job(cr, SETTINGS)
    jobs = [cron["spec"]["jobTemplate"]["spec"], builders.verifier_job(cr, SETTINGS, 7)["spec"]]
    if audit is not None:
        jobs.append(audit["spec"]["jobTemplate"]["spec"])
    return [c for job in jobs for c in job["template"]["spec"]["containers"]]


def test_spark_on_kubernetes_makes_the_verifier_pod_the_driver() -> None:
    """k8s://: the job's pod is Spark's driver; it needs its IP, name, namespace and its own image
    (the names the runtime's verifier/spark_k8s.py reads), and listens on fixed ports."""
    spark_k8s = pytest.importorskip("txnkeeper.verifier.spark_k8s")
    settings = OperatorSettings(
        image="txnkeeper:test", verifier_image="txnkeeper-verifier:test", image_pull_policy="Never"
    )
    for container in _verifier_containers(ON_K8S):
        args = container["args"]
        assert args[args.index("--master") + 1] == SPARK_K8S
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert set(spark_k8s.REQUIRED_ENV) <= env.keys()
        assert env["TXNKEEPER_SPARK_IMAGE"]["value"] == container["image"] == "txnkeeper-verifier:test"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {
            "spark-driver": spark_k8s.DRIVER_PORT,
            "spark-blocks": spark_k8s.BLOCK_MANAGER_PORT,
        }
    (cron_container,) = builders.verifier_cron_job(ON_K8S, settings)["spec"]["jobTemplate"]["spec"][
        "template"
    ]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in cron_container["env"]}
    # Side-loaded images (kind, air-gapped clusters): the executors are pulled as the operator pulls.
    assert env["TXNKEEPER_SPARK_IMAGE_PULL_POLICY"] == "Never"
    # local[*] (the default) and spark:// masters: Spark stays in the pod or goes elsewhere, no driver env.
    for cr in (TC, PAS, Resource.from_body(body(verifier={"sparkMaster": "spark://master:7077"}))):
        for container in _verifier_containers(cr):
            names = {e["name"] for e in container["env"]}
            assert not names & {"POD_IP", "TXNKEEPER_SPARK_IMAGE"} and "ports" not in container


def test_verifier_role_grants_executor_pods_only_for_kubernetes_masters() -> None:
    (pods, configmaps) = builders.verifier_role(ON_K8S)["rules"]
    assert pods == {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "watch"],
    }
    # Nothing else Spark could ask for: no Services, ConfigMaps beyond the verifier's own, claims.
    assert configmaps == builders.verifier_role(TC)["rules"][1]
    assert builders.verifier_role(ON_K8S)["metadata"]["namespace"] == "prod"
    binding = builders.verifier_role_binding(ON_K8S)
    assert binding["roleRef"]["kind"] == "Role" and binding["subjects"][0]["namespace"] == "prod"
    # Back on local[*]: the same Role, applied whole, loses the grant.
    assert builders.verifier_role(TC)["rules"][0]["verbs"] == ["get", "list"]


def test_markers_document_is_what_the_verifier_reads() -> None:
    cm = builders.markers_config_map(TC, {"b": 2, "a": 1}, "2026-11-21T22:00:00.000000Z")
    doc = json.loads(cm["data"][naming.MARKERS_KEY])
    assert doc == {"takenAt": "2026-11-21T22:00:00.000000Z", "stores": {"a": 1, "b": 2}}
    parse = pytest.importorskip("txnkeeper.verifier.inputs").parse_markers
    assert parse(cm["data"][naming.MARKERS_KEY]) is not None


# ---- release-gated PendingAckStore settings: offload, single-key transactions, flushMode -------------

OFFLOAD_FS = {"driver": "filesystem", "filesystem": {"claimName": "tier-rwx"}, "thresholdBytes": 1048576}
OFFLOAD_S3 = {
    "driver": "aws-s3",
    "bucket": "ledgers",
    "region": "eu-west-1",
    "endpoint": "http://minio:9000",
    "credentialsSecret": {"name": "s3-creds"},
    "deletionLagMs": 0,
    "maxSegmentSizeBytes": 1 << 20,
    "maxSegmentRolloverSeconds": 60,
    "minSegmentRolloverSeconds": 5,
    "maxBlockSizeBytes": 1 << 16,
}
SRK = {"enabled": True, "maxBlockBytes": 1 << 20, "writerInactivityMinutes": 5, "maxWritersPerTopic": 100}


def store(version: str = "3.0.0", **spec: Any) -> Resource:
    return Resource.from_body(body("PendingAckStore", version=version, **spec))


def test_config_file_carries_offload_with_pulsar_key_names_and_single_key_transactions() -> None:
    cr = store(offload=OFFLOAD_S3, singleKeyTransactions=SRK, batchedWrite={"flushMode": "delay"})
    doc = json.loads(builders.config_map(cr, ON, "3.0.0")["data"]["config.json"])
    assert doc["batchedWrite"]["flushMode"] == "delay"
    assert doc["offload"] == {
        "managedLedgerOffloadDriver": "aws-s3",
        "managedLedgerOffloadBucket": "ledgers",
        "managedLedgerOffloadRegion": "eu-west-1",
        "managedLedgerOffloadServiceEndpoint": "http://minio:9000",
        "managedLedgerOffloadDeletionLagMs": 0,
        "maxOffloadSegmentSizeInBytes": 1 << 20,
        "maxOffloadSegmentRolloverTimeInSeconds": 60,
        "minOffloadSegmentRolloverTimeInSeconds": 5,
        "managedLedgerOffloadMaxBlockSizeInBytes": 1 << 16,
    }
    assert doc["singleKeyTransactions"] == SRK
    fs = json.loads(builders.config_map(store(offload=OFFLOAD_FS), ON, "3.0.0")["data"]["config.json"])
    assert fs["offload"]["fileSystemURI"] == "/var/lib/txnkeeper-offload"
    assert fs["offload"]["managedLedgerOffloadThresholdInBytes"] == 1048576


def test_gated_sections_never_reach_a_pod_whose_release_lacks_the_feature() -> None:
    # An upgrade in progress: the spec says 3.x and offloads, the template still starts 2.x pods.
    cr = store(offload=OFFLOAD_S3, singleKeyTransactions=SRK)
    doc = json.loads(builders.config_map(cr, ON, "2.0.0")["data"]["config.json"])
    assert set(doc) == {"batchedWrite"}
    container = builders.statefulset(cr, Template("2.0.0", ON), SETTINGS)["spec"]["template"]["spec"]
    names = {e["name"] for e in container["containers"][0]["env"]}
    assert "AWS_ACCESS_KEY_ID" not in names
    # Disabled single-key transactions are not rendered at all.
    off = store(singleKeyTransactions={"enabled": False})
    assert "singleKeyTransactions" not in json.loads(
        builders.config_map(off, ON, "3.0.0")["data"]["config.json"]
    )


def test_statefulset_mounts_credentials_as_env_and_the_filesystem_volume() -> None:
    s3 = builders.statefulset(store(offload=OFFLOAD_S3), Template("3.0.0", ON), SETTINGS)
    env = {e["name"]: e for e in s3["spec"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"] == {"secretKeyRef": {"name": "s3-creds", "key": key}}
    fs = builders.statefulset(store(offload=OFFLOAD_FS), Template("3.0.0", ON), SETTINGS)
    pod = fs["spec"]["template"]["spec"]
    assert {"name": "offload", "persistentVolumeClaim": {"claimName": "tier-rwx"}} in pod["volumes"]
    assert {"name": "offload", "mountPath": "/var/lib/txnkeeper-offload"} in pod["containers"][0][
        "volumeMounts"
    ]
    for version in K8S_VERSIONS[::4]:
        kubernetes_validate.validate(fs, version, strict=True)
        kubernetes_validate.validate(s3, version, strict=True)


def test_features_condition_refuses_sections_the_release_lacks() -> None:
    ok = gated.features_condition(store(offload=OFFLOAD_FS), "3.0.0")
    assert (ok.type, str(ok.status), ok.reason) == ("FeaturesSupported", "True", "Supported")
    bad = gated.features_condition(store("2.0.0", offload=OFFLOAD_FS, singleKeyTransactions=SRK), "2.0.0")
    assert (str(bad.status), bad.reason) == ("False", "FeatureUnavailable")
    assert "spec.offload needs the 'offload-segments' feature" in bad.message
    assert "spec.singleKeyTransactions needs the 'single-key-transactions' feature" in bad.message
    assert "release 2.0.0 lacks" in bad.message and "(3.x)" in bad.message


def test_offload_healthy_condition_names_failed_segments_and_unreadable_pods() -> None:
    cr = store(offload=OFFLOAD_FS)
    healthy = {"segments": {"Offloaded": 3}, "tierOnlyLedgers": 2, "maxMetadataVersion": 2, "unreadable": []}
    failed = {**healthy, "segments": {"Offloaded": 1, "Failed": 2}}
    assert str(gated.offload_condition(cr, [("pas-0", healthy, None)]).status) == "True"
    cond = gated.offload_condition(cr, [("pas-0", healthy, None), ("pas-1", failed, None)])
    assert (str(cond.status), cond.reason) == ("False", "FailedSegments")
    assert "pas-1: 2 Failed segment(s)" in cond.message and "pas-0" not in cond.message
    cond = gated.offload_condition(cr, [("pas-2", None, "HTTP 500: boom")])
    assert (str(cond.status), cond.reason) == ("False", "SummaryUnavailable") and "pas-2" in cond.message
    assert gated.offload_condition(store(), []).reason == "NotConfigured"


def test_offload_healthy_is_false_naming_pod_topic_and_segment_of_unreadable_tier_data() -> None:
    """Issue 25 item 9: a pod that could not read tier data (its readers are refused) made no
    difference to OffloadHealthy, which looked only at Failed uploads."""
    cr = store(offload=OFFLOAD_FS)
    healthy = {"segments": {"Offloaded": 3}, "tierOnlyLedgers": 2, "maxMetadataVersion": 2, "unreadable": []}
    row = {
        "topic": "persistent://public/default/orders",
        "segment": "5c6081bb-7549-4156-a29d-5843405f2374",
        "object": "5c6081bb-7549-4156-a29d-5843405f2374",
        "entries": "7:30..7:33",
        "kind": "corrupt",
        "error": "offloaded segment 5c6081bb-... is corrupt: part 11, ...: block CRC-32 is d43098d8",
        "since": 1.0,
        "lastFailure": 2.0,
        "failedReads": 4,
    }
    damaged = {**healthy, "segments": {"Offloaded": 3, "Failed": 1}, "unreadableTierData": [row]}
    cond = gated.offload_condition(
        cr, [("pas-0", {**healthy, "unreadableTierData": []}, None), ("pas-1", damaged, None)]
    )
    assert (cond.type, str(cond.status), cond.reason) == ("OffloadHealthy", "False", "UnreadableTierData")
    assert (
        "pas-1: topic persistent://public/default/orders segment 5c6081bb-7549-4156-a29d-5843405f2374"
        in cond.message
    )
    assert "entries 7:30..7:33" in cond.message and "block CRC-32 is d43098d8" in cond.message
    assert "pas-0" not in cond.message
    # Many rows: the first few are named, with how many more; a huge error text is cut.
    many = {
        **healthy,
        "unreadableTierData": [{**row, "segment": f"s{i}", "error": "x" * 5000} for i in range(9)],
    }
    cond = gated.offload_condition(cr, [("pas-2", many, None)])
    assert (
        "segment s4 " in cond.message and "segment s5 " not in cond.message and "and 4 more" in cond.message
    )
    assert len(cond.message) < 3000
    # Once the pod reads the data again (the row is gone), the condition is back to True.
    assert (
        str(gated.offload_condition(cr, [("pas-1", {**healthy, "unreadableTierData": []}, None)]).status)
        == "True"
    )


def test_disabled_offload_keeps_the_location_but_uploads_nothing_new() -> None:
    cr = store(offload={**OFFLOAD_S3, "enabled": False, "thresholdBytes": 0})
    doc = json.loads(builders.config_map(cr, ON, "3.0.0")["data"]["config.json"])
    assert doc["offload"]["managedLedgerOffloadThresholdInBytes"] == -1
    assert doc["offload"]["managedLedgerOffloadBucket"] == "ledgers"
    assert gated.restore_settings(cr) == doc["offload"]
    assert gated.features_condition(
        store("2.0.0", offload={**OFFLOAD_S3, "enabled": False}), "2.0.0"
    ).reason == ("Supported")
    with pytest.raises(ValueError, match="put it back with enabled: false"):
        gated.restore_settings(store("2.0.0"))


# ---- the offload audit: verify-offload as a CronJob, its report in status --------------------------------


def test_offload_audit_cron_job_runs_verify_offload_with_the_pods_settings_and_credentials() -> None:
    s3 = store(offload={**OFFLOAD_S3, "verifySchedule": "0 3 * * *"}, verifier={"sparkMaster": "local[2]"})
    cron = builders.offload_audit_cron_job(s3, SETTINGS)
    assert cron is not None and cron in builders.children(s3, SETTINGS)
    assert cron["metadata"]["name"] == "txn-verify-offload"
    assert cron["spec"]["schedule"] == "0 3 * * *" and cron["spec"]["suspend"] is False
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    # Neither a runtime pod nor a verify-invalidation Job (the downgrade gate lists those by label).
    labels = job["template"]["metadata"]["labels"]
    assert naming.VERIFIER_OF_LABEL not in labels
    assert not naming.selector_labels(s3.kind, "txn").items() <= labels.items()
    assert pod["serviceAccountName"] == "txn-verifier"
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "verify-offload" and container["image"] == "txnkeeper-verifier:test"
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags["--selector"] == naming.selector_string(s3.kind, "txn")
    assert flags["--namespace"] == "prod" and flags["--admin-port"] == str(naming.ADMIN_PORT)
    assert flags["--output"] == "configmap:txn-offload-audit" and flags["--master"] == "local[2]"
    # The pods' own offload section: what the audit reads the tier with.
    pod_config = json.loads(builders.config_map(s3, ON, "3.0.0")["data"]["config.json"])
    assert json.loads(flags["--offload-json"]) == pod_config["offload"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-creds"
    # Exit 1 is "findings": never retried.
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule["onExitCodes"]["values"] == [1] and rule["onExitCodes"]["containerName"] == "verify-offload"

    fs = builders.offload_audit_cron_job(store(offload=OFFLOAD_FS), SETTINGS)
    assert fs is not None and fs["spec"]["suspend"] is True  # no verifySchedule: on demand only
    fs_pod = fs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {"name": "offload", "persistentVolumeClaim": {"claimName": "tier-rwx"}} in fs_pod["volumes"]
    mounts = fs_pod["containers"][0]["volumeMounts"]
    assert {"name": "offload", "mountPath": "/var/lib/txnkeeper-offload", "readOnly": True} in mounts
    for version in K8S_VERSIONS[::4]:
        kubernetes_validate.validate(cron, version, strict=True)
        kubernetes_validate.validate(fs, version, strict=True)
        kubernetes_validate.validate(builders.offload_audit_report_config_map(s3), version, strict=True)


def test_offload_audit_is_suspended_without_settings_when_nothing_can_be_audited() -> None:
    # No spec.offload, or a spec heading for 2.x: the CronJob stays (the operator deletes only pods),
    # suspended, with no settings, credentials or claim.
    for cr in (store(), store("2.0.0", offload={**OFFLOAD_S3, "enabled": False, "verifySchedule": "@daily"})):
        cron = builders.offload_audit_cron_job(cr, SETTINGS)
        assert cron is not None and cron["spec"]["suspend"] is True
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"][container["args"].index("--offload-json") + 1] == "{}"
        assert {e["name"] for e in container["env"]} == {"HOME", "SPARK_LOCAL_DIRS"}
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert builders.offload_audit_cron_job(TC, SETTINGS) is None
    assert all(m["metadata"]["name"] != "txn-verify-offload" for m in builders.children(TC, SETTINGS))


def test_offload_audit_condition_and_status_from_the_report() -> None:
    cr = store(offload=OFFLOAD_FS)
    none = gated.offload_audit_condition(cr, None, None)
    assert (str(none.status), none.reason) == ("Unknown", "NoReport")
    assert "kubectl create job --from=cronjob/txn-verify-offload" in none.message
    clean = {
        "generatedAt": "2026-11-24T03:00:00Z", "ok": True, "pods": 3, "segments": 4, "segmentsChecked": 4,
        "blocksSampled": 9, "objects": 8, "findings": [],
        # Where the tasks ran (contracts §7): accepted, and not copied into the status.
        "executors": [{"executor": "0", "host": "10.0.0.7", "tasks": 2}],
    }  # fmt: skip
    assert "executors" not in gated.audit_status(clean)
    cond = gated.offload_audit_condition(cr, clean, None)
    assert (str(cond.status), cond.reason) == ("True", "Clean") and "4 segment(s) of 3 pod(s)" in cond.message
    findings = [{"kind": "orphan", "uuid": f"u{i}", "key": f"u{i}", "detail": "x"} for i in range(25)]
    findings.append({"kind": "corrupt", "pod": "txn-1", "store": "t", "uuid": "c", "detail": "bad CRC"})
    bad = {**clean, "ok": False, "findings": findings}
    cond = gated.offload_audit_condition(cr, bad, None)
    assert (str(cond.status), cond.reason) == ("False", "Findings")
    assert "1 corrupt, 25 orphan" in cond.message
    status = gated.audit_status(bad)
    assert status["findingCount"] == 26 and len(status["findings"]) == gated.MAX_REPORTED_FINDINGS
    assert status["ok"] is False and status["segmentsChecked"] == 4
    failed = {"generatedAt": "2026-11-24T03:00:00Z", "ok": False, "error": "selector matched no pods"}
    cond = gated.offload_audit_condition(cr, failed, None)
    assert (str(cond.status), cond.reason) == ("False", "AuditFailed") and "matched no pods" in cond.message
    cond = gated.offload_audit_condition(cr, None, "unusable offload audit report: x")
    assert (str(cond.status), cond.reason) == ("False", "ReportUnusable")
    assert gated.offload_audit_condition(store(), None, None).reason == "NotConfigured"


# ---- ungated pod settings: spec.topicPolicies (stores), spec.transactions (coordinators),
# ---- spec.connectionLimits (both) -------------------------------------------------------------------

POLICIES = {
    "retentionMinutes": 1440,
    "retentionSizeMB": 10240,
    "messageTTLSeconds": 3600,
    "backlogQuotaLimitBytes": 1 << 30,
    "backlogQuotaLimitSeconds": -1,
    "backlogQuotaPolicy": "producer_exception",
    "checkIntervalSeconds": 30,
}
TIMEOUTS = {
    "maxTimeoutMs": 600_000,
    "namespaces": [{"name": "public/default", "maxTimeoutMs": 120_000}],
    "topics": [
        {"name": "persistent://public/default/orders", "maxTimeoutMs": 30_000},
        {"name": "persistent://public/default/audit", "maxTimeoutMs": 600_000},
    ],
}
LIMITS = {
    "maxConnections": 4096,
    "maxConnectionsPerAddress": 64,
    "maxHandshakingConnections": 16,
    "handshakeTimeoutSeconds": 2.5,
    "idleTimeoutSeconds": 300,
    "maxTotalUnsentBytes": 256 << 20,
}


def _config(cr: Resource, version: str = "2.0.0") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(builders.config_map(cr, ON, version)["data"]["config.json"])
    return doc


def _env(cr: Resource) -> dict[str, Any]:
    sts = builders.statefulset(cr, Template("2.0.0", ON), SETTINGS)
    return {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0", "3.0.0"])
def test_store_config_carries_topic_policies_with_pulsars_names_on_every_release(version: str) -> None:
    doc = _config(store(version, topicPolicies=POLICIES), version)
    assert doc["topicPolicies"] == {
        "retention": {"retentionTimeInMinutes": 1440, "retentionSizeInMB": 10240},
        "messageTTL": {"messageTTLInSeconds": 3600},
        "backlogQuota": {"limitSize": 1 << 30, "limitTime": -1, "policy": "producer_exception"},
        "checkIntervalSeconds": 30,
    }
    # Only what the CR sets: a retention block is what switches trimming of unsubscribed topics on.
    assert _config(store(version, topicPolicies={"messageTTLSeconds": 60}), version)["topicPolicies"] == {
        "messageTTL": {"messageTTLInSeconds": 60}
    }


def test_coordinator_config_carries_transaction_timeouts_keyed_as_the_runtime_reads_them() -> None:
    tc = Resource.from_body(body(transactions=TIMEOUTS))
    assert _config(tc)["transactions"] == {
        "maxTimeoutMs": 600_000,
        "namespaces": {"public/default": {"maxTimeoutMs": 120_000}},
        "topics": {
            "persistent://public/default/orders": {"maxTimeoutMs": 30_000},
            "persistent://public/default/audit": {"maxTimeoutMs": 600_000},
        },
    }
    only_process = Resource.from_body(body(transactions={"maxTimeoutMs": 60_000}))
    assert _config(only_process)["transactions"] == {"maxTimeoutMs": 60_000}


def test_each_section_reaches_only_the_pods_that_read_it() -> None:
    # A body the CRD would not admit (each CR has only its own section): rendered for neither.
    tc = Resource.from_body(body(transactions=TIMEOUTS, topicPolicies=POLICIES))
    pas = store(transactions=TIMEOUTS, topicPolicies=POLICIES)
    assert "topicPolicies" not in _config(tc) and "transactions" in _config(tc)
    assert "transactions" not in _config(pas) and "topicPolicies" in _config(pas)


def test_nothing_set_renders_nothing() -> None:
    for cr in (TC, store("2.0.0")):
        assert set(_config(cr)) == {"batchedWrite"}
        # Always there, from the resource itself: the pod identity, the release, and the pods' own
        # Pulsar URLs (what lookups answer); no setting of the CR.
        always = {"POD_NAME", "POD_NAMESPACE", "TXNKEEPER_RELEASE"}
        always |= {"TXNKEEPER_PULSAR_URLS", "TXNKEEPER_PULSAR_COORDINATOR_URLS"}
        assert not [name for name in _env(cr) if name not in always]


@pytest.mark.parametrize(
    "cr", [Resource.from_body(body(connectionLimits=LIMITS)), store(connectionLimits=LIMITS)]
)
def test_statefulset_passes_connection_limits_as_the_runtimes_environment(cr: Resource) -> None:
    env = _env(cr)
    assert {
        name: e["value"] for name, e in env.items() if name.startswith("TXNKEEPER_MAX") or "TIMEOUT" in name
    } == {
        "TXNKEEPER_MAX_CONNECTIONS": "4096",
        "TXNKEEPER_MAX_CONNECTIONS_PER_ADDRESS": "64",
        "TXNKEEPER_MAX_HANDSHAKING_CONNECTIONS": "16",
        "TXNKEEPER_HANDSHAKE_TIMEOUT": "2.5",
        "TXNKEEPER_IDLE_TIMEOUT": "300",
        "TXNKEEPER_MAX_TOTAL_UNSENT_BYTES": str(256 << 20),
    }
    for version in K8S_VERSIONS[::4]:
        kubernetes_validate.validate(
            builders.statefulset(cr, Template("2.0.0", ON), SETTINGS), version, strict=True
        )


def test_settings_condition_is_true_for_valid_or_absent_settings() -> None:
    for cr in (
        TC,
        store(),
        Resource.from_body(body(transactions=TIMEOUTS, connectionLimits=LIMITS)),
        store(topicPolicies=POLICIES, connectionLimits=LIMITS),
    ):
        cond = podsettings.settings_condition(cr)
        assert (cond.type, str(cond.status), cond.reason) == ("SettingsValid", "True", "Valid"), cond.message


@pytest.mark.parametrize(
    ("cr", "fragment", "left_out"),
    [
        (
            store(topicPolicies={**POLICIES, "retentionMinutes": -2}),
            "spec.topicPolicies.retentionMinutes",
            "topicPolicies",
        ),
        (
            store(topicPolicies={"retentionSizeMB": "ten"}),
            "spec.topicPolicies.retentionSizeMB",
            "topicPolicies",
        ),
        (
            store(topicPolicies={"backlogQuotaPolicy": "drop_oldest"}),
            "producer_request_hold, producer_exception",
            "topicPolicies",
        ),
        (
            store(topicPolicies={"checkIntervalSeconds": True}),
            "spec.topicPolicies.checkIntervalSeconds",
            "topicPolicies",
        ),
        (
            store(topicPolicies={"retentionDays": 3}),
            "spec.topicPolicies.retentionDays is not a field",
            "topicPolicies",
        ),
        (store(topicPolicies=["retentionMinutes"]), "spec.topicPolicies must be an object", "topicPolicies"),
        (
            Resource.from_body(body(transactions={"maxTimeoutMs": 0})),
            "spec.transactions.maxTimeoutMs",
            "transactions",
        ),
        (
            Resource.from_body(
                body(transactions={"maxTimeoutMs": 60_000, "topics": [{"name": "t", "maxTimeoutMs": 60_001}]})
            ),
            "above spec.transactions.maxTimeoutMs",
            "transactions",
        ),
        (
            Resource.from_body(body(transactions={"namespaces": [{"name": "public", "maxTimeoutMs": 1}]})),
            "TENANT/NAMESPACE",
            "transactions",
        ),
        (
            Resource.from_body(body(transactions={"topics": [{"name": "a\x00b", "maxTimeoutMs": 1}]})),
            "printable characters",
            "transactions",
        ),
        (
            Resource.from_body(
                body(
                    transactions={
                        "topics": [{"name": "t", "maxTimeoutMs": 1}, {"name": "t", "maxTimeoutMs": 2}]
                    }
                )
            ),
            "spec.transactions.topics names 't' twice",
            "transactions",
        ),
        (
            Resource.from_body(body(transactions={"namespaces": {"public/default": 1}})),
            "must be a list",
            "transactions",
        ),
        (store(connectionLimits={"maxUnsentBytes": 1024}), "spec.connectionLimits.maxUnsentBytes", "env"),
        (
            store(connectionLimits={"idleTimeoutSeconds": "forever"}),
            "spec.connectionLimits.idleTimeoutSeconds",
            "env",
        ),
        (
            store(connectionLimits={"maxConnections": float("nan")}),
            "spec.connectionLimits.maxConnections",
            "env",
        ),
        (store(memory={"tailCacheBytes": -1}), "spec.memory.tailCacheBytes must be in 0..", "env"),
        (store(memory={"tailCacheBytes": 1.5}), "spec.memory.tailCacheBytes must be an integer", "env"),
        (store(memory={"tailCache": 1}), "spec.memory.tailCache is not a field", "env"),
    ],
)
def test_settings_the_pods_would_refuse_are_left_out_and_reported_never_raised(
    cr: Resource, fragment: str, left_out: str
) -> None:
    cond = podsettings.settings_condition(cr)
    assert (cond.type, str(cond.status), cond.reason) == ("SettingsValid", "False", "InvalidSettings")
    assert fragment in cond.message and "left out of the pods" in cond.message
    doc = _config(cr)
    env = _env(cr)
    if left_out == "env":
        assert not [
            name for name in env if name.startswith("TXNKEEPER_MAX") or "TIMEOUT" in name or "CACHE" in name
        ]
    else:
        assert left_out not in doc
    # The other sections are rendered as usual.
    assert doc["batchedWrite"]["enabled"] is True


def test_client_authentication_mounts_the_token_key_in_store_pods_only() -> None:
    from txnkeeper.protocol.clientauth import KEY_ENV

    auth = {"tokenKeySecret": {"name": "client-keys", "key": "hs256"}}
    sts = builders.statefulset(store(clientAuthentication=auth), Template("3.0.0", ON), SETTINGS)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[KEY_ENV] == naming.CLIENT_TOKEN_KEY_FILE  # the variable serve reads
    volume = next(v for v in pod["volumes"] if v["name"] == "client-token-key")
    assert volume["secret"]["secretName"] == "client-keys"
    assert volume["secret"]["items"] == [{"key": "hs256", "path": "key"}]
    assert naming.CLIENT_TOKEN_KEY_FILE.endswith("/key")
    assert {
        "name": "client-token-key",
        "mountPath": naming.CLIENT_TOKEN_KEY_DIR,
        "readOnly": True,
    } in container["volumeMounts"]
    for version in K8S_VERSIONS[::4]:
        kubernetes_validate.validate(sts, version, strict=True)
    # The key's default name, and nothing without the section or on a coordinator's pods.
    default = builders.statefulset(
        store(clientAuthentication={"tokenKeySecret": {"name": "k"}}), Template("3.0.0", ON), SETTINGS
    )
    (item,) = next(
        v for v in default["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-token-key"
    )["secret"]["items"]
    assert item == {"key": "key", "path": "key"}
    for cr in (store(), Resource.from_body(body(clientAuthentication=auth))):
        plain = builders.statefulset(cr, Template("3.0.0", ON), SETTINGS)
        names = {e["name"] for e in plain["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert KEY_ENV not in names
        assert all(v["name"] != "client-token-key" for v in plain["spec"]["template"]["spec"]["volumes"])


def test_pods_tell_pulsar_clients_their_own_dns_names() -> None:
    """Lookups on a pod name the pods by their DNS names behind the headless Service (not the
    address they listen on, 0.0.0.0): one URL per replica, in ordinal order."""
    for cr, env_name in ((PAS, "TXNKEEPER_PULSAR_URLS"), (TC, "TXNKEEPER_PULSAR_COORDINATOR_URLS")):
        container = builders.statefulset(cr, Template("2.0.0", ON), SETTINGS)["spec"]["template"]["spec"][
            "containers"
        ][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        urls = env[env_name].split(",")
        assert urls == [
            f"pulsar://{cr.name}-{i}.{cr.name}.{cr.namespace}.svc:6650" for i in range(cr.replicas)
        ]
        assert container["ports"][0] == {"name": "pulsar", "containerPort": 6650, "protocol": "TCP"}


def test_a_store_naming_its_coordinator_tells_its_pods_both_roles_and_the_coordinator_count() -> None:
    coordinator = Resource.from_body(body(coordinators=5))
    store_cr = store(pulsar={"transactionCoordinator": coordinator.name})
    assert (
        store_cr.pulsar_peer == coordinator.name
        and store_cr.pulsar_peer_kind.kind == "TransactionCoordinator"
    )
    container = builders.statefulset(store_cr, Template("2.0.0", ON), SETTINGS, coordinator)["spec"][
        "template"
    ]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TXNKEEPER_PULSAR_URLS"] == builders.pulsar_urls(store_cr)
    assert env["TXNKEEPER_PULSAR_COORDINATOR_URLS"] == builders.pulsar_urls(coordinator)
    assert env["TXNKEEPER_COORDINATORS"] == "5"  # the coordinator-assign topic's partitions
    alone = builders.statefulset(store(), Template("2.0.0", ON), SETTINGS)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "TXNKEEPER_PULSAR_COORDINATOR_URLS" not in {e["name"] for e in alone["env"]}


def test_offload_audit_on_kubernetes_gives_the_executors_the_tier_too() -> None:
    """k8s://: verify-offload's executors read the tier, so Spark must give their pods the same
    credentials (from the Secret, never as values) and the same shared claim, read-only."""
    spark_k8s = pytest.importorskip("txnkeeper.verifier.spark_k8s")

    def executor_conf(cr: Resource) -> dict[str, str]:
        audit = builders.offload_audit_cron_job(cr, SETTINGS)
        assert audit is not None
        (container,) = audit["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        conf: dict[str, str] = json.loads(env[spark_k8s.ENV_EXECUTOR_CONF])
        return conf

    s3 = store(offload=OFFLOAD_S3, verifier={"sparkMaster": SPARK_K8S})
    assert executor_conf(s3) == {
        "spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID": "s3-creds:AWS_ACCESS_KEY_ID",
        "spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY": "s3-creds:AWS_SECRET_ACCESS_KEY",
    }
    fs = store(offload=OFFLOAD_FS, verifier={"sparkMaster": SPARK_K8S})
    claim = "spark.kubernetes.executor.volumes.persistentVolumeClaim.offload"
    assert executor_conf(fs) == {
        f"{claim}.options.claimName": "tier-rwx",
        f"{claim}.mount.path": "/var/lib/txnkeeper-offload",
        f"{claim}.mount.readOnly": "true",
    }
    # Accepted by the runtime as it is (only executor-pod settings).
    with_conf = {**dict.fromkeys(spark_k8s.REQUIRED_ENV, "x"), spark_k8s.ENV_EXECUTOR_CONF: ""}
    for cr in (s3, fs):
        with_conf[spark_k8s.ENV_EXECUTOR_CONF] = json.dumps(executor_conf(cr))
        assert executor_conf(cr).items() <= spark_k8s._executor_conf(with_conf).items()
    # verify-invalidation reads no tier: nothing extra for its executors.
    for container in _verifier_containers(s3)[:2]:
        assert spark_k8s.ENV_EXECUTOR_CONF not in {e["name"] for e in container["env"]}
