"""reconcile() end to end against an in-memory API server and in-memory pods.

Unit-level: the objects, the StatefulSet controller and the pods' admin APIs are small fakes, so the
orchestration (children, write-ahead progress, actions, status, Events, the verifier Job and report
ConfigMaps) can be checked step by step. The real API server is the e2e suite's job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from txnkeeper.contract.admin import AdminError, PodBatchLog
from txnkeeper_operator import metrics, naming
from txnkeeper_operator.context import Context
from txnkeeper_operator.engine import BatchSettings, Phase
from txnkeeper_operator.engine.persist import format_time
from txnkeeper_operator.naming import Kind
from txnkeeper_operator.reconcile import reconcile
from txnkeeper_operator.settings import OperatorSettings

Obj = dict[str, Any]


def _merge(target: Obj, patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))


class FakeKube:
    """Objects by (kind, namespace, name) plus a StatefulSet controller that makes pods Ready."""

    def __init__(self, cr: Obj) -> None:
        self.cr = cr
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.deleted: list[str] = []
        self.status_writes: list[Mapping[str, Any]] = []
        self.others: dict[tuple[str, str], Obj] = {}
        self._uid = 0

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        self.objects[key] = json.loads(json.dumps(manifest))

    async def create_if_absent(self, manifest: Mapping[str, Any]) -> bool:
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.objects:
            return False
        obj = json.loads(json.dumps(manifest))
        if manifest["kind"] == "Secret":
            obj["data"] = {
                k: __import__("base64").b64encode(v.encode()).decode()
                for k, v in obj.pop("stringData").items()
            }
        self.objects[key] = obj
        return True

    async def get_resource(self, plural: str, namespace: str, name: str) -> Obj | None:
        if (plural, name) != ("transactioncoordinators", self.cr["metadata"]["name"]):
            other = self.others.get((plural, name))  # another resource (spec.pulsar's reference)
            return json.loads(json.dumps(other)) if other is not None else None
        fetched: Obj = json.loads(json.dumps(self.cr))  # a copy, like a GET
        return fetched

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((kind, namespace, name))

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        wanted = dict(part.split("=") for part in selector.split(","))
        return [
            o
            for (k, ns, _), o in sorted(self.objects.items())
            if k == "Pod" and ns == namespace and wanted.items() <= o["metadata"]["labels"].items()
        ]

    async def list_jobs(self, namespace: str, selector: str) -> list[Obj]:
        key, value = selector.split("=")
        return [
            o
            for (k, ns, _), o in self.objects.items()
            if k == "Job" and ns == namespace and o["metadata"]["labels"].get(key) == value
        ]

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        pod = self.objects.get(("Pod", namespace, name))
        assert pod is not None and pod["metadata"]["uid"] == uid
        del self.objects[("Pod", namespace, name)]
        self.deleted.append(name)

    async def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status_writes.append(json.loads(json.dumps(status)))
        _merge(self.cr.setdefault("status", {}), status)

    async def patch_resource(self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        _merge(self.cr, patch)

    def run_statefulset_controller(self) -> None:
        sts = self.objects.get(("StatefulSet", "ns", "txn"))
        if sts is None:
            return
        template = sts["spec"]["template"]
        for ordinal in range(sts["spec"]["replicas"]):
            if ("Pod", "ns", f"txn-{ordinal}") not in self.objects:
                self._uid += 1
                self.objects[("Pod", "ns", f"txn-{ordinal}")] = {
                    "metadata": {
                        "name": f"txn-{ordinal}",
                        "uid": f"pod-uid-{self._uid}",
                        "labels": dict(template["metadata"]["labels"]),
                        "annotations": dict(template["metadata"]["annotations"]),
                    },
                    "status": {
                        "podIP": f"10.0.0.{ordinal}",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }


class FakePods:
    """The pods' admin APIs: each pod starts with its template's batch settings and release."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.batch: dict[str, BatchSettings] = {}
        self.uid_seen: dict[str, str] = {}
        self.ledger: dict[str, int] = {}
        self.calls: list[str] = []

    def _pod(self, base: str) -> Obj:
        ordinal = int(base.split("//")[1].split(":", maxsplit=1)[0].rsplit(".", 1)[1])
        pod = self.kube.objects[("Pod", "ns", f"txn-{ordinal}")]
        name = pod["metadata"]["name"]
        if self.uid_seen.get(name) != pod["metadata"]["uid"]:  # a new process: start-up settings
            self.uid_seen[name] = pod["metadata"]["uid"]
            block = json.loads(pod["metadata"]["annotations"][naming.STARTUP_BATCH_ANNOTATION])[
                "batchedWrite"
            ]
            self.batch[name] = BatchSettings(
                block["enabled"], block["maxRecords"], block["maxSizeBytes"], block["maxDelayMillis"]
            )
        return pod

    async def get_placement(self, base: str) -> Any:
        # Pods of a release before placement (contracts §12): the operator then moves nothing.
        raise AdminError(f"GET {base}/admin/v1/placement: HTTP 404: not found")

    def placement_calls(self, kind: str) -> FakePods:
        return self

    async def held(self, base: str) -> Any:
        raise AdminError(f"GET {base}/admin/v1/shards: HTTP 404: not found")

    async def batch_log(self, base: str, kind: Kind) -> PodBatchLog:
        name = self._pod(base)["metadata"]["name"]
        entry = {
            "coordinatorId": int(name[-1]),
            "state": "Ready",
            kind.array_stat_key: self.batch[name].to_stat(),
        }
        return PodBatchLog(self.batch[name], (self.batch[name],), (entry,))

    async def info(self, base: str) -> dict[str, Any]:
        pod = self._pod(base)
        release = pod["metadata"]["labels"][naming.VERSION_LABEL]
        return {"pod": pod["metadata"]["name"], "release": release, "formatLevel": int(release[0])}

    async def set_batch_log(self, base: str, kind: Kind, batch: BatchSettings, token: str) -> None:
        pod = self._pod(base)
        assert token and len(token) > 20
        if batch.enabled and pod["metadata"]["labels"][naming.VERSION_LABEL].startswith("1."):
            raise AdminError("HTTP 409")
        self.batch[pod["metadata"]["name"]] = batch
        self.calls.append(f"batch {pod['metadata']['name']} {batch.enabled}")

    async def rollover(self, base: str, token: str) -> dict[str, int]:
        name = self._pod(base)["metadata"]["name"]
        self.ledger[name] = self.ledger.get(name, 3) + 1
        self.calls.append(f"rollover {name}")
        return {f"__transaction_log_{name[-1]}": self.ledger[name] - 1}


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.seen.append((type_, reason, message))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 21, 22, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _cr(version: str, enabled: bool = False) -> Obj:
    return {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "TransactionCoordinator",
        "metadata": {"name": "txn", "namespace": "ns", "uid": "cr-uid", "generation": 1, "annotations": {}},
        "spec": {
            "version": version,
            "replicas": 3,
            "coordinators": 3,
            "batchedWrite": {
                "enabled": enabled,
                "maxRecords": 512,
                "maxSizeBytes": 4194304,
                "maxDelayMillis": 1,
            },
            "verifier": {"retrySeconds": 5},
        },
    }


