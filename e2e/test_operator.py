"""The operator, installed by helm, driving TransactionCoordinators and PendingAckStores end to end.

Why: this is what a user does (helm install, kubectl apply, watch the rollout) and what must never go
wrong: an upgrade that enables the batch log in the safe order, a downgrade that waits for the Spark
verifier while batched data lives, an operator killed and a pod deleted mid-rollout, an invalid
resource refused by the API server, and at the end every acknowledged message still there.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from e2e.helpers import (
    IMAGE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    VERIFIER_IMAGE,
    Cluster,
    http_get,
    http_post,
    name_of,
    pod_ready,
    to_json,
    wait_for,
)

Obj = dict[str, Any]
GROUP, VERSION = "txnkeeper.io", "v1"
TC, PAS = "transactioncoordinators", "pendingackstores"
OPERATOR_NS = "txnkeeper-system"
RELEASE = "txnkeeper"
CHART = Path(__file__).resolve().parents[1] / "helm" / "txnkeeper"
WORKLOAD = (Path(__file__).parent / "workload.py").read_text()
OLD, NEW = "1.0.0", "2.0.0"
TOPICS = "persistent://public/default/orders,persistent://public/default/payments"
FIRST_TOPIC = TOPICS.split(",", maxsplit=1)[0]


# --- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def operator(operator_release: str) -> str:
    """The chart installed with the real helm (CRDs, RBAC, operator Deployment): once per pytest
    process (e2e/conftest.py, ``operator_release``), shared by every module that names this fixture."""
    return operator_release


def install_operator(cluster: Cluster) -> None:
    """``helm upgrade --install`` of the chart, then the operator pod Ready (the caller holds the
    operator lock: an install beside a test that patched the Deployment would undo its patch)."""
    repo, _, tag = IMAGE.rpartition(":")
    verifier_repo, _, verifier_tag = VERIFIER_IMAGE.rpartition(":")
    # The operator's namespace enforces Pod Security "restricted" too (its pod and the chart's test pod).
    psa = "pod-security.kubernetes.io/enforce=restricted"
    if cluster.core.list_namespace(field_selector=f"metadata.name={OPERATOR_NS}").items:
        cluster.kubectl("label", "--overwrite", "namespace", OPERATOR_NS, psa)
    else:
        cluster.kubectl("create", "namespace", OPERATOR_NS)
        cluster.kubectl("label", "namespace", OPERATOR_NS, psa)
    cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART),
        "--namespace", OPERATOR_NS,
        "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
        "--set", f"verifierImage.repository={verifier_repo}", "--set", f"verifierImage.tag={verifier_tag}",
        "--set", "operator.reconcileSeconds=2",
        # The chart turns TLS on for new installs; these tests speak plaintext to the pods unless a
        # resource asks for TLS itself (e2e/test_tls.py does: spec.tls.enabled).
        "--set", "tls.enabled=false",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    wait_for(lambda: _operator_pod(cluster), "the operator pod Ready", timeout=120)


def uninstall_operator(cluster: Cluster) -> None:
    cluster.record_containers(OPERATOR_NS)
    cluster.helm("uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait", check=False)


def _operator_pod(cluster: Cluster) -> str | None:
    for pod in cluster.core.list_namespaced_pod(OPERATOR_NS).items:
        obj: Obj = to_json(cluster.api, pod)
        if (
            pod_ready(obj)
            and not obj["metadata"].get("deletionTimestamp")
            and "helm.sh/hook" not in (obj["metadata"].get("annotations") or {})
        ):
            return str(obj["metadata"]["name"])
    return None


# --- custom resources -------------------------------------------------------------------------------
def apply(cluster: Cluster, ns: str, manifest: str) -> None:
    cluster.kubectl("-n", ns, "apply", "-f", "-", input_text=manifest)


def tc_manifest(version: str, batched: bool) -> str:
    return f"""
