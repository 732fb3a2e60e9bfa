"""The operator against a real kube-apiserver (etcd + apiserver only: no nodes, so no pods run).

What only a real API server can prove: the CRDs are accepted (structural schema, CEL compiled, defaults
checked against the rules), invalid resources are refused with the CRD's own messages, and the
operator process, running under the chart's least-privilege RBAC, creates every child with server-side
apply, writes status and posts Events. Full rollouts with running pods are the e2e suite's job.

Skipped, with the reason, when the binaries the e2e Makefile builds (`make k8s-bins`) or etcd are absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import apiserver_pki
import pytest
import yaml

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1ObjectMeta

# The kubernetes client types request bodies as its models; the dicts passed here are validated into
# those by the client at the call (hence the `type: ignore[arg-type]`s).

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CACHE_DIR", Path.home() / ".cache" / "txnkeeper"))
APISERVERS = sorted(CACHE.glob("k8s/v*/bin/kube-apiserver"))
# etcd as the kind node image uses it (built by `make kind-components`), else one on PATH.
ETCD = (
    str(CACHE / "kind" / "bin" / "etcd")
    if (CACHE / "kind" / "bin" / "etcd").exists()
    else shutil.which("etcd")
)
HELM = os.environ.get("HELM") or str(CACHE / "bin" / "helm")

pytestmark = [
    pytest.mark.skipif(not APISERVERS, reason="no kube-apiserver in $CACHE_DIR/k8s (run `make k8s-bins`)"),
    pytest.mark.skipif(ETCD is None, reason="no etcd in $CACHE_DIR/kind/bin (run `make kind-components`)"),
    pytest.mark.timeout(110),
]


def wait_for(condition: Callable[[], Any], what: str, timeout: float) -> Any:
    """Poll ``condition`` until it returns something truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as err:  # the API server may still be starting
            last = err
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is not None:  # reaped: its pid (the group's id) may already be another's
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An etcd + kube-apiserver of our own; yields the admin kubeconfig path."""
    root = tmp_path_factory.mktemp("apiserver")
    p = root / "pki"
    apiserver_pki.generate(p)
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    kubeconfig = apiserver_pki.admin_kubeconfig(p, f"https://127.0.0.1:{api_port}", root / "kubeconfig")
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    str(ETCD),
                    "--name=op",
                    f"--data-dir={root / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster=op=http://127.0.0.1:{peer_port}",
                    "--log-level=warn",
                ],
                stdout=(root / "etcd.log").open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    str(APISERVERS[-1]),
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    f"--cert-dir={p}",
                    f"--tls-cert-file={p / 'apiserver.crt'}",
                    f"--tls-private-key-file={p / 'apiserver.key'}",
                    f"--client-ca-file={p / 'ca.crt'}",
                    f"--service-account-key-file={p / 'sa.pub'}",
                    f"--service-account-signing-key-file={p / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--authorization-mode=RBAC",
                    "--endpoint-reconciler-type=none",
                    "--profiling=false",
                ],
                stdout=(root / "apiserver.log").open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        api = _client(kubeconfig)
        from kubernetes import client

        core = client.CoreV1Api(api)
        # Serving, with its bootstrap done: the system namespaces exist.
        wait_for(lambda: {"default", "kube-system"} <= {_name(n) for n in core.list_namespace().items},
                 "the API server", 90)  # fmt: skip
        yield kubeconfig
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _client(kubeconfig: Path) -> ApiClient:
    from kubernetes import config

    # Unannotated in the kubernetes client (its API classes and models are): given its real type.
    new_client = cast("Callable[..., ApiClient]", config.new_client_from_config)
    return new_client(config_file=str(kubeconfig))


class _Named(Protocol):
    @property
    def metadata(self) -> V1ObjectMeta | None: ...


def _name(obj: _Named) -> str:
    """metadata.name of an object read from the API server (always set there; Optional in the models)."""
    assert obj.metadata is not None and obj.metadata.name is not None, obj
    return obj.metadata.name


def _install_crds(api: ApiClient) -> None:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except client.ApiException as err:
            if err.status != 409:  # installed by an earlier test of this module's API server
                raise

    def established() -> bool:
        crds = ext.list_custom_resource_definition().items
        ours = [c for c in crds if c.spec.group == "txnkeeper.io"]
        return len(ours) == 2 and all(
            c.status is not None
            and any(
                cond.type == "Established" and cond.status == "True" for cond in c.status.conditions or []
            )
            for c in ours
        )

    wait_for(established, "CRDs established", 30)


def _cr(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "txnkeeper.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_crds_invalid_resources_and_the_operator_under_chart_rbac(apiserver: Path, tmp_path: Path) -> None:
    from kubernetes import client

    api = _client(apiserver)
    _install_crds(api)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": "demo"}})  # type: ignore[arg-type]

    # Refused by the API server with the CRD's own messages.
    for body, message in [
        (
            _cr("PendingAckStore", "b1", {"version": "1.0.0", "batchedWrite": {"enabled": True}}),
            "needs version 2.x",
        ),
        (_cr("PendingAckStore", "b2", {"version": "9.0.0"}), "known release line"),
        (
            _cr("PendingAckStore", "b3", {"version": "2.0.0", "replicas": 3, "shards": 32}),
            "multiple of spec.replicas",
        ),
        (
            _cr(
                "TransactionCoordinator",
                "b4",
                {
                    "version": "2.0.0",
                    "transactions": {
                        "maxTimeoutMs": 60000,
                        "topics": [{"name": "persistent://t/n/x", "maxTimeoutMs": 60001}],
                    },
                },
            ),
            "may only lower the coordinator's maximum",
        ),
        (
            _cr(
                "TransactionCoordinator",
                "b5",
                {
                    "version": "2.0.0",
                    "transactions": {"topics": [{"name": "t__transaction_pending_ack", "maxTimeoutMs": 1}]},
                },
            ),
            "may not end with __transaction_pending_ack",
        ),
        (
            _cr(
                "PendingAckStore", "b6", {"version": "2.0.0", "topicPolicies": {"backlogQuotaPolicy": "drop"}}
            ),
            "producer_request_hold",
        ),
        (
            _cr("PendingAckStore", "b7", {"version": "2.0.0", "topicPolicies": {"retentionMinutes": -2}}),
            "retentionMinutes",
        ),
        (
            _cr("PendingAckStore", "b8", {"version": "2.0.0", "connectionLimits": {"maxUnsentBytes": 1024}}),
            "maxUnsentBytes",
        ),
        (
            _cr(
                "PendingAckStore",
                "b9",
                {"version": "2.0.0", "maintenanceWindows": ["* 22-23 * * SAT", "* 24 * * *"]},
            ),
            "each entry is a cron expression in UTC with five fields",
        ),
    ]:
        plural = "pendingackstores" if body["kind"] == "PendingAckStore" else "transactioncoordinators"
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object("txnkeeper.io", "v1", "demo", plural, body)
        assert (
            refused.value.status == 422 and refused.value.body is not None and message in refused.value.body
        )

    custom.create_namespaced_custom_object(
        "txnkeeper.io", "v1", "demo", "transactioncoordinators",
        _cr("TransactionCoordinator", "txn", {
            "version": "1.0.0", "replicas": 3, "coordinators": 6,
            "maintenanceWindows": ["* 22-23 * * SAT,SUN"],
            "transactions": {
                "maxTimeoutMs": 600000,
                "topics": [{"name": "persistent://public/default/orders", "maxTimeoutMs": 60000}],
            },
            "connectionLimits": {"maxConnections": 2048, "handshakeTimeoutSeconds": 2.5},
        }),
    )  # fmt: skip
    stored = cast(  # typed `object` by the client: a custom object is its JSON document
        dict[str, Any],
        custom.get_namespaced_custom_object("txnkeeper.io", "v1", "demo", "transactioncoordinators", "txn"),
    )
    assert stored["spec"]["batchedWrite"]["maxRecords"] == 512  # defaulted by the API server

    kubeconfig = _operator_kubeconfig(api, apiserver, tmp_path)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TXNKEEPER_RECONCILE_SECONDS": "1"}
    log = (tmp_path / "operator.log").open("ab")
    operator = subprocess.Popen(
        [sys.executable, "-m", "txnkeeper_operator.main", "--liveness="],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        apps = client.AppsV1Api(api)
        sts = wait_for(
            lambda: _get(lambda: apps.read_namespaced_stateful_set("txn", "demo")), "StatefulSet", 40
        )
        assert sts.spec.update_strategy.type == "OnDelete"
        assert sts.spec.template.metadata.labels["txnkeeper.io/version"] == "1.0.0"
        env = {e.name: e.value for e in sts.spec.template.spec.containers[0].env}
        assert (env["TXNKEEPER_MAX_CONNECTIONS"], env["TXNKEEPER_HANDSHAKE_TIMEOUT"]) == ("2048", "2.5")
        config = (core.read_namespaced_config_map("txn-config", "demo").data or {})["config.json"]
        assert '"topics": {"persistent://public/default/orders": {"maxTimeoutMs": 60000}}' in config
        for read, name in [
            (core.read_namespaced_service, "txn"),
            (core.read_namespaced_config_map, "txn-config"),
            (core.read_namespaced_secret, "txn-admin-token"),
            (core.read_namespaced_service_account, "txn-verifier"),
            (client.PolicyV1Api(api).read_namespaced_pod_disruption_budget, "txn"),
            (client.RbacAuthorizationV1Api(api).read_namespaced_role, "txn-verifier"),
            (client.BatchV1Api(api).read_namespaced_cron_job, "txn-verifier"),
        ]:
            # mypy cannot infer a lambda whose parameters have defaults (they bind the loop variables).
            obj = wait_for(lambda read=read, name=name: _get(lambda: read(name, "demo")), name, 20)  # type: ignore[misc]
            assert obj.metadata.owner_references[0].name == "txn"

        def status() -> dict[str, Any]:
            got = cast(
                dict[str, Any],
                custom.get_namespaced_custom_object(
                    "txnkeeper.io", "v1", "demo", "transactioncoordinators", "txn"
                ),
            )
            return dict(got.get("status") or {})

        current = wait_for(lambda: status().get("phase") == "Creating" and status(), "status.phase", 20)
        assert {c["type"] for c in current["conditions"]} == {
            "Ready", "Progressing", "BatchLogEnabled", "DowngradeSafe", "Paused", "SettingsValid",
            "ScaleInSafe",
        }  # fmt: skip
        events = wait_for(
            lambda: [e for e in core.list_namespaced_event("demo").items if e.reason == "ApplyTemplate"],
            "an ApplyTemplate Event",
            20,
        )
        assert events[0].involved_object.name == "txn"

        custom.patch_namespaced_custom_object(
            "txnkeeper.io", "v1", "demo", "transactioncoordinators", "txn",
            {"metadata": {"annotations": {"txnkeeper.io/pause-reconciliation": "true"}}},
        )  # fmt: skip
        wait_for(lambda: status().get("phase") == "Paused", "phase Paused", 20)
    finally:
        _stop(operator)
        log.close()
    text = (tmp_path / "operator.log").read_text(errors="replace")
    assert "Forbidden" not in text and "403" not in text, text[-3000:]


def test_scaling_through_the_scale_subresource(apiserver: Path, tmp_path: Path) -> None:
    """kubectl scale reaches spec.replicas through /scale (CEL lets it through once the first record
    exists), the placement ConfigMap holds the first record, the StatefulSet grows at once (its pods
    keep the first record's --replicas/--shards), and a scale-in that would lose a shard whose move
    failed is refused with ScaleInSafe=False, a Warning Event, and the StatefulSet left as it is."""
    from kubernetes import client

    from txnkeeper.contract.placement import Placement

    api = _client(apiserver)
    _install_crds(api)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": "scale"}})  # type: ignore[arg-type]
    plural = "pendingackstores"
    custom.create_namespaced_custom_object(
        "txnkeeper.io", "v1", "scale", plural,
        _cr("PendingAckStore", "pas", {"version": "2.0.0", "replicas": 1, "shards": 8}),
    )  # fmt: skip

    def cr() -> dict[str, Any]:
        return cast(
            dict[str, Any], custom.get_namespaced_custom_object("txnkeeper.io", "v1", "scale", plural, "pas")
        )

    def placement_cm() -> dict[str, str]:
        found = _get(lambda: core.read_namespaced_config_map("pas-placement", "scale"))
        return dict(found.data or {}) if found is not None else {}

    def sts_replicas() -> int | None:
        sts = _get(lambda: apps.read_namespaced_stateful_set("pas", "scale"))
        return None if sts is None else int(sts.spec.replicas)

    kubeconfig = _operator_kubeconfig(api, apiserver, tmp_path)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TXNKEEPER_RECONCILE_SECONDS": "1"}
    log = (tmp_path / "operator.log").open("ab")
    operator = subprocess.Popen(
        [sys.executable, "-m", "txnkeeper_operator.main", "--liveness=", "--namespace", "scale"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        data = wait_for(placement_cm, "the placement ConfigMap", 40)
        first = Placement.loads(data["placement.json"])
        assert (first.kind, first.owners) == ("store-shards", (0,) * 8)
        assert json.loads(data["moves.json"])["initialReplicas"] == 1
        # Epoch 1 is the pods' own (no members); the next names the pod by its DNS name.
        named = wait_for(lambda: Placement.loads(placement_cm()["placement.json"]).members, "members", 30)
        assert named[0].address == "pas-0.pas.scale.svc:6650"
        wait_for(lambda: sts_replicas() == 1, "the StatefulSet at 1", 30)
        args = _args(apps)
        assert args[args.index("--shards") + 1] == "8" and args[args.index("--replicas") + 1] == "1"
        wait_for(
            lambda: (cr().get("status") or {}).get("placement", {}).get("shards") == 8, "status.placement", 30
        )

        # kubectl scale pendingackstore pas --replicas=3
        custom.patch_namespaced_custom_object_scale(
            "txnkeeper.io", "v1", "scale", plural, "pas", {"spec": {"replicas": 3}}
        )
        scale = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object_scale("txnkeeper.io", "v1", "scale", plural, "pas"),
        )
        assert scale["spec"]["replicas"] == 3
        assert (
            scale["status"]["selector"] == "app.kubernetes.io/name=txnkeeper,app.kubernetes.io/instance=pas,"
            "app.kubernetes.io/component=store"
        )
        wait_for(lambda: sts_replicas() == 3, "the StatefulSet at 3", 30)
        args = _args(apps)
        assert args[args.index("--replicas") + 1] == "1"  # the first record's count, for good
        # No pod runs here (no nodes): nothing moves until pods are Ready and hold the record.
        wait_for(
            lambda: Placement.loads(placement_cm()["placement.json"]).members.keys() == {0, 1, 2},
            "members",
            30,
        )
        status = cr()["status"]
        assert status["placement"]["phase"] == "ScalingOut", status["placement"]

        # A history in which shard 2 went to pod 2 and its move back failed for good.
        record = Placement.loads(placement_cm()["placement.json"])
        moved = record.with_owner(2, 2)
        moves = json.loads(placement_cm()["moves.json"])
        moves["failed"] = [{"id": "s2-m9", "unit": 2, "source": 2, "target": 0, "error": "crc32c mismatch"}]
        core.patch_namespaced_config_map(
            "pas-placement",
            "scale",
            {"data": {"placement.json": moved.dumps(), "moves.json": json.dumps(moves)}},
        )
        custom.patch_namespaced_custom_object_scale(
            "txnkeeper.io", "v1", "scale", plural, "pas", {"spec": {"replicas": 1}}
        )

        def refused() -> dict[str, Any] | None:
            conditions = (cr().get("status") or {}).get("conditions") or []
            found = [c for c in conditions if c["type"] == "ScaleInSafe" and c["status"] == "False"]
            return found[0] if found else None

        condition = wait_for(refused, "ScaleInSafe=False", 30)
        assert condition["reason"] == "WouldLoseData"
        assert "shard 2" in condition["message"] and "txnkeeper.io/rebalance=now" in condition["message"]
        assert cr()["status"]["placement"]["phase"] == "ScaleInRefused"
        wait_for(
            lambda: [e for e in core.list_namespaced_event("scale").items if e.reason == "ScaleInRefused"],
            "a ScaleInRefused Event",
            20,
        )
        assert sts_replicas() == 3
    finally:
        _stop(operator)
        log.close()
    text = (tmp_path / "operator.log").read_text(errors="replace")
    assert "Forbidden" not in text and "403" not in text, text[-3000:]


def _args(apps: Any) -> list[str]:
    """The runtime container's args in StatefulSet scale/pas."""
    sts = apps.read_namespaced_stateful_set("pas", "scale")
    return list(sts.spec.template.spec.containers[0].args)


def _get(read: Callable[[], Any]) -> Any:
    from kubernetes import client

    try:
        return read()
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _operator_kubeconfig(api: ApiClient, admin_kubeconfig: Path, tmp_path: Path) -> Path:
    """The chart's ServiceAccount and RBAC, applied as rendered; a kubeconfig with its token."""
    from kubernetes import client, utils

    if not Path(HELM).exists():
        pytest.skip("helm not built (run `make helm`): the chart's RBAC cannot be rendered")
    rendered = subprocess.run(
        [
            HELM,
            "template",
            "t",
            str(ROOT / "helm/txnkeeper"),
            "--namespace",
            "tk",
            "--kube-version",
            "1.37.0",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    with contextlib.suppress(client.ApiException):  # created by an earlier test of this module
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "tk"}})  # type: ignore[arg-type]
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            if "helm.sh/hook" in (doc["metadata"].get("annotations") or {}):
                continue
            # kubernetes.utils is unannotated; FailToCreateError: it exists from an earlier test.
            with contextlib.suppress(utils.FailToCreateError):
                utils.create_from_dict(api, doc, namespace="tk")  # type: ignore[no-untyped-call]
    request = client.CoreV1Api(api).create_namespaced_service_account_token(
        "t-txnkeeper-operator",
        "tk",
        {"spec": {"expirationSeconds": 3600}},  # type: ignore[arg-type]
    )
    assert request.status is not None
    token = request.status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "c", "user": "operator"}}],
        "current-context": "operator",
    }
    path = tmp_path / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path