@pytest.fixture
def world() -> tuple[FakeKube, FakePods, Events, Context]:
    kube = FakeKube(_cr("1.0.0"))
    pods = FakePods(kube)
    events = Events()
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=events, clock=Clock())  # type: ignore[arg-type]
    return kube, pods, events, ctx


async def _until(kube: FakeKube, ctx: Context, phase: Phase, verifier: Any = None, limit: int = 60) -> Phase:
    stale = json.loads(json.dumps({**kube.cr, "status": {}}))
    for _ in range(limit):
        kube.run_statefulset_controller()
        if verifier is not None:
            verifier()
        # A stale body on purpose: reconcile must read the resource afresh.
        decision = await reconcile(stale, ctx)
        assert decision is not None
        if decision.phase == phase and decision.action is None:
            return decision.phase
    raise AssertionError(f"never reached {phase}; status: {kube.cr.get('status', {}).get('phaseReason')}")


async def test_install_creates_children_and_reports_status(world: Any) -> None:
    kube, _pods, events, ctx = world
    await _until(kube, ctx, Phase.READY)
    kinds = {k for k, _, _ in kube.objects}
    assert {"StatefulSet", "ConfigMap", "Secret", "Service", "ServiceAccount", "PodDisruptionBudget"} <= kinds
    assert {"Role", "RoleBinding", "CronJob"} <= kinds
    status = kube.cr["status"]
    assert (
        status["phase"] == "Ready"
        and status["currentVersion"] == "1.0.0"
        and status["batchLog"] == "Disabled"
    )
    assert status["replicas"] == 3 and status["readyReplicas"] == 3
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Ready"]["observedGeneration"] == 1
    assert [p["name"] for p in status["pods"]] == ["txn-0", "txn-1", "txn-2"]
    assert {r["pod"] for r in status["coordinatorArray"]} == {"txn-0", "txn-1", "txn-2"}
    assert ("Normal", "ApplyTemplate", "create pods at 1.0.0") in events.seen