apiVersion: txnkeeper.io/v1
kind: TransactionCoordinator
metadata: {{name: txn}}
spec: {{version: "{version}", replicas: 3, coordinators: 3, batchedWrite: {{enabled: {str(batched).lower()}}},
        storage: {{size: 128Mi}}}}
"""


def pas_manifest(version: str, batched: bool) -> str:
    return f"""
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {{name: acks}}
spec: {{version: "{version}", replicas: 2, batchedWrite: {{enabled: {str(batched).lower()}}},
        storage: {{size: 128Mi}}}}
"""


def resources(version: str, batched: bool) -> str:
    return tc_manifest(version, batched) + "---" + pas_manifest(version, batched)


def get_cr(cluster: Cluster, ns: str, plural: str, name: str) -> Obj:
    # Typed `object` by the client: a custom object is the JSON document.
    return cast(Obj, cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name))


def condition(obj: Obj, type_: str) -> Obj:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return dict(c)
    return {}


def summary(obj: Obj) -> str:
    st = obj.get("status", {})
    conds = {
        c["type"]: f"{c['status']}({c.get('reason')}: {c.get('message')})" for c in st.get("conditions", [])
    }
    pods = [(p.get("name"), p.get("version"), p.get("batchLog"), p.get("ready")) for p in st.get("pods", [])]
    return json.dumps(
        {"phase": st.get("phase"), "reason": st.get("phaseReason"), "pods": pods, "conditions": conds}
    )


def wait_cr(  # noqa: PLR0917 (reads as a sentence at the call sites)
    cluster: Cluster,
    ns: str,
    plural: str,
    name: str,
    pred: Callable[[Obj], bool],
    what: str,
    timeout: float = 300,
) -> Obj:
    def probe() -> Obj | None:
        obj = get_cr(cluster, ns, plural, name)
        return obj if pred(obj) else None

    return wait_for(
        probe,
        f"{plural}/{name}: {what}",
        timeout,
        interval=0.5,
        describe=lambda: summary(get_cr(cluster, ns, plural, name)),
    )


def settled_at(version: str, batch_log: str) -> Callable[[Obj], bool]:
    """Ready, reconciled for the current generation, every pod at `version` with the batch log as said."""

    def pred(obj: Obj) -> bool:
        st = obj.get("status", {})
        pods = st.get("pods", [])
        return (
            st.get("observedGeneration") == obj["metadata"]["generation"]
            and st.get("phase") == "Ready"
            and condition(obj, "Ready").get("status") == "True"
            and bool(pods)
            and all(p.get("version") == version and p.get("ready") for p in pods)
            and st.get("batchLog") == batch_log
        )

    return pred


def pod_versions(obj: Obj) -> list[str]:
    return [str(p.get("version")) for p in obj.get("status", {}).get("pods", [])]


# --- the workload, run in the cluster ------------------------------------------------------------
def addresses(cluster: Cluster, ns: str, name: str, replicas: int) -> str:
    out = []
    for i in range(replicas):
        pod = cluster.pod(ns, f"{name}-{i}")
        assert pod is not None and pod_ready(pod), f"{name}-{i} not ready"
        out.append(f"{pod['status']['podIP']}:6650")
    return ",".join(out)


def run_workload(
    cluster: Cluster, ns: str, *args: str, timeout: float = 180, tls_secret: str | None = None
) -> Obj:
    """Run e2e/workload.py as a Job in `ns` and return its RESULT. With `tls_secret` (a resource's TLS
    Secret: tls.crt, tls.key, ca.crt) the Job mounts it and connects over TLS with it (mutual TLS)."""
    volumes: list[Obj] = [{"name": "workload", "configMap": {"name": "workload"}}]
    mounts: list[Obj] = [{"name": "workload", "mountPath": "/workload"}]
    env: list[Obj] = []
    if tls_secret is not None:
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret}})
        mounts.append({"name": "tls", "mountPath": "/etc/txnkeeper/tls", "readOnly": True})
        env = [
            {"name": f"TXNKEEPER_TLS_{key}_FILE", "value": f"/etc/txnkeeper/tls/{file}"}
            for key, file in (("CA", "ca.crt"), ("CERT", "tls.crt"), ("KEY", "tls.key"))
        ]
    config_map = {"metadata": {"name": "workload"}, "data": {"workload.py": WORKLOAD}}
    try:
        # A dict body where the signature says V1ConfigMap: the client validates it into one.
        cluster.core.create_namespaced_config_map(ns, config_map)  # type: ignore[arg-type]
    except client.ApiException as e:
        if e.status != 409:
            raise
    name = f"workload-{args[0]}-{uuid.uuid4().hex[:5]}"
    cluster.batch.create_namespaced_job(
        ns,
        {  # type: ignore[arg-type]  # a dict body for a V1Job: the client validates it into one
            "metadata": {"name": name},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "securityContext": RESTRICTED_POD,
                        "containers": [
                            {
                                "name": "workload",
                                "image": IMAGE,
                                "securityContext": RESTRICTED_CONTAINER,
                                "command": ["python", "/workload/workload.py", *args],
                                "env": env,
                                "volumeMounts": mounts,
                            }
                        ],
                        "volumes": volumes,
                    }
                },
            },
        },
    )

    def finished() -> str | None:
        job = cluster.batch.read_namespaced_job(name, ns)
        assert job.status is not None
        for c in job.status.conditions or []:
            if c.type in ("Complete", "Failed") and c.status == "True":
                return str(c.type)
        return None

    outcome = wait_for(finished, f"job {name}", timeout)
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
    logs = cluster.pod_logs(ns, name_of(pods[0]))
    assert outcome == "Complete", f"workload job {name} failed:\n{logs}"
    lines = [line for line in logs.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT from {name}:\n{logs}"
    result: Obj = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def batched_records_written(cluster: Cluster, ns: str, pod: str, prefix: str) -> float:
    """From the pod's Prometheus metrics: how many records its buffered writers put in batches."""
    with cluster.endpoint(ns, pod, 8080) as ep:
        code, text = http_get(f"http://{ep}/metrics")
    assert code == 200, text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{prefix}_bufferedwriter_batch_records_sum(?:{{[^}}]*}})? ([0-9.e+]+)$", line)
        if m:
            total += float(m.group(1))
    return total


