"""Release-gated PendingAckStore settings (``spec.offload``, ``spec.singleKeyTransactions``) as the
operator renders and reports them.

Why a module: these sections reach a pod only when the release it starts with has the feature (a 2.x
pod handed an offload section would refuse to start, or worse, ignore it), so the ConfigMap, the
StatefulSet's env and volumes, and the FeaturesSupported condition must all ask the same question of
the same table (``contract.formats``). The CRD's CEL rules refuse most such specs at admission; this
covers objects admitted earlier and a template still at an older release during an upgrade. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from txnkeeper.contract import store_settings as gated
from txnkeeper.contract.formats import Feature, FeatureUnavailableError, UnknownReleaseError, require_feature
from txnkeeper.contract.settings import offload as offload_settings
from txnkeeper_operator import naming
from txnkeeper_operator.engine import Condition, ConditionStatus
from txnkeeper_operator.resource import Resource

OFFLOAD_VOLUME = "offload"
MAX_REPORTED_FINDINGS = 20
MAX_REPORTED_UNREADABLE = 5  # unreadable tier data named in OffloadHealthy's message
MAX_UNREADABLE_ERROR_CHARS = 300


def refusals(cr: Resource, version: str) -> list[str]:
    """Why each section the spec switches on cannot be used at ``version`` (empty: all can)."""
    out = []
    for section, feature in gated.GATED_SECTIONS.items():
        if not gated.used(section, cr.spec):
            continue
        try:
            require_feature(version, feature, f"spec.{section}")
        except (FeatureUnavailableError, UnknownReleaseError) as exc:
            out.append(str(exc))
    return out


def _allowed(cr: Resource, section: str, version: str) -> bool:
    if not gated.configured(section, cr.spec):
        return False
    try:
        require_feature(version, gated.GATED_SECTIONS[section], f"spec.{section}")
    except (FeatureUnavailableError, UnknownReleaseError):
        return False
    return True


def _has(version: str, feature: Feature) -> bool:
    try:
        require_feature(version, feature, "")
    except (FeatureUnavailableError, UnknownReleaseError):
        return False
    return True


def config_sections(cr: Resource, version: str) -> dict[str, Any]:
    """The pod config file's gated top-level sections for a pod starting at ``version``."""
    out: dict[str, Any] = {}
    if _allowed(cr, "offload", version):
        offload = dict(cr.section("offload"))
        if not _has(cr.version, gated.GATED_SECTIONS["offload"]):
            # The spec heads for a release without offload (a downgrade): never offload anew, whatever
            # spec.offload.enabled says (the CRD refuses that combination; older objects may hold it).
            offload["enabled"] = False
        out["offload"] = offload_settings.offload_config(offload)
    if _allowed(cr, "singleKeyTransactions", version):
        out["singleKeyTransactions"] = gated.single_key_config(cr.section("singleKeyTransactions"))
    return out


def offload_env(cr: Resource, version: str) -> list[dict[str, Any]]:
    """The credentials Secret's keys as env (boto3's default chain reads them)."""
    secret = cr.section("offload").get("credentialsSecret") or {}
    if not _allowed(cr, "offload", version) or not secret.get("name"):
        return []
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": str(secret["name"]), "key": key}}}
        for key in offload_settings.S3_CREDENTIAL_KEYS
    ]


def offload_volumes(cr: Resource, version: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) for the filesystem driver's shared RWX claim."""
    offload = cr.section("offload")
    claim = (offload.get("filesystem") or {}).get("claimName")
    if not _allowed(cr, "offload", version) or offload.get("driver") != "filesystem" or not claim:
        return [], []
    volume = {"name": OFFLOAD_VOLUME, "persistentVolumeClaim": {"claimName": str(claim)}}
    mount = {"name": OFFLOAD_VOLUME, "mountPath": offload_settings.OFFLOAD_MOUNT_DIR}
    return [volume], [mount]