def _operator_samples() -> dict[tuple[str, str], float]:
    """The operator metrics of the resource these tests reconcile, keyed by name and phase label."""
    return {
        (sample.name, sample.labels.get("phase", "")): sample.value
        for family in metrics.RESOURCES.collect()
        for sample in family.samples
        if sample.labels.get("name") == "txn" and sample.labels.get("namespace") == "ns"
    }


async def test_upgrade_then_verified_downgrade(world: Any) -> None:
    kube, pods, events, ctx = world
    await _until(kube, ctx, Phase.READY)
    kube.cr["spec"] = _cr("2.0.0", enabled=True)["spec"]
    await _until(kube, ctx, Phase.READY)
    assert kube.deleted == ["txn-2", "txn-1", "txn-0"]
    assert pods.calls == ["batch txn-2 True", "batch txn-1 True", "batch txn-0 True"]
    assert kube.cr["status"]["batchLog"] == "Enabled"
    assert {c["type"]: c["status"] for c in kube.cr["status"]["conditions"]}["BatchLogEnabled"] == "True"

    # Downgrade: the verifier first says "not yet", then "safe".
    kube.cr["spec"] = _cr("1.0.0")["spec"]
    verdict = {"safe": False}

    def verifier() -> None:
        for (kind, _ns, _name), job in list(kube.objects.items()):
            if kind != "Job" or job.get("status"):
                continue
            markers_cm = kube.objects[("ConfigMap", "ns", "txn-verifier-markers")]
            markers = json.loads(markers_cm["data"][naming.MARKERS_KEY])
            report = {
                "apiVersion": "txnkeeper.io/v1",
                "kind": "VerifierReport",
                "generatedAt": format_time(ctx.clock.now + timedelta(seconds=1)),
                "markersTakenAt": markers["takenAt"],
                "markers": markers["stores"],
                "safe": verdict["safe"],
                "stores": [
                    {
                        "pod": "txn-1",
                        "store": s,
                        "safe": verdict["safe"],
                        "reason": "oldest live ledger 3 <= 4",
                    }
                    for s in markers["stores"]
                ],
            }
            kube.objects[("ConfigMap", "ns", "txn-verifier-report")]["data"] = {
                naming.REPORT_KEY: json.dumps(report)
            }
            job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}

    await _until(kube, ctx, Phase.DOWNGRADE_BLOCKED, verifier)
    status = kube.cr["status"]
    assert "held since" in status["phaseReason"] and "txn-1/__transaction_log_" in status["phaseReason"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["DowngradeSafe"] == "False"
    assert [s["lastBatchedLedger"] for r in status["downgrade"]["rolledOver"] for s in r["stores"]] == [
        3,
        3,
        3,
    ]
    assert any(e[:2] == ("Warning", "DowngradeBlocked") for e in events.seen)
    sts = kube.objects[("StatefulSet", "ns", "txn")]
    assert sts["spec"]["template"]["metadata"]["labels"][naming.VERSION_LABEL] == "2.0.0"
    assert kube.deleted == ["txn-2", "txn-1", "txn-0"]  # nothing restarted while held
    # What the "downgrade blocked" alert and the operator dashboard read (docs/monitoring.md).
    samples = _operator_samples()
    assert samples[("txnkeeper_operator_resource_phase", "DowngradeBlocked")] == 1
    assert samples[("txnkeeper_operator_resource_phase", "Ready")] == 0
    assert samples[("txnkeeper_operator_verifier_report_safe", "")] == 0

    verdict["safe"] = True
    await _until(kube, ctx, Phase.READY, verifier)
    assert kube.deleted[3:] == ["txn-2", "txn-1", "txn-0"]
    status = kube.cr["status"]
    assert status["currentVersion"] == "1.0.0" and "verifiedAt" in status["downgrade"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["DowngradeSafe"] == "True"
    assert status["lastVerifierReport"]["safe"] is True
    samples = _operator_samples()
    assert samples[("txnkeeper_operator_resource_phase", "Ready")] == 1
    assert samples[("txnkeeper_operator_verifier_report_safe", "")] == 1
    assert samples[("txnkeeper_operator_verifier_report_timestamp_seconds", "")] == pytest.approx(
        ctx.clock.now.timestamp(), abs=60
    )
    # Write-ahead: the markers were in the status before the verifier was ever started.
    first_verify = next(
        i for i, w in enumerate(kube.status_writes) if "verifierRequestedAt" in (w.get("downgrade") or {})
    )
    assert any("rolledOver" in (w.get("downgrade") or {}) for w in kube.status_writes[:first_verify])


async def test_pause_annotation_freezes_everything(world: Any) -> None:
    kube, _pods, _events, ctx = world
    await _until(kube, ctx, Phase.READY)
    kube.cr["metadata"]["annotations"][naming.PAUSE_ANNOTATION] = "true"
    kube.cr["spec"] = _cr("2.0.0", enabled=True)["spec"]
    del kube.objects[("Service", "ns", "txn")]
    await _until(kube, ctx, Phase.PAUSED)
    assert ("Service", "ns", "txn") not in kube.objects  # not even children are touched
    assert kube.deleted == []
    sts = kube.objects[("StatefulSet", "ns", "txn")]
    assert sts["spec"]["template"]["metadata"]["labels"][naming.VERSION_LABEL] == "1.0.0"
    assert {c["type"]: c["status"] for c in kube.cr["status"]["conditions"]}["Paused"] == "True"


# ---- a PendingAckStore that offloads: status, OffloadHealthy, and the restore-before-downgrade gate ------


class StoreKube(FakeKube):
    async def get_resource(self, plural: str, namespace: str, name: str) -> Obj | None:
        assert plural == "pendingackstores" and name == self.cr["metadata"]["name"]
        fetched: Obj = json.loads(json.dumps(self.cr))
        return fetched


class OffloadingPods(FakePods):
    """Store pods with tier-only ledgers; a requested restore happens when the pod (re)starts."""

    def __init__(self, kube: FakeKube) -> None:
        super().__init__(kube)
        self.tier_only: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.requested: dict[str, Mapping[str, Any]] = {}
        self.started: dict[str, str] = {}

    def _store_pod(self, base: str) -> str:
        pod = self._pod(base)
        name: str = pod["metadata"]["name"]
        if self.started.get(name) != pod["metadata"]["uid"]:
            self.started[name] = pod["metadata"]["uid"]
            if name in self.requested:
                assert pod["metadata"]["labels"][naming.VERSION_LABEL].startswith("3."), (
                    "restored by a 2.x pod"
                )
                self.calls.append(f"restored {name}")
                del self.requested[name]
                self.tier_only[name] = 0
        return name

    async def offload_summary(self, base: str) -> dict[str, Any]:
        name = self._store_pod(base)
        tier = self.tier_only.get(name, 0)
        return {
            "tierOnlyLedgers": tier,
            "maxMetadataVersion": 2 if tier else 1,
            "restoreRequested": name in self.requested,
            "segments": {"Offloaded": tier, "Failed": self.failed.get(name, 0)},
            "unreadable": [],
        }

    async def request_offload_restore(self, base: str, offload: Mapping[str, Any], token: str) -> None:
        name = self._store_pod(base)
        assert token
        self.requested[name] = dict(offload)
        self.calls.append(f"restore-request {name}")


def _store_cr(version: str, offload: Obj | None) -> Obj:
    cr = _cr(version, enabled=True)
    cr["kind"] = "PendingAckStore"
    if offload is not None:
        cr["spec"]["offload"] = offload
    del cr["spec"]["coordinators"]
    return cr


async def test_offloading_store_reports_offload_and_restores_before_a_downgrade() -> None:
    offload = {"driver": "filesystem", "filesystem": {"claimName": "tier"}, "thresholdBytes": 0}
    kube = StoreKube(_store_cr("3.0.0", offload))
    pods = OffloadingPods(kube)
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=Events(), clock=Clock())  # type: ignore[arg-type]
    await _until(kube, ctx, Phase.READY)
    config = json.loads(kube.objects[("ConfigMap", "ns", "txn-config")]["data"]["config.json"])
    assert config["offload"]["fileSystemURI"] == "/var/lib/txnkeeper-offload"
    pods.tier_only.update({"txn-0": 2, "txn-2": 1})
    pods.failed["txn-1"] = 1
    await _until(kube, ctx, Phase.READY)
    status = kube.cr["status"]
    by_pod = {p["name"]: p["offload"] for p in status["pods"]}
    assert by_pod["txn-0"]["tierOnlyLedgers"] == 2 and by_pod["txn-0"]["maxMetadataVersion"] == 2
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["OffloadHealthy"]["status"] == "False"
    assert conditions["OffloadHealthy"]["reason"] == "FailedSegments"
    assert "txn-1: 1 Failed segment(s)" in conditions["OffloadHealthy"]["message"]
    assert conditions["FeaturesSupported"]["status"] == "True"

    # Downgrade: offload disabled (location kept), version 2.x. Restores come first, each pod restarted
    # at 3.x; only then does any pod run 2.x.
    pods.failed.clear()
    kube.cr["spec"] = _store_cr("2.0.0", {**offload, "enabled": False})["spec"]
    await _until(kube, ctx, Phase.READY, limit=120)
    assert pods.calls[:4] == [
        "restore-request txn-2",
        "restored txn-2",
        "restore-request txn-0",
        "restored txn-0",
    ]
    assert kube.deleted == ["txn-2", "txn-0", "txn-2", "txn-1", "txn-0"]
    assert kube.cr["status"]["currentVersion"] == "2.0.0"
    # Heading for 2.x, nothing is audited any more: the CronJob is suspended without settings.
    cron = kube.objects[("CronJob", "ns", "txn-verify-offload")]
    assert cron["spec"]["suspend"] is True
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--offload-json") + 1] == "{}"
    audit = {c["type"]: c for c in kube.cr["status"]["conditions"]}["OffloadAudit"]
    assert (audit["status"], audit["reason"]) == ("Unknown", "NotConfigured")
    config = json.loads(kube.objects[("ConfigMap", "ns", "txn-config")]["data"]["config.json"])
    assert "offload" not in config  # 2.x pods never get the section


async def test_offload_audit_cron_job_and_its_report_in_status() -> None:
    offload = {"driver": "filesystem", "filesystem": {"claimName": "tier"}, "verifySchedule": "@daily"}
    kube = StoreKube(_store_cr("3.0.0", offload))
    pods = OffloadingPods(kube)
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=Events(), clock=Clock())  # type: ignore[arg-type]
    await _until(kube, ctx, Phase.READY)
    cron = kube.objects[("CronJob", "ns", "txn-verify-offload")]
    assert cron["spec"]["schedule"] == "@daily" and cron["spec"]["suspend"] is False
    report_cm = kube.objects[("ConfigMap", "ns", "txn-offload-audit")]
    assert report_cm["metadata"]["ownerReferences"][0]["kind"] == "PendingAckStore"
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert (conditions["OffloadAudit"]["status"], conditions["OffloadAudit"]["reason"]) == (
        "Unknown",
        "NoReport",
    )
    assert "offloadAudit" not in kube.cr["status"]

    # The audit Job (not run here) patches its report into the pre-created ConfigMap.
    finding = {"kind": "missing-object", "pod": "txn-0", "store": "t", "uuid": "u1", "detail": "gone"}
    report = {
        "generatedAt": "2026-11-24T03:00:00Z",
        "ok": False,
        "pods": 3,
        "segments": 2,
        "findings": [finding],
    }
    report_cm["data"] = {"report.json": json.dumps(report)}
    await _until(kube, ctx, Phase.READY)
    status = kube.cr["status"]
    audit = {c["type"]: c for c in status["conditions"]}["OffloadAudit"]
    assert (audit["status"], audit["reason"]) == ("False", "Findings") and "1 missing-object" in audit[
        "message"
    ]
    assert status["offloadAudit"]["findings"] == [finding] and status["offloadAudit"]["ok"] is False
    # Audit Jobs are not verify-invalidation Jobs: the downgrade gate's listing never sees them.
    assert "lastVerifierReport" not in status

    # The next audit Job dies without a report (here: past its deadline): the earlier report must not
    # look current. The condition names the Job and where to look; the report stays, marked stale.
    dead = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "txn-verify-offload-29001", "namespace": "ns", "labels": dict(cron["metadata"]["labels"]),
        },
        "status": {
            "startTime": "2026-11-25T03:00:00Z",
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long",
                 "lastTransitionTime": "2026-11-25T04:00:00Z"},
            ],
        },
    }  # fmt: skip
    kube.objects[("Job", "ns", "txn-verify-offload-29001")] = dead
    await _until(kube, ctx, Phase.READY)
    status = kube.cr["status"]
    audit = {c["type"]: c for c in status["conditions"]}["OffloadAudit"]
    assert (audit["status"], audit["reason"]) == ("False", "LastAuditDidNotReport")
    assert "kubectl logs job/txn-verify-offload-29001" in audit["message"]
    assert "DeadlineExceeded" in audit["message"]
    assert status["offloadAudit"]["findings"] == [finding]
    assert "txn-verify-offload-29001" in status["offloadAudit"]["stale"]
    # A run that reports again makes it current: stale cleared, the condition from the new report.
    report_cm["data"] = {"report.json": json.dumps({**report, "generatedAt": "2026-11-26T03:10:00Z"})}
    await _until(kube, ctx, Phase.READY)
    status = kube.cr["status"]
    audit = {c["type"]: c for c in status["conditions"]}["OffloadAudit"]
    assert (audit["status"], audit["reason"]) == ("False", "Findings")
    assert "stale" not in status["offloadAudit"]

    report_cm["data"] = {"report.json": "{not json"}
    await _until(kube, ctx, Phase.READY)
    audit = {c["type"]: c for c in kube.cr["status"]["conditions"]}["OffloadAudit"]
    assert (audit["status"], audit["reason"]) == ("False", "ReportUnusable")

    # spec.offload removed: the CronJob is suspended (the operator deletes nothing but pods), the stale
    # audit cleared.
    del kube.cr["spec"]["offload"]
    await _until(kube, ctx, Phase.READY)
    assert kube.objects[("CronJob", "ns", "txn-verify-offload")]["spec"]["suspend"] is True
    assert "offloadAudit" not in kube.cr["status"]
    audit = {c["type"]: c for c in kube.cr["status"]["conditions"]}["OffloadAudit"]
    assert audit["reason"] == "NotConfigured"


