"""PIP-76 offload through the operator on the local cluster: a PendingAckStore at 3.x offloads its
topics' closed ledgers to a shared ReadWriteMany volume (the filesystem driver), the operator's
verify-offload audit (a Job made from its CronJob) finds the tier sound, the store survives a restart
and a node drain, and a downgrade to 2.x is held until every pod restored its tier-only ledgers, then
completes; every committed message is still readable at 2.x from local files alone.

The keys the operator renders for spec.offload are checked against what the runtime parses in
tests/operator/test_op_runtime_config.py (no cluster); this file is the end-to-end half.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable
from typing import Any

import pytest

from e2e.helpers import Cluster, to_json, wait_for
from e2e.test_operator import (  # noqa: F401 - `operator` is a fixture used by name
    PAS,
    TC,
    TOPICS,
    addresses,
    apply,
    condition,
    get_cr,
    operator,
    run_workload,
    settled_at,
    summary,
    tc_manifest,
    wait_cr,
)
from txnkeeper.contract.formats import Feature, has_feature

Obj = dict[str, Any]
NEW, OLD = "3.0.0", "2.0.0"
CLAIM = "offload-rwx"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("txnkeeper.server.offload_settings") is None
    or not has_feature(NEW, Feature.OFFLOAD_SEGMENTS),
    reason=f"this runtime cannot offload at {NEW} (txnkeeper.server.offload_settings and the "
    "'offload-segments' feature, issue 13); nothing would be offloaded",
)


def offload_store(version: str, *, enabled: bool) -> str:
    return f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {CLAIM}}}
spec: {{accessModes: [ReadWriteMany], resources: {{requests: {{storage: 256Mi}}}}}}
---
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {{name: acks}}
spec:
  version: "{version}"
  replicas: 2
  batchedWrite: {{enabled: true}}
  storage: {{size: 128Mi}}
  offload:
    enabled: {str(enabled).lower()}
    driver: filesystem
    filesystem: {{claimName: {CLAIM}}}
    thresholdBytes: 0
    deletionLagMs: 0
    maxSegmentSizeBytes: 65536
    maxSegmentRolloverSeconds: 5
    verifySchedule: ""
"""


def offloaded_segments(obj: Obj) -> int:
    pods = obj["status"].get("pods", [])
    return sum(int((p.get("offload") or {}).get("offloadedSegments", 0)) for p in pods)


def tier_only(obj: Obj) -> int:
    return sum(int((p.get("offload") or {}).get("tierOnlyLedgers", 0)) for p in obj["status"].get("pods", []))


def run_offload_audit(cluster: Cluster, ns: str, name: str) -> None:
    """What ``kubectl create job --from=cronjob/acks-verify-offload`` does: a Job from the template."""
    cron: Obj = to_json(cluster.api, cluster.batch.read_namespaced_cron_job("acks-verify-offload", ns))
    template = cron["spec"]["jobTemplate"]
    body = {"metadata": {"name": name, "labels": template["metadata"]["labels"]}, "spec": template["spec"]}
    cluster.batch.create_namespaced_job(ns, body)  # type: ignore[arg-type]  # a dict body for a V1Job


def audited_after(started: str) -> Callable[[Obj], bool]:
    def pred(obj: Obj) -> bool:
        audit = obj["status"].get("offloadAudit") or {}
        return str(audit.get("generatedAt", "")) >= started and condition(obj, "OffloadAudit").get(
            "reason"
        ) in ("Clean", "Findings", "AuditFailed")

    return pred


def offload_settled(obj: Obj) -> bool:
    return settled_at(NEW, "Enabled")(obj) and condition(obj, "OffloadHealthy").get("status") == "True"