def offload_executor_conf(cr: Resource, version: str) -> dict[str, str]:
    """What Spark on Kubernetes must give the offload audit's executor pods so they read the tier as
    the job's pod does: the credentials as env from the same Secret keys, and the filesystem
    driver's shared claim read-only at the same path (Spark's executor pod settings)."""
    conf: dict[str, str] = {}
    for entry in offload_env(cr, version):
        ref = entry["valueFrom"]["secretKeyRef"]
        conf[f"spark.kubernetes.executor.secretKeyRef.{entry['name']}"] = f"{ref['name']}:{ref['key']}"
    volumes, mounts = offload_volumes(cr, version)
    for volume, mount in zip(volumes, mounts, strict=True):
        prefix = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{volume['name']}"
        conf[f"{prefix}.options.claimName"] = str(volume["persistentVolumeClaim"]["claimName"])
        conf[f"{prefix}.mount.path"] = str(mount["mountPath"])
        conf[f"{prefix}.mount.readOnly"] = "true"
    return conf


def features_condition(cr: Resource, version: str) -> Condition:
    """FeaturesSupported: False (FeatureUnavailable) while the spec asks for what ``version`` lacks."""
    problems = refusals(cr, version)
    if problems:
        return Condition(
            "FeaturesSupported",
            ConditionStatus.FALSE,
            "FeatureUnavailable",
            "; ".join(problems) + " (the section is left out of the pods' config until then)",
        )
    return Condition(
        "FeaturesSupported",
        ConditionStatus.TRUE,
        "Supported",
        f"release {version} has every feature the spec uses",
    )


def restore_settings(cr: Resource) -> dict[str, Any]:
    """The blob-store settings a pod's restore request carries (POST /admin/v1/offload/restore)."""
    if not gated.configured("offload", cr.spec):
        raise ValueError(
            "a pod still holds tier-only ledgers but spec.offload is gone: put it back with "
            "enabled: false (same driver and location) so they can be restored before the downgrade"
        )
    return offload_settings.offload_config(cr.section("offload"))


def offload_condition(
    cr: Resource, summaries: Sequence[tuple[str, Mapping[str, Any] | None, str | None]]
) -> Condition:
    """OffloadHealthy from each pod's (name, GET /admin/v1/offload/summary, error).

    False, in this order: UnreadableTierData when a pod could not read tier data (damaged or missing
    objects, an unreachable tier: its readers are refused until it is repaired), naming the pod, topic,
    segment, object and problem; FailedSegments when a pod reports Failed segments (the blob store
    refused or was unreachable; they are retried); SummaryUnavailable when a pod's summary could not be
    read."""
    if not gated.used("offload", cr.spec):
        return Condition(
            "OffloadHealthy", ConditionStatus.UNKNOWN, "NotConfigured", "spec.offload is not set"
        )
    failed = []
    unreadable = []
    damaged = []
    for name, summary, error in summaries:
        if summary is None:
            unreadable.append(f"{name}: {error or 'no answer'}")
            continue
        damaged += [_unreadable_data(name, row) for row in summary.get("unreadableTierData") or []]
        count = int((summary.get("segments") or {}).get("Failed", 0))
        if count:
            failed.append(f"{name}: {count} Failed segment(s)")
        if summary.get("unreadable"):
            unreadable.append(f"{name}: {len(summary['unreadable'])} unreadable ledger metadata file(s)")
    if damaged:
        shown = damaged[:MAX_REPORTED_UNREADABLE]
        more = len(damaged) - len(shown)
        return Condition(
            "OffloadHealthy",
            ConditionStatus.FALSE,
            "UnreadableTierData",
            "; ".join(shown)
            + (f"; and {more} more" if more else "")
            + " (reads of these entries are refused, nothing wrong is served; restore the objects or "
            "the tier, see `txnkeeper admin topics offload-status TOPIC` on the pod)",
        )
    if failed:
        return Condition(
            "OffloadHealthy",
            ConditionStatus.FALSE,
            "FailedSegments",
            "; ".join(failed) + " (uploads failed, e.g. the blob store is unreachable; they are retried)",
        )
    if unreadable:
        return Condition("OffloadHealthy", ConditionStatus.FALSE, "SummaryUnavailable", "; ".join(unreadable))
    return Condition(
        "OffloadHealthy",
        ConditionStatus.TRUE,
        "Healthy",
        "no pod reports a Failed segment or unreadable tier data",
    )