async def test_a_store_spec_using_a_feature_its_release_lacks_gets_a_false_condition() -> None:
    kube = StoreKube(_store_cr("2.0.0", {"driver": "filesystem", "filesystem": {"claimName": "tier"}}))
    pods = OffloadingPods(kube)
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=Events(), clock=Clock())  # type: ignore[arg-type]
    await _until(kube, ctx, Phase.READY)
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert conditions["FeaturesSupported"]["status"] == "False"
    assert conditions["FeaturesSupported"]["reason"] == "FeatureUnavailable"
    assert "release 2.0.0 lacks" in conditions["FeaturesSupported"]["message"]
    config = json.loads(kube.objects[("ConfigMap", "ns", "txn-config")]["data"]["config.json"])
    assert set(config) == {"batchedWrite"}


async def test_a_store_gets_its_topic_policies_and_a_bad_value_is_reported_not_rendered() -> None:
    cr = _store_cr("2.0.0", None)
    cr["spec"]["topicPolicies"] = {
        "retentionMinutes": 60,
        "retentionSizeMB": -1,
        "backlogQuotaPolicy": "producer_exception",
    }
    cr["spec"]["connectionLimits"] = {"maxConnections": 2048}
    kube = StoreKube(cr)
    pods = FakePods(kube)
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=Events(), clock=Clock())  # type: ignore[arg-type]
    await _until(kube, ctx, Phase.READY)
    config = json.loads(kube.objects[("ConfigMap", "ns", "txn-config")]["data"]["config.json"])
    assert config["topicPolicies"] == {
        "retention": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
        "backlogQuota": {"policy": "producer_exception"},
    }
    env = kube.objects[("StatefulSet", "ns", "txn")]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TXNKEEPER_MAX_CONNECTIONS", "value": "2048"} in env
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert (conditions["SettingsValid"]["status"], conditions["SettingsValid"]["reason"]) == ("True", "Valid")

    # A value the CRD would have refused (an object stored under an older CRD, say): reconciliation goes
    # on, the section is left out of the pods' config (a pod would refuse the file and not start), and
    # the condition names the field.
    kube.cr["spec"]["topicPolicies"]["retentionMinutes"] = "an hour"
    await _until(kube, ctx, Phase.READY)
    config = json.loads(kube.objects[("ConfigMap", "ns", "txn-config")]["data"]["config.json"])
    assert "topicPolicies" not in config
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert (conditions["SettingsValid"]["status"], conditions["SettingsValid"]["reason"]) == (
        "False",
        "InvalidSettings",
    )
    assert "spec.topicPolicies.retentionMinutes" in conditions["SettingsValid"]["message"]


