"""Faults only a real container runtime produces, and that nothing acknowledged is lost through them.

Why: a process test can SIGKILL a process; only a runtime kills a whole container (runc, through
containerd: the process tree, its cgroup, the kubelet's restart with back-off), evicts a pod through
the Eviction API so that the StatefulSet brings it back on the same PersistentVolumeClaim, and lets the
kernel OOM-kill a container that outgrows its cgroup's memory limit. Each test judges settled states:
the pod restarted and Ready, the rollout settled, every committed message read back.

  * a store container SIGKILLed by containerd while transactions are in flight on it;
  * a store pod evicted (policy/v1 Eviction) and rescheduled onto its own claim;
  * the operator's container OOM-killed during a rollout (a tiny memory limit), the rollout resumed.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client

from e2e.helpers import Cluster, pod_ready, to_json, wait_for
from e2e.test_operator import (  # noqa: F401 - `operator` is a fixture used by name
    NEW,
    OLD,
    OPERATOR_NS,
    PAS,
    TC,
    TOPICS,
    addresses,
    apply,
    condition,
    operator,
    pod_versions,
    resources,
    run_workload,
    settled_at,
    summary,
    tc_manifest,
    wait_cr,
)
from e2e.test_runtime_pods import serve_statefulset
from e2e.workload import Record, produce, verify

Obj = dict[str, Any]
TOPIC = "persistent://public/default/faults"
PAUSE = "txnkeeper.io/pause-reconciliation"


def _start_runtime_pods(cluster: Cluster, ns: str) -> tuple[list[str], list[str]]:
    """One coordinator pod and two store pods (as test_runtime_pods runs them); their addresses."""
    if not cluster.pods_routed:
        pytest.skip("these tests reach pods by pod IP, and this machine does not route the pod network")
    secret = {
        "metadata": {"name": "admin-token"},
        "stringData": {"token": "t0ken", "cluster": "e2e-cluster-secret-0123456789"},
    }
    cluster.core.create_namespaced_secret(ns, secret)  # type: ignore[arg-type]  # a dict body
    tc_set = serve_statefulset("tc", "coordinator", 1, ["--coordinators=1", "--coordinator-ids=0"])
    cluster.apps.create_namespaced_stateful_set(ns, tc_set)  # type: ignore[arg-type]  # a dict body
    cluster.apps.create_namespaced_stateful_set(ns, serve_statefulset("store", "store", 2, []))  # type: ignore[arg-type]
    for pod in ("tc-0", "store-0", "store-1"):
        wait_for(lambda pod=pod: pod_ready(cluster.pod(ns, pod)), f"{pod} Ready", timeout=180)  # type: ignore[misc]
    return _addresses(cluster, ns, "tc", 1), _addresses(cluster, ns, "store", 2)


def _addresses(cluster: Cluster, ns: str, prefix: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        pod = cluster.pod(ns, f"{prefix}-{i}")
        assert pod is not None and pod_ready(pod), f"{prefix}-{i} not Ready"
        out.append(f"{pod['status']['podIP']}:6650")
    return out


def _container_status(cluster: Cluster, ns: str, pod: str) -> Obj:
    obj = cluster.pod(ns, pod)
    assert obj is not None, f"{ns}/{pod} is gone"
    status: Obj = obj["status"]["containerStatuses"][0]
    return status


@dataclass
class Outcomes:
    """What the looping client was told, transaction by transaction (written by its thread)."""

    committed: list[bytes] = field(default_factory=list)
    unknown: list[tuple[Any, list[bytes]]] = field(default_factory=list)  # (transaction, its payloads)
    commits_after_kill: int = 0
    # The test asks the loop to stop between its sends and its commit (hold), the loop says it did
    # (holding), the test kills the store and lets it go on (release): a transaction is surely open on
    # the store when its container dies.
    hold: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    held: list[bytes] = field(default_factory=list)
    killed: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)


async def _loop_transactions(
    coordinators: list[str], stores: list[str], out: Outcomes
) -> list[tuple[Any, str]]:
    """Commit transactions of 3 messages each until told to stop; a transaction whose commit did not
    answer (the store was being killed) is kept with its payloads. Returns each unknown transaction's
    status as the coordinator reports it once the store is back."""
    from txnkeeper.client import Client
    from txnkeeper.errors import ServiceError

    async with Client(coordinators=coordinators, stores=stores) as client:
        producer = None
        i = 0
        while not out.stop.is_set():
            payloads = [f"loop-{uuid.uuid4().hex[:8]}-{i}-{j}".encode() for j in range(3)]
            i += 1
            txn = None
            try:
                if producer is None:
                    producer = await client.create_producer(TOPIC)
                txn = await client.new_transaction(timeout_ms=60_000)
                for p in payloads:
                    await producer.send(p, txn=txn)
                if out.hold.is_set() and not out.holding.is_set():
                    out.held.extend(payloads)
                    out.holding.set()
                    await asyncio.to_thread(out.release.wait, 300)
                await txn.commit()
            except (TimeoutError, ServiceError, OSError) as err:
                out.errors.append(f"{type(err).__name__}: {err}")
                if txn is not None:
                    # What an application does with a transaction it lost track of: abort it. A commit
                    # that did reach the coordinator makes this fail; the status says which it was.
                    await asyncio.gather(txn.abort(), return_exceptions=True)
                    out.unknown.append((txn, payloads))
                if producer is not None:
                    await asyncio.gather(producer.close(), return_exceptions=True)
                producer = None
                await asyncio.sleep(0.5)  # back-off while the store restarts, not a synchronisation
                continue
            out.committed.extend(payloads)
            if out.killed.is_set():
                out.commits_after_kill += 1
        statuses = []
        for txn, _payloads in out.unknown:
            statuses.append((txn, await _settled_status(client, txn)))
        return statuses


async def _settled_status(client: Any, txn: Any) -> str:
    """The transaction's final status (COMMITTED or ABORTED), waiting out COMMITTING/ABORTING."""
    from txnkeeper.errors import ServiceError

    deadline = asyncio.get_running_loop().time() + 120
    status = "?"
    while asyncio.get_running_loop().time() < deadline:
        try:
            status = await client.transaction_status(txn)
        except ServiceError as err:
            status = f"unanswered ({err})"
        if status in ("COMMITTED", "ABORTED"):
            return status
        await asyncio.sleep(0.5)  # polling a remote state with a deadline
    return status


