"""``kubectl txnkeeper`` against a real kube-apiserver (the cached etcd + kube-apiserver of
test_op_apiserver.py, its fixture reused): the CRDs from crds/, resources with a hand-written status
through the status subresource, Events, the operator's own verifier CronJob. Each test runs the
plugin's main() and checks what it printed and what it created or patched in the API server.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_op_apiserver import APISERVERS, ETCD, _client, _install_crds, apiserver

from txnkeeper_operator import builders, naming, observe
from txnkeeper_operator.kubectl_plugin.cli import main
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

__all__ = ["apiserver"]  # the fixture, imported for pytest

ROOT = Path(__file__).resolve().parents[2]
NS = "ops"
pytestmark = [
    pytest.mark.skipif(not APISERVERS, reason="no kube-apiserver in $CACHE_DIR/k8s (run `make k8s-bins`)"),
    pytest.mark.skipif(ETCD is None, reason="no etcd in $CACHE_DIR/kind/bin (run `make kind-components`)"),
    pytest.mark.timeout(110),
]


@pytest.fixture(scope="module")
def kube(apiserver: Path) -> Iterator[tuple[Path, Any]]:
    """The admin kubeconfig and an ApiClient, with the CRDs installed and namespace ``ops``."""
    from kubernetes import client

    api = _client(apiserver)
    _install_crds(api)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]
    yield apiserver, api


def run(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--kubeconfig", str(kubeconfig)], out=out, err=err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def _create(
    api: Any, kind: naming.Kind, name: str, spec: dict[str, Any], status: dict[str, Any] | None
) -> Any:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{naming.GROUP}/v1", "kind": kind.kind, "metadata": {"name": name}, "spec": spec}
    obj = custom.create_namespaced_custom_object(naming.GROUP, "v1", NS, kind.plural, body)
    if status is not None:
        obj = custom.patch_namespaced_custom_object_status(
            naming.GROUP, "v1", NS, kind.plural, name, {"status": status},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    return obj


def test_without_the_crds_says_they_are_not_installed(apiserver: Path) -> None:
    """First in the module: the ``kube`` fixture installs the CRDs for every later test."""
    from kubernetes import client

    served = client.ApiextensionsV1Api(_client(apiserver)).list_custom_resource_definition().items
    if served:
        pytest.skip("the CRDs were installed by an earlier test of this module (run it first)")
    for argv in (["status"], ["status", "tc", "x"], ["pause", "pas/x"]):
        code, _, err = run(apiserver, *argv)
        assert code == 1, argv
        assert "does not serve" in err and "the txnkeeper CRDs are not installed" in err, err


STORE_STATUS: dict[str, Any] = {
    "phase": "DowngradeBlocked",
    "phaseReason": "the verifier found live batched entries",
    "currentVersion": "3.1.0,2.0.0",
    "batchLog": "Disabled",
    "replicas": 2,
    "readyReplicas": 1,
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "PodsNotReady",
            "message": "1 of 2 pods ready",
            "lastTransitionTime": "2026-11-29T01:00:00Z",
            "observedGeneration": 1,
        },
    ],
    "pods": [
        {
            "name": "st-0",
            "version": "3.1.0",
            "ready": True,
            "batchLog": "Disabled",
            "formatLevel": 3,
            "offload": {
                "maxMetadataVersion": 2,
                "tierOnlyLedgers": 4,
                "assignedSegments": 1,
                "offloadedSegments": 7,
                "failedSegments": 0,
            },
        },
        {"name": "st-1", "version": "2.0.0", "ready": False, "batchLog": "Unknown"},
    ],
    "downgrade": {
        "startedAt": "2026-11-29T01:02:03Z",
        "fromVersion": "2.0.0",
        "rolledOver": [{"pod": "st-0", "stores": [{"store": "t/ns/orders", "lastBatchedLedger": 41}]}],
        "blockedSince": "2026-11-29T01:10:00Z",
    },
    "lastVerifierReport": {
        "generatedAt": "2026-11-29T01:09:00Z",
        "safe": False,
        "stores": [
            {"pod": "st-0", "store": "t/ns/orders", "safe": False, "reason": "live batched entry at 41:3"}
        ],
    },
    "offloadAudit": {"generatedAt": "2026-11-29T00:00:00Z", "ok": True, "findingCount": 0, "pods": 2},
    "lastAction": {"action": "run the verifier", "time": "2026-11-29T01:08:00Z"},
}


def test_status_tables_json_yaml_and_names(kube: tuple[Path, Any], tmp_path: Path) -> None:
    kubeconfig, api = kube
    _create(api, naming.PENDING_ACK_STORE, "st", {"version": "2.0.0"}, STORE_STATUS)
    _create(api, naming.TRANSACTION_COORDINATOR, "fresh", {"version": "2.0.0"}, None)

    code, out, err = run(kubeconfig, "status", "pas", "st", "-n", NS)
    assert (code, err) == (0, "")
    assert "PendingAckStore ops/st" in out
    assert "Phase:       DowngradeBlocked (the verifier found live batched entries)" in out
    assert "Desired:     2.0.0 (format level 2)" in out
    assert "3.1.0 (format level 3), 2.0.0 (format level 2)" in out
    assert "1/2 ready; batch log Disabled" in out
    pod_rows: dict[str, list[str]] = {}
    for line in out.splitlines():  # the pods table comes first; later tables name pods too
        if line.strip().startswith("st-"):
            pod_rows.setdefault(line.split()[0], line.split())
    assert pod_rows["st-0"][1:5] == ["3.1.0", "3", "true", "Disabled"]
    assert pod_rows["st-1"][1:5] == ["2.0.0", "2", "false", "Unknown"]  # level derived from the version
    assert "tier-only 4, segments 1 assigned/7 offloaded/0 failed, metadata v2" in out
    assert "t/ns/orders   41" in out  # the rollover marker
    assert "last report 2026-11-29T01:09:00Z: NOT SAFE" in out and "live batched entry at 41:3" in out
    assert "Offload audit: 2026-11-29T00:00:00Z: ok (pods 2)" in out
    assert "Last action: run the verifier at 2026-11-29T01:08:00Z" in out
    assert "PodsNotReady" in out

    # Every spelling kubectl accepts names the same resource.
    for words in (["pendingackstore/st"], ["pendingackstores.txnkeeper.io", "st"], ["PAS/st"]):
        assert run(kubeconfig, "status", *words, "-n", NS)[1] == out

    # All of the namespace: both kinds; one not reconciled yet says so.
    code, every, _ = run(kubeconfig, "-n", NS, "status")
    assert code == 0
    assert every.index("TransactionCoordinator ops/fresh") < every.index("PendingAckStore ops/st")
    assert "none yet (the operator has not reconciled it" in every

    code, raw, _ = run(kubeconfig, "status", "pas/st", "-n", NS, "-o", "json")
    import json

    assert code == 0 and json.loads(raw)["status"]["downgrade"]["rolledOver"][0]["pod"] == "st-0"
    code, raw, _ = run(kubeconfig, "status", "-n", NS, "-o", "yaml")
    listed = yaml.safe_load(raw)
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["fresh", "st"]

    # Without -n: the kubeconfig context's namespace.
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = NS
    in_ns = tmp_path / "ns.kubeconfig"
    in_ns.write_text(yaml.safe_dump(config))
    assert run(in_ns, "status", "pas", "st")[1] == out
    assert "No txnkeeper resources" in run(kubeconfig, "status", "tc")[1]  # namespace default: empty


def _event(
    api: Any, obj: Any, name: str, *, reason: str, message: str, at: str, type_: str = "Normal"
) -> None:
    from kubernetes import client

    meta = obj["metadata"]
    client.CoreV1Api(api).create_namespaced_event(
        NS,
        {  # type: ignore[arg-type]
            "metadata": {"name": name, "namespace": NS},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": NS,
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
            "source": {"component": "kopf"},
        },
    )


def test_rollout_history_oldest_first_with_last_action(kube: tuple[Path, Any]) -> None:
    kubeconfig, api = kube
    tc = _create(
        api, naming.TRANSACTION_COORDINATOR, "hist", {"version": "2.0.0"},
        {"phase": "Ready", "lastAction": {"action": "restart pod hist-0", "time": "2026-11-29T02:05:00Z"}},
    )  # fmt: skip
    other = _create(api, naming.TRANSACTION_COORDINATOR, "other", {"version": "2.0.0"}, None)
    # Created out of order: the table orders by time, not by creation.
    _event(
        api, tc, "hist.3", reason="RestartPod", message="restart hist-0 for 2.0.0", at="2026-11-29T02:05:00Z"
    )
    _event(api, tc, "hist.1", reason="ApplyTemplate", message="template 2.0.0", at="2026-11-29T02:00:00Z")
    _event(
        api,
        tc,
        "hist.2",
        reason="DowngradeBlocked",
        message="live batched data",
        at="2026-11-29T02:01:00Z",
        type_="Warning",
    )
    _event(
        api,
        tc,
        "hist.log",
        reason="Logging",
        message="Handler 'reconcile' succeeded.",
        at="2026-11-29T02:02:00Z",
    )
    _event(api, other, "other.1", reason="RestartPod", message="not hist's", at="2026-11-29T02:03:00Z")

    code, out, err = run(kubeconfig, "rollout", "history", "tc", "hist", "-n", NS)
    assert (code, err) == (0, "")
    rows = [line.split()[:3] for line in out.splitlines()[2:] if line.startswith("  2026")]
    assert rows == [
        ["2026-11-29T02:00:00Z", "Normal", "ApplyTemplate"],
        ["2026-11-29T02:01:00Z", "Warning", "DowngradeBlocked"],
        ["2026-11-29T02:05:00Z", "Normal", "RestartPod"],
    ]
    assert "not hist's" not in out and "Handler" not in out
    assert out.rstrip().endswith("Last action: restart pod hist-0 at 2026-11-29T02:05:00Z")
    code, out, _ = run(kubeconfig, "rollout", "history", "tc/other", "-n", NS)
    assert code == 0 and "not hist's" in out


def test_verify_now_creates_the_cronjobs_job(kube: tuple[Path, Any]) -> None:
    from kubernetes import client

    kubeconfig, api = kube
    batch = client.BatchV1Api(api)
    obj = _create(api, naming.PENDING_ACK_STORE, "vf", {"version": "2.0.0"}, {"phase": "Ready"})
    # The CronJob exactly as the operator builds it (no schedule: suspended, a template for runs).
    cron_manifest = builders.verifier_cron_job(Resource.from_body(obj), OperatorSettings())
    assert cron_manifest["spec"]["suspend"] is True
    batch.create_namespaced_cron_job(NS, cron_manifest)  # type: ignore[arg-type]
    cron: dict[str, Any] = api.sanitize_for_serialization(batch.read_namespaced_cron_job("vf-verifier", NS))

    code, out, err = run(kubeconfig, "verify", "now", "pas", "vf", "-n", NS)
    assert (code, err) == (0, "")
    listed = batch.list_namespaced_job(NS, label_selector=f"{naming.VERIFIER_OF_LABEL}=vf").items
    assert len(listed) == 1
    job: dict[str, Any] = api.sanitize_for_serialization(listed[0])
    meta = job["metadata"]
    assert f"job.batch/{meta['name']} created from cronjob/vf-verifier" in out
    assert "spec.verifier.schedule is empty" in out and "configmap/vf-verifier-report" in out
    assert meta["name"].startswith("vf-verifier-manual-")
    # The Job is the CronJob's jobTemplate (the server defaults both the same way; it adds the Job's
    # own selector and labels).
    template = cron["spec"]["jobTemplate"]
    added = {"selector", "manualSelector", "completionMode", "completions", "parallelism", "suspend",
             "podReplacementPolicy", "backoffLimitPerIndex", "maxFailedIndexes"}  # fmt: skip
    for field, value in template["spec"].items():
        if field == "template":
            assert job["spec"]["template"]["spec"] == value["spec"]
            assert (
                value["metadata"]["labels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
            )
        elif field not in added:
            assert job["spec"][field] == value, field
    assert {"backoffLimit", "podFailurePolicy", "activeDeadlineSeconds"} <= template["spec"].keys()
    assert naming.verifier_labels("vf").items() <= meta["labels"].items()
    assert meta["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "CronJob",
        "vf-verifier",
        cron["metadata"]["uid"],
        True,
    )
    # ...and the operator sees it as a running verifier (what holds a downgrade's verifier step).
    assert observe.verifier_running([job])
    # The report the Job writes goes where the operator reads it.
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--output") + 1] == f"configmap:{naming.report_config_map('vf')}"

    # A second run is another Job (names never collide).
    assert run(kubeconfig, "verify", "now", "pas/vf", "-n", NS)[0] == 0
    assert len(batch.list_namespaced_job(NS, label_selector=f"{naming.VERIFIER_OF_LABEL}=vf").items) == 2

    # No CronJob (the operator never reconciled it): said, with what to do.
    _create(api, naming.PENDING_ACK_STORE, "nocron", {"version": "2.0.0"}, None)
    code, out, err = run(kubeconfig, "verify", "now", "pas", "nocron", "-n", NS)
    assert code == 1 and out == ""
    assert "has no verifier CronJob 'nocron-verifier'" in err and "spec.verifier.schedule" in err


def test_pause_and_resume_set_and_remove_the_annotation(kube: tuple[Path, Any]) -> None:
    from kubernetes import client

    kubeconfig, api = kube
    custom = client.CustomObjectsApi(api)
    _create(api, naming.TRANSACTION_COORDINATOR, "pz", {"version": "2.0.0"}, {"phase": "Ready"})

    def annotations() -> dict[str, str]:
        obj: dict[str, Any] = custom.get_namespaced_custom_object(  # type: ignore[assignment]
            naming.GROUP, "v1", NS, "transactioncoordinators", "pz"
        )
        return dict(obj["metadata"].get("annotations") or {})

    code, out, err = run(kubeconfig, "pause", "tc", "pz", "-n", NS)
    assert (code, err) == (0, "")
    assert annotations()[naming.PAUSE_ANNOTATION] == "true"
    assert "transactioncoordinator/pz paused" in out and "phase before the operator reacts: Ready" in out
    assert "was already paused" in run(kubeconfig, "pause", "tc/pz", "-n", NS)[1]
    assert "Paused:      yes" in run(kubeconfig, "status", "tc/pz", "-n", NS)[1]

    code, out, _ = run(kubeconfig, "resume", "tc", "pz", "-n", NS)
    assert code == 0 and "resumed" in out
    assert naming.PAUSE_ANNOTATION not in annotations()
    assert "was not paused" in run(kubeconfig, "resume", "tc", "pz", "-n", NS)[1]


def _token_kubeconfig(api: Any, admin: Path, tmp_path: Path) -> Path:
    """A ServiceAccount that may only get TransactionCoordinators in ``ops``; a kubeconfig with its token."""
    from kubernetes import client

    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(NS, {"metadata": {"name": "viewer"}})  # type: ignore[arg-type]
    rbac.create_namespaced_role(NS, {  # type: ignore[arg-type]
        "metadata": {"name": "viewer"},
        "rules": [{"apiGroups": [naming.GROUP], "resources": ["transactioncoordinators"], "verbs": ["get"]}],
    })  # fmt: skip
    rbac.create_namespaced_role_binding(NS, {  # type: ignore[arg-type]
        "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS}],
    })  # fmt: skip
    request = core.create_namespaced_service_account_token(
        "viewer",
        NS,
        {"spec": {"expirationSeconds": 3600}},  # type: ignore[arg-type]
    )
    assert request.status is not None
    token = request.status.token
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": "viewer", "user": {"token": token}}]
    config["contexts"] = [
        {"name": "viewer", "context": {"cluster": "test", "user": "viewer", "namespace": NS}}
    ]
    config["current-context"] = "viewer"
    path = tmp_path / "viewer.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_bad_input_is_one_clear_line_and_a_nonzero_exit(kube: tuple[Path, Any], tmp_path: Path) -> None:
    kubeconfig, api = kube
    _create(api, naming.TRANSACTION_COORDINATOR, "seen", {"version": "2.0.0"}, {"phase": "Ready"})

    code, _, err = run(kubeconfig, "status", "statefulset", "x")
    assert code == 2 and "unknown resource type 'statefulset'" in err
    code, _, err = run(kubeconfig, "pause", "tc")
    assert code == 2 and "name the TransactionCoordinator" in err
    code, _, err = run(kubeconfig, "status", "tc", "missing", "-n", NS)
    assert code == 1 and "transactioncoordinators.txnkeeper.io 'missing' not found in namespace 'ops'" in err
    code, _, err = run(kubeconfig, "status", "tc", "seen", "--context", "nope")
    assert code == 1 and "nope" in err

    viewer = _token_kubeconfig(api, kubeconfig, tmp_path)
    code, out, err = run(viewer, "status", "tc", "seen")
    assert code == 0 and "Phase:       Ready" in out  # get is granted
    code, _, err = run(viewer, "pause", "tc", "seen")
    assert code == 1
    assert "forbidden: you may not patch transactioncoordinators.txnkeeper.io in namespace 'ops'" in err
    code, _, err = run(viewer, "status", "pas")
    assert code == 1 and "you may not list pendingackstores.txnkeeper.io" in err
    code, _, err = run(viewer, "rollout", "history", "tc", "seen")
    assert code == 1 and "you may not list events" in err

    # Nobody listening: said so, quickly, with the address.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    gone = tmp_path / "gone.kubeconfig"
    gone.write_text(yaml.safe_dump(config))
    code, _, err = run(gone, "status")
    assert code == 1 and f"cannot reach the Kubernetes API at https://127.0.0.1:{port}" in err


def _pem(days: float) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"in-{days}-days")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=30)).not_valid_after(now + timedelta(days=days))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM)


def test_certs_lists_expiry_of_labelled_tls_secrets(kube: tuple[Path, Any]) -> None:
    from kubernetes import client

    kubeconfig, api = kube
    core = client.CoreV1Api(api)
    labels = {"app.kubernetes.io/name": "txnkeeper", "app.kubernetes.io/instance": "tls1"}

    def secret(name: str, data: dict[str, bytes], secret_labels: dict[str, str]) -> None:
        body = {
            "metadata": {"name": name, "labels": secret_labels},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        core.create_namespaced_secret(NS, body)  # type: ignore[arg-type]

    secret("a-server", {"tls.crt": _pem(90) + _pem(5), "tls.key": b"k"}, labels)
    secret("b-ca", {"ca.crt": _pem(400)}, labels)
    secret("c-token", {"token": b"not a certificate"}, labels)  # no certificate key: not listed
    secret("d-unlabelled", {"tls.crt": _pem(-1)}, {})  # not txnkeeper's

    code, out, err = run(kubeconfig, "certs", "-n", NS)
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("a-server", "tls.crt", "OK"),
        ("a-server", "tls.crt", "EXPIRING"),
        ("b-ca", "ca.crt", "OK"),
    ]
    assert "CN=in-5-days" in out

    secret("e-expired", {"tls.crt": _pem(-2)}, labels)
    secret("f-garbage", {"tls.crt": b"-----BEGIN CERTIFICATE-----\nxx\n"}, labels)
    code, out, _ = run(kubeconfig, "certs", "pas", "tls1", "-n", NS)
    assert code == 1  # expired or unreadable
    assert "e-expired   tls.crt" in out and "EXPIRED" in out
    assert "UNREADABLE: not a PEM certificate" in out
    code, out, _ = run(kubeconfig, "certs", "-n", NS, "-l", "app.kubernetes.io/instance=none")
    assert code == 0 and "No Secrets with tls.crt or ca.crt matching" in out


def test_kubectl_runs_the_plugin(kube: tuple[Path, Any]) -> None:
    """The real kubectl finds ``kubectl-txnkeeper`` on PATH and passes its arguments through."""
    kubeconfig, api = kube
    kubectl = shutil.which("kubectl") or next(
        (str(p.parent / "kubectl") for p in APISERVERS if (p.parent / "kubectl").exists()), None
    )
    if kubectl is None:
        pytest.skip("no kubectl on PATH or in $CACHE_DIR/k8s")
    _create(api, naming.TRANSACTION_COORDINATOR, "viakubectl", {"version": "2.0.0"}, {"phase": "Ready"})
    bin_dir = ROOT / ".venv" / "bin"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig),
    }
    done = subprocess.run(
        [kubectl, "txnkeeper", "status", "tc", "viakubectl", "-n", NS],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "TransactionCoordinator ops/viakubectl" in done.stdout and "Phase:       Ready" in done.stdout