def _unreadable_data(pod: str, row: Any) -> str:
    """One pod's unreadable tier data (a summary's ``unreadableTierData`` row) in a condition message."""
    if not isinstance(row, Mapping):
        return f"{pod}: unreadable tier data"
    error = str(row.get("error", ""))
    if len(error) > MAX_UNREADABLE_ERROR_CHARS:
        error = error[:MAX_UNREADABLE_ERROR_CHARS] + "..."
    segment = row.get("segment") or "(no segment holds them)"
    return (
        f"{pod}: topic {row.get('topic', '?')} segment {segment} (object {row.get('object') or '-'}, "
        f"entries {row.get('entries', '?')}) {row.get('kind', 'unreadable')}: {error}"
    )


# ---- the offload audit (verify-offload CronJob) ---------------------------------------------------------


def audits_offload(cr: Resource) -> bool:
    """Whether the resource gets the verify-offload CronJob: a PendingAckStore whose spec names an
    offload location and whose release has the feature (pods below it serve no offload summary)."""
    return cr.kind is naming.PENDING_ACK_STORE and _allowed(cr, "offload", cr.version)


def audit_settings(cr: Resource) -> dict[str, Any]:
    """The blob-store settings the audit reads the tier with: the pods' own offload section."""
    return offload_settings.offload_config(cr.section("offload"))


def audit_status(report: Mapping[str, Any], stale: str | None = None) -> dict[str, Any]:
    """status.offloadAudit from the audit's report (contracts §7): counts and the first findings, and
    ``stale`` when the last run left no report (this one is an earlier run's)."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, Mapping)]
    out: dict[str, Any] = {
        "generatedAt": str(report.get("generatedAt", "")),
        "ok": bool(report.get("ok", False)),
        "findingCount": len(findings),
        "findings": [
            {k: str(f[k]) for k in ("kind", "pod", "store", "uuid", "key", "detail") if f.get(k) is not None}
            for f in findings[:MAX_REPORTED_FINDINGS]
        ],
    }
    for key in ("pods", "segments", "segmentsChecked", "blocksSampled", "objects"):
        if isinstance(report.get(key), int):
            out[key] = int(report[key])
    # Merge-patched into the status: None removes what an earlier report or run left there.
    out["error"] = str(report["error"]) if report.get("error") else None
    out["stale"] = stale
    return out


def offload_audit_condition(
    cr: Resource, report: Mapping[str, Any] | None, problem: str | None, stale: str | None = None
) -> Condition:
    """OffloadAudit: True when the last verify-offload run found nothing, False on findings, a run
    that could not audit or a run that left no report (``stale``, auditfresh: False rather than
    Unknown, because an audit that silently stops running must alert like one that fails), Unknown
    before the first run (or without offload)."""
    if not audits_offload(cr):
        return Condition(
            "OffloadAudit", ConditionStatus.UNKNOWN, "NotConfigured", "no offload for this release to audit"
        )
    if problem is not None:
        return Condition("OffloadAudit", ConditionStatus.FALSE, "ReportUnusable", problem)
    if stale is not None:
        return Condition("OffloadAudit", ConditionStatus.FALSE, "LastAuditDidNotReport", stale)
    if report is None:
        schedule = cr.section("offload").get("verifySchedule") or ""
        how = f"schedule {schedule!r}" if schedule else "no verifySchedule"
        return Condition(
            "OffloadAudit",
            ConditionStatus.UNKNOWN,
            "NoReport",
            f"no verify-offload report yet ({how}; run one with kubectl create job --from="
            f"cronjob/{naming.offload_audit(cr.name)} NAME)",
        )
    status = audit_status(report)
    at = status["generatedAt"]
    if status["error"] is not None:
        why = f"audit at {at} could not run: {status['error']}"
        return Condition("OffloadAudit", ConditionStatus.FALSE, "AuditFailed", why)
    if not status["ok"]:
        kinds: dict[str, int] = {}
        for finding in report.get("findings") or []:
            kind = str(finding.get("kind", "unknown")) if isinstance(finding, Mapping) else "unknown"
            kinds[kind] = kinds.get(kind, 0) + 1
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "not ok"
        return Condition(
            "OffloadAudit",
            ConditionStatus.FALSE,
            "Findings",
            f"audit at {at}: {listed} (status.offloadAudit.findings lists them)",
        )
    return Condition(
        "OffloadAudit",
        ConditionStatus.TRUE,
        "Clean",
        f"audit at {at}: {status.get('segmentsChecked', 0)} segment(s) of {status.get('pods', 0)} pod(s) "
        f"checked, {status.get('blocksSampled', 0)} block(s) sampled, no findings",
    )