def test_store_container_killed_by_the_runtime_mid_transaction_loses_nothing(
    cluster: Cluster, namespace: str
) -> None:
    ns = namespace
    coordinators, stores = _start_runtime_pods(cluster, ns)
    before: Record = asyncio.run(produce(coordinators, stores, [TOPIC], txns=6))
    owner = next(f"store-{i}" for i, a in enumerate(stores) if a == _owner_address(stores))
    out = Outcomes()
    statuses: list[tuple[Any, str]] = []
    thread = threading.Thread(
        target=lambda: statuses.extend(asyncio.run(_loop_transactions(coordinators, stores, out))),
        daemon=True,
    )
    thread.start()
    wait_for(lambda: len(out.committed) >= 30, "the loop committing transactions", timeout=120)
    out.hold.set()
    wait_for(out.holding.is_set, "a transaction open on the store, its messages sent", timeout=60)
    killed = cluster.kill_container(ns, owner, "txnkeeper")
    out.killed.set()
    out.release.set()
    wait_for(
        lambda: (
            _container_status(cluster, ns, owner)["restartCount"] == 1 and pod_ready(cluster.pod(ns, owner))
        ),
        f"{owner} restarted by the kubelet and Ready",
        timeout=180,
    )
    wait_for(lambda: out.commits_after_kill >= 10, "commits again after the restart", timeout=180)
    out.stop.set()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the transaction loop did not stop"

    status = _container_status(cluster, ns, owner)
    assert status["lastState"]["terminated"]["exitCode"] == 137, status  # SIGKILL, from the runtime
    assert out.held and (out.held[0] in out.committed or any(out.held == p for _t, p in out.unknown))
    assert status["containerID"].partition("://")[2] != killed
    # Every commit that answered is there exactly once, and so is everything committed before; a
    # transaction whose commit got no answer is all there if the coordinator says COMMITTED, else none
    # of it is.
    committed = Record(committed={TOPIC: before.committed[TOPIC] + out.committed}, aborted=before.aborted)
    for txn, outcome in statuses:
        payloads = next(p for t, p in out.unknown if t is txn)
        if outcome == "COMMITTED":
            committed.committed[TOPIC].extend(payloads)
        else:
            assert outcome == "ABORTED", f"{txn}: {outcome} after the store came back"
            committed.aborted.setdefault(TOPIC, []).extend(payloads)
    asyncio.run(verify(_addresses(cluster, ns, "store", 2), committed))


def _owner_address(stores: list[str]) -> str:
    """The store the client places TOPIC on (the client's placement: crc32 over the store list)."""
    return stores[zlib.crc32(TOPIC.encode()) % len(stores)]


def test_store_pod_evicted_and_rescheduled_onto_its_claim_keeps_every_commit(
    cluster: Cluster, namespace: str
) -> None:
    ns = namespace
    coordinators, stores = _start_runtime_pods(cluster, ns)
    record = asyncio.run(produce(coordinators, stores, [TOPIC, f"{TOPIC}-2"], txns=8))
    claim = cluster.core.read_namespaced_persistent_volume_claim("data-store-1", ns)
    assert claim.metadata is not None and claim.spec is not None
    old_uid = cluster.pod(ns, "store-1")["metadata"]["uid"]  # type: ignore[index]
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="store-1", namespace=ns))
    cluster.core.create_namespaced_pod_eviction("store-1", ns, eviction)
    wait_for(
        lambda: (
            (p := cluster.pod(ns, "store-1")) is not None and p["metadata"]["uid"] != old_uid and pod_ready(p)
        ),
        "store-1 rescheduled and Ready",
        timeout=180,
    )
    events = cluster.core.list_namespaced_event(ns, field_selector="involvedObject.name=store-1").items
    assert any(e.reason == "Killing" for e in events), [e.reason for e in events]
    after = cluster.core.read_namespaced_persistent_volume_claim("data-store-1", ns)
    assert after.metadata is not None and after.spec is not None
    # The same claim, bound to the same volume: the rescheduled pod found its data there.
    assert (after.metadata.uid, after.spec.volume_name) == (claim.metadata.uid, claim.spec.volume_name)
    asyncio.run(verify(_addresses(cluster, ns, "store", 2), record))