# --- tests ----------------------------------------------------------------------------------------
@pytest.mark.disrupts_operator  # the chart's test pod checks the operator: not while another test stops it
def test_helm_chart_installs_a_working_operator(cluster: Cluster, operator: str) -> None:
    crds = {
        name_of(c) for c in client.ApiextensionsV1Api(cluster.api).list_custom_resource_definition().items
    }
    assert {"transactioncoordinators.txnkeeper.io", "pendingackstores.txnkeeper.io"} <= crds
    result = cluster.helm("test", RELEASE, "--namespace", OPERATOR_NS, "--timeout", "180s")
    assert "Phase:" in result.stdout and "Succeeded" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            '{version: "2.0.0", batchedWrite: {enabled: true, maxRecords: 1}}',
            "batchedWrite.maxRecords must be at least 2 when batchedWrite.enabled is true",
        ),
        ('{version: "9.1.0"}', "spec.version must be a known release line (1.x, 2.x, 3.x)"),
        ("{replicas: 2}", "spec.version: Required value"),
        # The limits below come from the runtime's own contract (txnkeeper.contract) and CEL rules that
        # cel-python only approximates in tests/operator: here the real API server evaluates them.
        (
            '{version: "2.0.0", batchedWrite: {maxSizeBytes: 33554432}}',
            "spec.batchedWrite.maxSizeBytes in body should be less than or equal to 16777216",
        ),
        (
            '{version: "2.0.0", batchedWrite: {maxDelayMillis: 1000000000000}}',
            "spec.batchedWrite.maxDelayMillis in body should be less than or equal to 60000",
        ),
        ('{version: "2.0.0", storage: {size: "-1Gi"}}', "storage.size must be greater than zero"),
        ('{version: "2.0.0", storage: {size: "0"}}', "storage.size must be greater than zero"),
        ('{version: "2.0.0", resources: {requests: {cpu: "-1"}}}', "resources.requests must not be negative"),
        (
            '{version: "2.0.0", resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}}',
            "resources.requests must not exceed resources.limits",
        ),
        (
            '{version: "2.0.0", verifier: {schedule: "every hour"}}',
            "spec.verifier.schedule in body should match",
        ),
        (
            '{version: "2.0.0", verifier: {sparkMaster: "yarn"}}',
            "spec.verifier.sparkMaster in body should match",
        ),
        (
            '{version: "2.0.0", maxUnavailable: 0}',
            "spec.maxUnavailable in body should be greater than or equal to 1",
        ),
        (
            '{version: "2.0.0", storage: {storageClassName: "Fast_SSD"}}',
            "storage.storageClassName in body should match",
        ),
        ('{version: "2.0.0", image: ""}', "spec.image in body should be at least 1 chars long"),
    ],
)
def test_invalid_resource_is_rejected_by_the_api_server(
    cluster: Cluster, operator: str, namespace: str, spec: str, message: str
) -> None:
    manifest = (
        f"apiVersion: txnkeeper.io/v1\nkind: TransactionCoordinator\nmetadata: {{name: bad}}\nspec: {spec}\n"
    )
    result = cluster.kubectl("-n", namespace, "apply", "-f", "-", input_text=manifest, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "is invalid" in result.stderr
    listed = cast(Obj, cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, TC))
    assert not listed["items"]