@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("operator")
def test_offload_restart_drain_and_a_downgrade_held_until_restored(cluster: Cluster, namespace: str) -> None:
    ns = namespace
    apply(cluster, ns, tc_manifest(NEW, batched=True) + "---" + offload_store(NEW, enabled=True))
    wait_cr(cluster, ns, TC, "txn", settled_at(NEW, "Enabled"), f"Ready at {NEW}", 300)
    wait_cr(cluster, ns, PAS, "acks", offload_settled, "Ready at 3.x, OffloadHealthy", 300)
    stores = addresses(cluster, ns, "acks", 2)
    run_workload(cluster, ns, "subscribe", "--stores", stores, "--topics", TOPICS, "--subscription", "audit")
    committed: dict[str, list[str]] = {}
    for round_ in range(3):
        load = run_workload(
            cluster, ns, "produce", "--coordinators", addresses(cluster, ns, "txn", 3),
            "--stores", addresses(cluster, ns, "acks", 2), "--topics", TOPICS, "--txns", "8",
            "--tag", f"r{round_}",
        )  # fmt: skip
        for topic, ids in load["committed"].items():
            committed.setdefault(topic, []).extend(ids)

    # 1. Streaming offload uploads the open ledgers' entries: segments close by age (5 s) and are
    #    Offloaded. (A topic ledger closes only at 50,000 entries, 4 h or a restart, so nothing is
    #    tier-only yet: local files of an open ledger are never deleted.)
    offloaded = wait_cr(
        cluster, ns, PAS, "acks", lambda o: offloaded_segments(o) > 0 and offload_settled(o),
        "Offloaded segments, the store Ready and OffloadHealthy", 240,
    )  # fmt: skip

    # 1b. The operator's tier audit (suspended CronJob: no verifySchedule) run once on demand: Spark
    #     reads every Offloaded segment back from the shared volume; its report lands in the status.
    assert condition(offloaded, "OffloadAudit").get("reason") == "NoReport", summary(offloaded)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_offload_audit(cluster, ns, "audit-1")
    audited = wait_cr(cluster, ns, PAS, "acks", audited_after(started), "the offload audit's report", 900)
    report = audited["status"]["offloadAudit"]
    assert condition(audited, "OffloadAudit")["status"] == "True", (report, summary(audited))
    assert report["ok"] is True and report["segmentsChecked"] >= 1 and report["findingCount"] == 0, report

    # 2. A restart and a drain (delete each pod): reads of tier-only ledgers keep working.
    def has_ip(name: str) -> bool:
        obj = cluster.pod(ns, name)
        return obj is not None and bool(obj["status"].get("podIP"))

    for pod in ("acks-1", "acks-0"):
        cluster.core.delete_namespaced_pod(pod, ns)
        wait_for(functools.partial(has_ip, pod), f"{pod} recreated", 180)
        wait_cr(cluster, ns, PAS, "acks", offload_settled, f"{pod} back, Ready", 300)
    # 2. Closed ledgers are offloaded and (lag 0, threshold 0) their local files deleted: the status
    #    shows tier-only ledgers, and every committed message still reads back, now from the tier.
    # (Judged once settled: right after a pod's restart the condition is False until it reports again.)
    wait_cr(
        cluster, ns, PAS, "acks", lambda o: tier_only(o) > 0 and offload_settled(o),
        "tier-only ledgers, the store Ready and OffloadHealthy", 240,
    )  # fmt: skip
    stores = addresses(cluster, ns, "acks", 2)
    audit = run_workload(
        cluster, ns, "read", "--stores", stores, "--topics", TOPICS, "--subscription", "audit"
    )
    for topic, ids in committed.items():
        assert sorted(set(ids) - set(audit[topic])) == [], f"{topic}: committed messages lost after restarts"

    # 2b. The restarts closed the ledgers; once reopened (the reads above), the offloader's pass deletes
    #     the closed ledgers' local files (lag 0): they are tier-only, and still read back.
    wait_cr(cluster, ns, PAS, "acks", lambda o: tier_only(o) > 0, "tier-only ledgers", 240)
    audit = run_workload(
        cluster, ns, "read", "--stores", stores, "--topics", TOPICS, "--subscription", "audit"
    )
    for topic, ids in committed.items():
        assert sorted(set(ids) - set(audit[topic])) == [], f"{topic}: lost once tier-only"

    # 3. Downgrade to 2.x (offload disabled, location kept): held in RestoringOffloaded while any pod
    #    holds tier-only ledgers, no pod runs 2.x before every pod restored, then it completes.
    apply(cluster, ns, offload_store(OLD, enabled=False))
    held = wait_cr(
        cluster, ns, PAS, "acks", lambda o: o["status"].get("phase") == "RestoringOffloaded",
        "the downgrade held while tier-only ledgers remain", 300,
    )  # fmt: skip
    assert all(p.get("version") == NEW for p in held["status"]["pods"]), summary(held)
    done = wait_cr(cluster, ns, PAS, "acks", settled_at(OLD, "Enabled"), f"downgraded to {OLD}", 900)
    assert tier_only(get_cr(cluster, ns, PAS, "acks")) == 0, summary(done)

    # 4. At 2.x every committed message reads back from local files (no offload configured any more).
    stores = addresses(cluster, ns, "acks", 2)
    audit = run_workload(
        cluster, ns, "read", "--stores", stores, "--topics", TOPICS, "--subscription", "audit"
    )
    for topic, ids in committed.items():
        assert sorted(set(ids) - set(audit[topic])) == [], (
            f"{topic}: committed messages lost by the downgrade"
        )
        assert len(audit[topic]) == len(set(audit[topic])), f"{topic}: duplicates"