@pytest.mark.timeout(1500)
@pytest.mark.usefixtures("operator")
@pytest.mark.disrupts_operator  # the operator's Deployment patched to a memory limit it dies under
def test_operator_oom_killed_during_a_rollout_resumes_it(cluster: Cluster, namespace: str) -> None:
    ns = namespace
    apply(cluster, ns, resources(OLD, batched=False))
    for plural, name in ((TC, "txn"), (PAS, "acks")):
        wait_cr(cluster, ns, plural, name, settled_at(OLD, "Disabled"), f"Ready at {OLD}", timeout=240)
    stores = addresses(cluster, ns, "acks", 2)
    run_workload(cluster, ns, "subscribe", "--stores", stores, "--topics", TOPICS, "--subscription", "audit")
    load = run_workload(
        cluster, ns, "produce", "--coordinators", addresses(cluster, ns, "txn", 3),
        "--stores", stores, "--topics", TOPICS, "--txns", "6", "--tag", "pre-oom",
    )  # fmt: skip

    apply(cluster, ns, tc_manifest(NEW, batched=True))
    wait_cr(
        cluster, ns, TC, "txn",
        lambda o: NEW in pod_versions(o) and set(pod_versions(o)) != {NEW},
        "the upgrade under way (some pods new, some old)", timeout=240,
    )  # fmt: skip
    # Paused there (Strimzi's pause-reconciliation), so that the rollout is surely unfinished when the
    # operator dies; the annotation is lifted while no operator runs.
    cluster.kubectl("-n", ns, "annotate", "--overwrite", f"{TC}/txn", f"{PAUSE}=true")
    paused = wait_cr(
        cluster,
        ns,
        TC,
        "txn",
        lambda o: condition(o, "Paused").get("status") == "True",
        "paused",
        timeout=120,
    )
    assert not settled_at(NEW, "Enabled")(paused), f"the rollout finished before the pause: {summary(paused)}"
    # A memory limit far below what the operator needs to import kopf: the Deployment (Recreate) stops
    # the running operator and its replacement is OOM-killed by the kernel as it starts.
    deployment = next(
        d
        for d in cluster.apps.list_namespaced_deployment(OPERATOR_NS).items
        if d.metadata and d.metadata.name
    )
    assert deployment.metadata is not None and deployment.metadata.name is not None
    name = deployment.metadata.name
    original: Obj = to_json(cluster.api, deployment)["spec"]["template"]["spec"]["containers"][0]["resources"]
    tiny = {"requests": {"cpu": "10m", "memory": "24Mi"}, "limits": {"memory": "24Mi"}}
    _set_operator_resources(cluster, name, tiny)

    def oom_killed() -> str | None:
        for pod in cluster.core.list_namespaced_pod(OPERATOR_NS).items:
            obj: Obj = to_json(cluster.api, pod)
            for cs in obj.get("status", {}).get("containerStatuses", []):
                for state in (cs.get("state", {}), cs.get("lastState", {})):
                    if state.get("terminated", {}).get("reason") == "OOMKilled":
                        return str(obj["metadata"]["name"])
        return None

    victim = wait_for(oom_killed, "the operator's container OOM-killed", timeout=240)
    cluster.kubectl("-n", ns, "annotate", f"{TC}/txn", f"{PAUSE}-")
    _set_operator_resources(cluster, name, original)
    done = wait_cr(cluster, ns, TC, "txn", settled_at(NEW, "Enabled"), f"Ready at {NEW} after the OOM", 600)
    assert all(v == NEW for v in pod_versions(done)), summary(done)
    audit = run_workload(
        cluster, ns, "read", "--stores", addresses(cluster, ns, "acks", 2), "--topics", TOPICS,
        "--subscription", "audit",
    )  # fmt: skip
    for topic in TOPICS.split(","):
        missing = set(load["committed"][topic]) - set(audit[topic])
        assert not missing, f"{topic}: {len(missing)} committed messages lost (operator {victim} OOM-killed)"
        assert not set(load["aborted"][topic]) & set(audit[topic]), f"{topic}: aborted messages delivered"


def _set_operator_resources(cluster: Cluster, deployment: str, resources_: Obj) -> None:
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "operator", "resources": resources_}]}}}}
    cluster.apps.patch_namespaced_deployment(deployment, OPERATOR_NS, patch)