@pytest.mark.timeout(1500)
@pytest.mark.disrupts_operator  # deletes the operator pod mid-rollout
def test_upgrade_then_verified_downgrade_keeps_every_acknowledged_message(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    ns = namespace
    # 1. kubectl apply both resources at the old release; they become Ready.
    apply(cluster, ns, resources(OLD, batched=False))
    for plural, name in ((TC, "txn"), (PAS, "acks")):
        wait_cr(cluster, ns, plural, name, settled_at(OLD, "Disabled"), f"Ready at {OLD}", timeout=240)

    # 2. Transactional load through the client (committed and aborted transactions, transactional acks
    #    on the subscription "work"); "audit" exists first and never acknowledges, so it must end up
    #    holding every committed message.
    stores = addresses(cluster, ns, "acks", 2)
    run_workload(cluster, ns, "subscribe", "--stores", stores, "--topics", TOPICS, "--subscription", "audit")
    load1 = run_workload(
        cluster, ns, "produce", "--coordinators", addresses(cluster, ns, "txn", 3),
        "--stores", addresses(cluster, ns, "acks", 2), "--topics", TOPICS, "--txns", "8", "--tag", "old",
    )  # fmt: skip
    assert load1["committedTxns"] == 6 and load1["abortedTxns"] == 2

    # 3. Upgrade with batching: the coordinators first (the operator is killed mid-rollout), then the
    #    pending-ack stores (one of their pods is deleted mid-rollout).
    apply(cluster, ns, tc_manifest(NEW, batched=True))
    mid = wait_cr(
        cluster, ns, TC, "txn",
        lambda o: NEW in pod_versions(o) and set(pod_versions(o)) != {NEW},
        "the upgrade under way (some pods new, some old)", timeout=240,
    )  # fmt: skip
    assert mid["status"]["batchLog"] == "Disabled", "batch log enabled before every pod was upgraded"
    old_operator = _operator_pod(cluster)
    assert old_operator is not None
    cluster.core.delete_namespaced_pod(old_operator, OPERATOR_NS)
    wait_for(
        lambda: (p := _operator_pod(cluster)) is not None and p != old_operator,
        "a new operator pod Ready",
        120,
    )
    apply(cluster, ns, pas_manifest(NEW, batched=True))
    mid = wait_cr(
        cluster, ns, PAS, "acks",
        lambda o: NEW in pod_versions(o) and set(pod_versions(o)) != {NEW},
        "the PAS upgrade under way (one pod new, one old)", timeout=240,
    )  # fmt: skip
    victim = next(p["name"] for p in mid["status"]["pods"] if p.get("version") == OLD)
    cluster.core.delete_namespaced_pod(victim, ns)
    for plural, name in ((TC, "txn"), (PAS, "acks")):
        done = wait_cr(
            cluster, ns, plural, name, settled_at(NEW, "Enabled"), f"Ready at {NEW}, batching", 420
        )
        assert condition(done, "BatchLogEnabled")["status"] == "True", summary(done)
    tc = get_cr(cluster, ns, TC, "txn")
    coordinators = tc["status"]["coordinatorArray"]
    assert len(coordinators) == 3
    assert all(c["transactionLogBatchedWriteStat"]["batchEnabled"] for c in coordinators), coordinators
    pas = get_cr(cluster, ns, PAS, "acks")
    subscriptions = pas["status"]["subscriptionArray"]
    assert subscriptions, "no pending-ack store reported (the load acknowledged in transactions)"
    assert all(s["transactionPendingAckBatchedWriteStat"]["batchEnabled"] for s in subscriptions), (
        subscriptions
    )

    # 4. Load at the new release: the logs are written in batches now.
    load2 = run_workload(
        cluster, ns, "produce", "--coordinators", addresses(cluster, ns, "txn", 3),
        "--stores", addresses(cluster, ns, "acks", 2), "--topics", TOPICS, "--txns", "8", "--tag", "new",
    )  # fmt: skip
    batched = sum(batched_records_written(cluster, ns, f"txn-{i}", "pulsar_txn_tc") for i in range(3))
    assert batched > 0, "no transaction-log record was written in a batch after the upgrade"

    # 5. Downgrade while a transaction holds batched records: the gate holds, then opens after it ends.
    held = run_workload(
        cluster, ns, "hold", "--coordinators", addresses(cluster, ns, "txn", 3),
        "--stores", addresses(cluster, ns, "acks", 2), "--topic", FIRST_TOPIC, "--timeout-ms", "150000",
    )  # fmt: skip
    assert held["status"] == "OPEN"
    apply(cluster, ns, resources(OLD, batched=False))
    blocked = wait_cr(
        cluster, ns, TC, "txn",
        lambda o: condition(o, "DowngradeSafe").get("reason") == "LiveBatchedData"
        and condition(o, "DowngradeSafe").get("status") == "False"
        and o["status"].get("phase") == "DowngradeBlocked",
        "the downgrade held by the verifier (DowngradeBlocked, DowngradeSafe=False LiveBatchedData)", 240,
    )  # fmt: skip
    # The invariant (it holds at every moment, so also at this one): no pod runs the old release while
    # batched data lives.
    assert set(pod_versions(blocked)) == {NEW}, (
        f"a pod was downgraded while batched data lived: {summary(blocked)}"
    )
    # The held transaction times out (the coordinator aborts it), its records are deleted, the ledgers
    # trimmed; the verifier then proves nothing batched is live and the old release rolls out.
    for plural, name in ((TC, "txn"), (PAS, "acks")):
        done = wait_cr(cluster, ns, plural, name, settled_at(OLD, "Disabled"), f"downgraded to {OLD}", 600)
        assert condition(done, "DowngradeSafe")["status"] == "True", summary(done)

    # 6. Every committed message is still there (on "audit"); nothing aborted ever is; no message acked
    #    in a committed transaction comes back (on "work"); the ack of the timed-out transaction was
    #    rolled back (on "hold", its message is delivered again).
    stores = addresses(cluster, ns, "acks", 2)
    audit = run_workload(
        cluster, ns, "read", "--stores", stores, "--topics", TOPICS, "--subscription", "audit"
    )
    work = run_workload(cluster, ns, "read", "--stores", stores, "--topics", TOPICS, "--subscription", "work")
    hold = run_workload(
        cluster, ns, "read", "--stores", stores, "--topics", FIRST_TOPIC, "--subscription", "hold"
    )
    for topic in TOPICS.split(","):
        seen = audit[topic]
        committed = load1["committed"][topic] + load2["committed"][topic]
        aborted = load1["aborted"][topic] + load2["aborted"][topic] + [held["payload"]]
        assert sorted(set(committed) - set(seen)) == [], f"{topic}: committed messages lost"
        assert sorted(set(aborted) & set(seen)) == [], f"{topic}: aborted messages delivered"
        assert len(seen) == len(set(seen)), f"{topic}: duplicates"
        assert sorted(set(committed) & set(work[topic])) == [], f"{topic}: acked messages redelivered"
    assert held["acked"] in hold[FIRST_TOPIC], "the timed-out transaction's ack was not rolled back"


# --- Spark on Kubernetes: the verifier's executors as pods ------------------------------------------
SPARK_K8S = "k8s://https://kubernetes.default.svc"
VERIFIER_OF = "txnkeeper.io/verifier-of"


def spark_resources(version: str, batched: bool) -> str:
    """One coordinator pod and one store pod whose verifier runs Spark's executors as pods."""
    verifier = f'{{sparkMaster: "{SPARK_K8S}", retrySeconds: 5}}'
    flag = str(batched).lower()
    return f"""
apiVersion: txnkeeper.io/v1
kind: TransactionCoordinator
metadata: {{name: txn}}
spec: {{version: "{version}", replicas: 1, coordinators: 1, batchedWrite: {{enabled: {flag}}},
        storage: {{size: 128Mi}}, verifier: {verifier}}}
---
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {{name: acks}}
spec: {{version: "{version}", replicas: 1, batchedWrite: {{enabled: {flag}}}, storage: {{size: 128Mi}},
        verifier: {verifier}}}
"""


class ExecutorPods:
    """Every Spark executor pod seen in a namespace (label spark-role=executor), recorded by a thread
    that lists them once a second: they live only while a verifier job runs."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self._cluster, self._ns = cluster, ns
        self.seen: dict[str, Obj] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="executor-pods", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> ExecutorPods:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for pod in self.now():
                    self.seen[str(pod["metadata"]["name"])] = pod
            except Exception as e:  # an API hiccup: the next round sees the pods again
                self.errors.append(repr(e))
            self._stop.wait(1.0)

    def now(self) -> list[Obj]:
        pods = self._cluster.core.list_namespaced_pod(self._ns, label_selector="spark-role=executor")
        return [to_json(self._cluster.api, p) for p in pods.items]


def _can_i(cluster: Cluster, ns: str, verb: str, resource: str, where: str | None = None) -> bool:
    """kubectl auth can-i as the verifier's account (`pods/exec`: the subresource, not a pod named exec)."""
    account = f"system:serviceaccount:{ns}:txn-verifier"
    kind, _, sub = resource.partition("/")
    extra = ["--subresource", sub] if sub else []
    result = cluster.kubectl(
        "auth", "can-i", verb, kind, *extra, "--as", account, "-n", where or ns, check=False
    )
    return result.stdout.strip() == "yes"


def _abort(cluster: Cluster, ns: str, txn: str) -> None:
    """Abort a transaction through the coordinator pod's admin API (its token from the operator's Secret)."""
    secret = cluster.core.read_namespaced_secret("txn-admin-token", ns)
    token = base64.b64decode((secret.data or {})["token"]).decode()
    ids = re.search(r"\((\d+),(\d+)\)", txn)  # the workload prints "Transaction(most,least)[OPEN]"
    assert ids is not None, f"no transaction id in {txn!r}"
    most, least = ids.groups()
    with cluster.endpoint(ns, "txn-0", 8080) as ep:
        url = f"http://{ep}/admin/v3/transactions/abortTransaction/{most}/{least}"
        code, text = http_post(url, token=token, timeout=30)
    assert code in (200, 202), f"abort {txn}: HTTP {code} {text}"


def _verifier_job_pods(cluster: Cluster, ns: str) -> dict[str, Obj]:
    pods = cluster.core.list_namespaced_pod(ns, label_selector=f"{VERIFIER_OF}=txn").items
    return {name_of(p): to_json(cluster.api, p) for p in pods}


@pytest.mark.timeout(900)
def test_spark_on_kubernetes_verifier_gates_the_downgrade(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    ns = namespace
    apply(cluster, ns, spark_resources(NEW, batched=True))
    for plural, name in ((TC, "txn"), (PAS, "acks")):
        wait_cr(cluster, ns, plural, name, settled_at(NEW, "Enabled"), f"Ready at {NEW}, batching", 300)

    # The driver's account may manage pods in its own namespace, and nothing else of Spark's.
    for verb in ("create", "delete", "deletecollection", "get", "list", "watch"):
        assert _can_i(cluster, ns, verb, "pods"), f"the verifier cannot {verb} pods"
    assert not _can_i(cluster, ns, "create", "pods", where=OPERATOR_NS), "executor pods elsewhere"
    for verb, resource in (
        ("create", "configmaps"), ("create", "services"), ("create", "persistentvolumeclaims"),
        ("get", "secrets"), ("create", "pods/exec"), ("deletecollection", "services"),
    ):  # fmt: skip
        assert not _can_i(cluster, ns, verb, resource), f"the verifier may {verb} {resource}"

    # A transaction holds batched records while the coordinator is downgraded; it stays open (its
    # timeout is far away) until this test aborts it, so the gate must hold until then.
    coordinators, stores = addresses(cluster, ns, "txn", 1), addresses(cluster, ns, "acks", 1)
    held = run_workload(
        cluster, ns, "hold", "--coordinators", coordinators, "--stores", stores,
        "--topic", FIRST_TOPIC, "--timeout-ms", "600000",
    )  # fmt: skip
    assert held["status"] == "OPEN"
    with ExecutorPods(cluster, ns) as executors:
        apply(cluster, ns, spark_resources(OLD, batched=False).split("---")[0])
        blocked = wait_cr(
            cluster, ns, TC, "txn",
            lambda o: condition(o, "DowngradeSafe").get("reason") == "LiveBatchedData"
            and o["status"].get("phase") == "DowngradeBlocked",
            "the downgrade held by the verifier on Kubernetes executors", 300,
        )  # fmt: skip
        assert set(pod_versions(blocked)) == {NEW}, summary(blocked)
        blocked_by = set(executors.seen)
        _abort(cluster, ns, held["txn"])
        done = wait_cr(cluster, ns, TC, "txn", settled_at(OLD, "Disabled"), f"downgraded to {OLD}", 300)
        assert condition(done, "DowngradeSafe")["status"] == "True", summary(done)

    # The executors were pods of the verifier image, restricted, owned by a verifier job's pod.
    assert len(blocked_by) >= 2, f"the blocking verdict came without executor pods: {executors.errors}"
    drivers = _verifier_job_pods(cluster, ns)
    owners: set[str] = set()
    for name, pod in executors.seen.items():
        (container,) = pod["spec"]["containers"]
        assert container["image"] == VERIFIER_IMAGE, (name, container["image"])
        assert pod["spec"].get("automountServiceAccountToken") is False, name
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        (owner,) = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "Pod" and owner["name"] in drivers, (name, owner, sorted(drivers))
        owners.add(owner["name"])
    # The report that released the gate says safe, and came from a job that succeeded on executor pods.
    report_cm = cluster.core.read_namespaced_config_map("txn-verifier-report", ns)
    report = json.loads((report_cm.data or {})["report.json"])
    assert report["safe"] is True, report
    succeeded = {name for name, pod in drivers.items() if pod["status"].get("phase") == "Succeeded"}
    assert succeeded & owners, f"no successful verifier run had executor pods: {succeeded}, {owners}"
    # Spark deleted its executors when each job ended (and they go with their driver pod anyway).
    wait_for(lambda: not executors.now(), "no executor pod left", 120)
