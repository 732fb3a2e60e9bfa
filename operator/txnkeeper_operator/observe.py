"""Translate Kubernetes objects and admin-API answers into the engine's `Observed` (pure functions).

Readiness, versions and batch-log state are read from what the cluster and the pods say right now,
never from what the operator remembers doing: that is what makes a restarted operator resume correctly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from txnkeeper.contract.admin import PodBatchLog
from txnkeeper_operator import naming
from txnkeeper_operator.engine import OffloadState, PodState, VerifierReport, VerifierState
from txnkeeper_operator.engine.certs import PodTls
from txnkeeper_operator.engine.persist import MalformedReportError, parse_time, report_from_json

Obj = Mapping[str, Any]


def pod_ready(pod: Obj) -> bool:
    """Ready and not on its way out (a terminating pod is never waited on as if it were serving)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def pod_version(pod: Obj) -> str | None:
    return (pod.get("metadata", {}).get("labels") or {}).get(naming.VERSION_LABEL)


def pod_ip(pod: Obj) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return str(ip) if ip else None


def admin_base(ip: str, *, tls: bool = False) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{'https' if tls else 'http'}://{host}:{naming.ADMIN_PORT}"


@dataclass(frozen=True, slots=True)
class PodView:
    """One pod with what its admin API said (None: not asked or no answer)."""

    obj: Obj
    batch_log: PodBatchLog | None = None
    info: Mapping[str, Any] | None = None
    error: str | None = None
    # GET /admin/v1/offload/summary of a store pod that offloads (or may hold offloaded data).
    offload: Mapping[str, Any] | None = None
    offload_error: str | None = None
    # Coordinator pods: their transaction logs are never offloaded, so they never hold a downgrade.
    never_offloads: bool = False

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"].get("uid", ""))

    def state(self) -> PodState | None:
        version = pod_version(self.obj)
        if version is None:
            return None  # not a pod this operator created
        ready = pod_ready(self.obj)
        batch = self.batch_log.effective() if (ready and self.batch_log is not None) else None
        return PodState(
            naming.pod_ordinal(self.name), self.name, version, ready, batch, self._offload_state()
        )

    def _offload_state(self) -> OffloadState | None:
        if self.never_offloads:
            return OffloadState(0, 1)
        doc = self.offload
        if doc is None:
            return None
        try:
            return OffloadState(
                int(doc["tierOnlyLedgers"]),
                int(doc["maxMetadataVersion"]),
                bool(doc.get("restoreRequested", False)),
                bool(doc.get("automaticOffload", False)),
            )
        except (KeyError, TypeError, ValueError):
            return None  # a malformed answer proves nothing


def verifier_running(jobs: Sequence[Obj]) -> bool:
    """Any verifier Job that has neither completed nor failed."""
    for job in jobs:
        conditions = (job.get("status") or {}).get("conditions") or []
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
        )
        if not finished and not job.get("metadata", {}).get("deletionTimestamp"):
            return True
    return False


def read_report(config_map: Obj | None) -> tuple[VerifierReport | None, str | None]:
    """The report in the report ConfigMap, or why there is none usable."""
    if not config_map:
        return None, None
    raw = (config_map.get("data") or {}).get(naming.REPORT_KEY)
    if not raw:
        return None, None
    try:
        return report_from_json(json.loads(raw)), None
    except (ValueError, MalformedReportError) as err:
        return None, f"unusable verifier report: {err}"


def read_offload_audit(config_map: Obj | None) -> tuple[dict[str, Any] | None, str | None]:
    """The verify-offload report in its ConfigMap (None: none yet), or why it is unusable."""
    raw = ((config_map or {}).get("data") or {}).get(naming.REPORT_KEY)
    if not raw:
        return None, None
    try:
        doc = json.loads(raw)
    except ValueError as err:
        return None, f"unusable offload audit report: {err}"
    if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
        return None, "unusable offload audit report: not an object with a boolean 'ok'"
    return doc, None


def latest_failure(jobs: Sequence[Obj]) -> tuple[datetime | None, str]:
    """When the most recent failed verifier Job failed, and why (None: no failed Job)."""
    latest: tuple[datetime, str] | None = None
    for job in jobs:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") != "Failed" or cond.get("status") != "True":
                continue
            raw = cond.get("lastTransitionTime")
            if not isinstance(raw, str):
                continue
            at = parse_time(raw)
            why = f"Job {job['metadata']['name']} failed: {cond.get('reason', '')} {cond.get('message', '')}"
            if latest is None or at > latest[0]:
                latest = (at, why.strip())
    return (latest[0], latest[1]) if latest else (None, "")


def verifier_state(jobs: Sequence[Obj], report_config_map: Obj | None) -> tuple[VerifierState, str | None]:
    report, problem = read_report(report_config_map)
    failed_at, failure = latest_failure(jobs)
    return VerifierState(verifier_running(jobs), report, failed_at, failure), problem


def creation_stamp(now: datetime) -> int:
    return int(now.timestamp())


def tls_report(pod: str, doc: object) -> PodTls:
    """A pod's ``GET /admin/v1/tls`` answer (docs/contracts.md) as the certificate engine reads it; a
    malformed answer is no report (the CA rotation waits on that pod, naming it)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("enabled"), bool):
        return PodTls(pod, problem="its TLS report is not an object with a boolean 'enabled'")
    if not doc["enabled"]:
        return PodTls(pod, enabled=False)
    cert = doc.get("certificate")
    trusted = doc.get("trustedCAs")
    if not isinstance(cert, Mapping) or not isinstance(trusted, list):
        return PodTls(pod, problem="its TLS report has no 'certificate' object or 'trustedCAs' list")
    issuer = cert.get("issuerFingerprint")
    return PodTls(
        pod,
        enabled=True,
        fingerprint=str(cert.get("fingerprint") or "") or None,
        issuer=str(issuer) if issuer else None,
        trusted=frozenset(str(t) for t in trusted),
        reload_failing=bool(doc.get("reloadFailing", False)),
    )