async def test_pods_wait_for_the_pulsar_peer_then_know_both_roles_urls(world: Any) -> None:
    """spec.pulsar names the PendingAckStore serving Pulsar clients with this coordinator: the pods
    are created only once it exists (OnDelete: pods started without its URLs would never learn
    them), and then know both roles' pods, as Pulsar's lookups need."""
    kube, _pods, events, ctx = world
    kube.cr["spec"]["pulsar"] = {"pendingAckStore": "orders"}
    stale = json.loads(json.dumps({**kube.cr, "status": {}}))
    for _ in range(3):
        await reconcile(stale, ctx)
    assert ("StatefulSet", "ns", "txn") not in kube.objects
    reasons = {(type_, reason) for type_, reason, _ in events.seen}
    assert {("Warning", "PulsarPeerNotFound"), ("Warning", "ActionFailed")} <= reasons
    assert any("waiting for PendingAckStore 'orders'" in message for _, _, message in events.seen)
    kube.others[("pendingackstores", "orders")] = {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "PendingAckStore",
        "metadata": {"name": "orders", "namespace": "ns", "uid": "pas-uid", "generation": 1},
        "spec": {"version": "2.0.0", "replicas": 2, "pulsar": {"transactionCoordinator": "txn"}},
    }
    await _until(kube, ctx, Phase.READY)
    container = kube.objects[("StatefulSet", "ns", "txn")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TXNKEEPER_PULSAR_URLS"] == ",".join(
        f"pulsar://orders-{i}.orders.ns.svc:6650" for i in range(2)
    )
    assert env["TXNKEEPER_PULSAR_COORDINATOR_URLS"] == ",".join(
        f"pulsar://txn-{i}.txn.ns.svc:6650" for i in range(3)
    )
