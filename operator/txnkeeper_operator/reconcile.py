"""One reconciliation of one resource: observe, decide, persist (write-ahead), act, publish status.

This is the only place that joins the pure engine to the world. The order matters for restarts: the
engine's progress is written to the status before the action runs, and an action's result (rollover
markers) is folded in and written right after, so an operator killed at any point resumes from a
status that is never ahead of reality in a way that could unlock the downgrade gate.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
from base64 import b64decode
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from txnkeeper.contract import store_settings as gated_settings
from txnkeeper.contract.admin import AdminError
from txnkeeper.contract.formats import OFFLOAD_LEVEL
from txnkeeper_operator import auditfresh, builders, certificates, gated, metrics, naming, podtls, scaling
from txnkeeper_operator.context import Context
from txnkeeper_operator.engine import (
    Action,
    ApplyTemplate,
    Condition,
    ConditionStatus,
    ConfigureBatchLog,
    Decision,
    EngineConfig,
    Observed,
    Phase,
    Progress,
    RestartPod,
    RestoreOffloaded,
    RolloverStores,
    RunVerifier,
    Template,
    decide,
    describe,
    record_rollover,
)
from txnkeeper_operator.engine.moves import ScalingDecision
from txnkeeper_operator.engine.persist import (
    format_time,
    parse_time,
    progress_from_status,
    progress_to_status,
)
from txnkeeper_operator.observe import (
    PodView,
    creation_stamp,
    pod_ready,
    read_offload_audit,
    verifier_state,
)
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.status import AuditView, build_status

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def engine_config(cr: Resource) -> EngineConfig:
    retry = int(cr.section("verifier").get("retrySeconds", 30))
    return EngineConfig(verifier_retry=timedelta(seconds=retry))


async def _token(ctx: Context, cr: Resource) -> str:
    await ctx.kube.create_if_absent(builders.token_secret(cr, secrets.token_urlsafe(32)))
    secret = await ctx.kube.get("Secret", cr.namespace, naming.token_secret(cr.name))
    if secret is None:
        raise AdminError(f"admin token Secret {naming.token_secret(cr.name)} vanished")
    data = secret.get("data") or {}
    if "token" in data:
        return b64decode(data["token"]).decode().strip()
    return str((secret.get("stringData") or {}).get("token", "")).strip()


async def _observe_pod(ctx: Context, cr: Resource, pod: Mapping[str, Any]) -> PodView:
    base = podtls.pod_base(pod)
    if not pod_ready(pod) or base is None:
        return PodView(pod)
    try:
        batch_log, info = await asyncio.gather(ctx.admin.batch_log(base, cr.kind), ctx.admin.info(base))
    except AdminError as err:
        return PodView(pod, error=str(err))
    if cr.kind is naming.TRANSACTION_COORDINATOR:
        return PodView(pod, batch_log=batch_log, info=info, never_offloads=True)
    if not _asks_offload(cr, info):
        return PodView(pod, batch_log=batch_log, info=info)
    try:
        summary = await ctx.admin.offload_summary(base)
    except AdminError as err:
        return PodView(pod, batch_log=batch_log, info=info, offload_error=str(err))
    return PodView(pod, batch_log=batch_log, info=info, offload=summary)


def _asks_offload(cr: Resource, info: Mapping[str, Any]) -> bool:
    """Store pods report offload state when the spec offloads or their release could hold offloaded
    data (a downgrade must see tier-only ledgers even after spec.offload was removed)."""
    if cr.kind is not naming.PENDING_ACK_STORE:
        return False
    return gated_settings.used("offload", cr.spec) or int(info.get("formatLevel", 0)) >= OFFLOAD_LEVEL


async def ensure_children(ctx: Context, cr: Resource) -> str:
    """Everything that exists regardless of the rollout; returns the admin token."""
    for manifest in builders.children(cr, ctx.settings):
        await ctx.kube.apply(manifest)
    await ctx.kube.create_if_absent(builders.markers_config_map(cr, {}, format_time(EPOCH)))
    await ctx.kube.create_if_absent(builders.report_config_map(cr))
    await ctx.kube.create_if_absent(builders.cluster_secret(cr.namespace, secrets.token_urlsafe(32)))
    if gated.audits_offload(cr):
        await ctx.kube.create_if_absent(builders.offload_audit_report_config_map(cr))
    return await _token(ctx, cr)


async def _offload_audit(ctx: Context, cr: Resource) -> AuditView:
    """The audit's report, why it is unusable, and why it is not the last run's (a Job that died
    without reporting must not leave an earlier report looking current)."""
    if not gated.audits_offload(cr):
        return None, None, None
    report_cm = await ctx.kube.get("ConfigMap", cr.namespace, naming.offload_audit_report(cr.name))
    report, problem = read_offload_audit(report_cm)
    if problem is not None:
        return report, problem, None
    component = naming.offload_audit_labels(cr.name)["app.kubernetes.io/component"]
    jobs = await ctx.kube.list_jobs(cr.namespace, f"app.kubernetes.io/component={component}")
    cron = await ctx.kube.get("CronJob", cr.namespace, naming.offload_audit(cr.name))
    raw_schedule = ((cron or {}).get("status") or {}).get("lastScheduleTime")
    stale = auditfresh.stale_reason(
        auditfresh.report_time(report),
        auditfresh.audit_runs(jobs, cr.name),
        parse_time(raw_schedule) if isinstance(raw_schedule, str) else None,
        ctx.clock(),
        cron_job=naming.offload_audit(cr.name),
    )
    return report, None, stale


async def reconcile(body: Mapping[str, Any], ctx: Context) -> Decision | None:
    # Read the resource afresh: the body a trigger carries may predate this operator's last status
    # write, and the engine's memory (status.downgrade) must never be read stale.
    meta = body["metadata"]
    plural = Resource.from_body(body).kind.plural
    fresh = await ctx.kube.get_resource(plural, meta["namespace"], meta["name"])
    if fresh is None:
        return None  # deleted meanwhile
    body = fresh
    cr = Resource.from_body(body)
    # A snapshot: the status is rewritten below and the events compare against what was there before.
    status: Mapping[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
    now = ctx.clock()
    # Paused (Strimzi's pause-reconciliation): observe and report, change nothing.
    if not cr.paused:
        # Before the children: a pod must never start before the certificate Secret it mounts exists.
        # The pods' TLS reports it waits on are read over the scheme each pod serves (podtls).
        existing = await ctx.kube.list_pods(cr.namespace, naming.selector_string(cr.kind, cr.name))
        early = await podtls.pod_calls(
            ctx.client_tls, ctx.kube, ctx.admin, cr, existing, wanted=builders.tls_on(cr, ctx.settings)
        )
        await certificates.ensure(replace(ctx, admin=early.admin), cr, body, status)
    token = "" if cr.paused else await ensure_children(ctx, cr)

    statefulset = await ctx.kube.get("StatefulSet", cr.namespace, cr.name)
    template = builders.template_of(statefulset)
    peer = await _pulsar_peer(ctx, cr, body)
    running = int(statefulset["spec"].get("replicas") or 0) if statefulset else None
    placed, problem = await _placement(ctx, cr, body, statefulset)
    count = _count(cr, placed, running)
    if template is not None and not cr.paused:
        # Keep image, resources in step; the replica count moves only by scaling (ScaleStatefulSet), the
        # version and start-up batch only by ApplyTemplate. The ConfigMap follows the template it
        # belongs to (recreated if someone deleted it).
        await ctx.kube.apply(builders.config_map(cr, template.batch, template.version))
        await ctx.kube.apply(builders.statefulset(cr, template, ctx.settings, peer, count))
    pod_objs = await ctx.kube.list_pods(cr.namespace, naming.selector_string(cr.kind, cr.name))
    # From here every call to a pod goes over the scheme it serves (mutual TLS: podtls.py).
    calls = await podtls.pod_calls(
        ctx.client_tls, ctx.kube, ctx.admin, cr, pod_objs, wanted=builders.tls_on(cr, ctx.settings)
    )
    ctx = replace(ctx, admin=calls.admin)
    _tls_event(ctx, body, status, calls.condition)
    scaled: ScalingDecision | None = None
    if template is not None and placed is not None and not cr.paused:

        async def resize(replicas: int, initial: int, units: int) -> None:
            assert template is not None
            sized = builders.PodCount(replicas, initial, units)
            await ctx.kube.apply(builders.statefulset(cr, template, ctx.settings, peer, sized))

        run = scaling.ScalingRun(ctx, cr, body, pod_objs, resize, token)
        try:
            placed, scaled, replicas = await scaling.step(run, placed, cr.replicas, count.replicas)
            count = replace(count, replicas=replicas)
        except scaling.ScalingUnusable as err:
            problem = str(err)
            ctx.events.emit(body, "Warning", "PlacementUnusable", problem)
    views = list(await asyncio.gather(*(_observe_pod(ctx, cr, p) for p in pod_objs)))
    jobs = await ctx.kube.list_jobs(cr.namespace, f"{naming.VERIFIER_OF_LABEL}={cr.name}")
    report_cm = await ctx.kube.get("ConfigMap", cr.namespace, naming.report_config_map(cr.name))
    verifier, report_problem = verifier_state(jobs, report_cm)
    offload_audit = await _offload_audit(ctx, cr)
    states = tuple(s for s in (v.state() for v in views) if s is not None)
    if template is not None and not cr.paused:
        states = podtls.mark_stale(states, views, tls=builders.tls_on(cr, ctx.settings))
    observed = Observed(template, states, now, verifier, cr.paused)

    progress = progress_from_status(status.get("downgrade"))
    # The rollout waits for the pods the StatefulSet runs now (scaling moves spec.replicas there).
    desired = replace(cr.desired(), replicas=count.replicas)
    decision = decide(desired, observed, progress, engine_config(cr))
    persisted = progress_to_status(decision.progress)
    if persisted != status.get("downgrade"):
        await ctx.kube.patch_status(cr.kind.plural, cr.namespace, cr.name, {"downgrade": persisted})

    final_progress = decision.progress
    last_action: str | None = None
    if decision.action is not None:
        last_action = describe(decision.action)
        try:
            final_progress = await _execute(
                ctx,
                cr,
                body=body,
                action=decision.action,
                views=views,
                token=token,
                progress=final_progress,
                now=now,
                peer=peer,
                creating=template is None,
                count=count,
            )
            ctx.events.emit(body, "Normal", type(decision.action).__name__, decision.action.reason)
        except AdminError as err:
            last_action = f"failed: {last_action}: {err}"
            ctx.events.emit(body, "Warning", "ActionFailed", last_action)
    final = replace_progress(decision, final_progress)
    new_status = build_status(
        cr,
        final,
        pods=views,
        previous=status,
        now=now,
        report=verifier.report,
        last_action=last_action,
        offload_audit=offload_audit,
        placement=scaling.status(cr, placed, scaled, problem),
        scaling=scaling.condition(scaled, _not_scaling(cr, template is None, problem)),
        tls=calls.condition,
    )
    await ctx.kube.patch_status(cr.kind.plural, cr.namespace, cr.name, new_status)
    _phase_events(ctx, body, status, final, report_problem)
    _scale_in_event(ctx, body, status, scaled)
    report = verifier.report
    metrics.RESOURCES.record(
        metrics_key(cr),
        metrics.ResourceRecord(
            phase=final.phase,
            verifier_scheduled=bool(cr.section("verifier").get("schedule")),
            report_generated_at=report.generated_at if report is not None else None,
            report_safe=report.safe if report is not None else None,
        ),
    )
    return final


async def _placement(
    ctx: Context, cr: Resource, body: Mapping[str, Any], statefulset: Mapping[str, Any] | None
) -> tuple[scaling.Placed | None, str | None]:
    """The placement ConfigMap (created with the first record), or why it cannot be used (a Warning
    Event says so; nothing moves until it is repaired)."""
    try:
        return await scaling.load(ctx, cr, statefulset, create=not cr.paused), None
    except scaling.ScalingUnusable as err:
        if not cr.paused:  # paused before its first record: nothing is wrong
            ctx.events.emit(body, "Warning", "PlacementUnusable", str(err))
        return None, str(err)


def _not_scaling(cr: Resource, creating: bool, problem: str | None) -> str:
    """Why no scaling decision was made in this reconcile (ScaleInSafe is then Unknown)."""
    if cr.paused:
        return "reconciliation is paused"
    if problem is not None:
        return problem
    return "the pods are being created" if creating else "not evaluated"


def _count(cr: Resource, placed: scaling.Placed | None, running: int | None) -> builders.PodCount:
    """The StatefulSet's replicas as they are (the scaling engine changes them) and the first record's
    counts the pods are started with."""
    if placed is None:
        return replace(builders.PodCount.of(cr), replicas=running or cr.replicas)
    return builders.PodCount(
        running or placed.state.initial_replicas, placed.state.initial_replicas, placed.record.shards
    )


def metrics_key(cr: Resource) -> tuple[str, str, str]:
    """The operator metrics' labels of ``cr``: namespace, kind, name."""
    return cr.namespace, cr.kind.kind, cr.name


async def _pulsar_peer(ctx: Context, cr: Resource, body: Mapping[str, Any]) -> Resource | None:
    """The resource spec.pulsar names, read afresh (None: none named, or it does not exist: then a
    Warning event says so, and pods already running keep the URLs they were started with)."""
    name = cr.pulsar_peer
    if name is None:
        return None
    kind = cr.pulsar_peer_kind
    found = await ctx.kube.get_resource(kind.plural, cr.namespace, name)
    if found is None:
        ctx.events.emit(
            body,
            "Warning",
            "PulsarPeerNotFound",
            f"spec.pulsar names {kind.kind} {name!r}, which does not exist in {cr.namespace}: Pulsar"
            " clients cannot be sent to its pods (create it, or fix the name)",
        )
        return None
    return Resource.from_body(found)


def replace_progress(decision: Decision, progress: Progress) -> Decision:
    return replace(decision, progress=progress)


def _tls_event(
    ctx: Context, body: Mapping[str, Any], status: Mapping[str, Any], condition: Condition | None
) -> None:
    """A Warning when the operator's client certificate becomes missing or unusable (once, not at
    every reconcile)."""
    if condition is None or condition.status != ConditionStatus.FALSE:
        return
    before = next((c for c in status.get("conditions") or [] if c.get("type") == condition.type), None)
    if before is None or before.get("status") != str(ConditionStatus.FALSE):
        ctx.events.emit(body, "Warning", condition.reason, condition.message)


def _scale_in_event(
    ctx: Context, body: Mapping[str, Any], status: Mapping[str, Any], scaled: ScalingDecision | None
) -> None:
    """A Warning when a scale-in becomes refused (once per refusal, not every reconcile)."""
    if scaled is None or scaled.condition.status != "False":
        return
    before = next((c for c in status.get("conditions") or [] if c.get("type") == scaled.condition.type), None)
    if before is None or before.get("status") != "False":
        ctx.events.emit(body, "Warning", "ScaleInRefused", scaled.condition.message)


def _phase_events(
    ctx: Context, body: Mapping[str, Any], status: Mapping[str, Any], decision: Decision, problem: str | None
) -> None:
    if problem is not None:
        ctx.events.emit(body, "Warning", "VerifierReportUnusable", problem)
    previous = status.get("phase")
    if previous == str(decision.phase) and status.get("phaseReason") == decision.reason:
        return
    if decision.phase == Phase.DOWNGRADE_BLOCKED:
        if previous != str(decision.phase):
            ctx.events.emit(body, "Warning", "DowngradeBlocked", decision.reason)
    elif previous != str(decision.phase):
        ctx.events.emit(body, "Normal", str(decision.phase), decision.reason)


async def _execute(
    ctx: Context,
    cr: Resource,
    *,
    body: Mapping[str, Any],
    action: Action,
    views: list[PodView],
    token: str,
    progress: Progress,
    now: datetime,
    peer: Resource | None = None,
    creating: bool = False,
    count: builders.PodCount | None = None,
) -> Progress:
    by_name = {v.name: v for v in views}
    match action:
        case ApplyTemplate(version=version, batch=batch):
            if creating and cr.pulsar_peer is not None and peer is None:
                # Pods created now would never learn the other role's URLs (OnDelete: a later
                # template change restarts nothing), so creation waits for the named resource.
                raise AdminError(
                    f"waiting for {cr.pulsar_peer_kind.kind} {cr.pulsar_peer!r} named in spec.pulsar"
                    f" (namespace {cr.namespace}) before creating the pods: create it, or fix the name"
                )
            # ConfigMap first: a pod created from the new template must never read the old settings.
            await ctx.kube.apply(builders.config_map(cr, batch, version))
            await ctx.kube.apply(
                builders.statefulset(cr, Template(version, batch), ctx.settings, peer, count)
            )
        case RestartPod(pod=pod):
            await ctx.kube.delete_pod(cr.namespace, pod, by_name[pod].uid)
        case ConfigureBatchLog(pod=pod, batch=batch):
            await ctx.admin.set_batch_log(_base(by_name[pod]), cr.kind, batch, token)
        case RestoreOffloaded(pod=pod):
            try:
                settings = gated.restore_settings(cr)
            except ValueError as err:
                raise AdminError(str(err)) from err
            await ctx.admin.request_offload_restore(_base(by_name[pod]), settings, token)
        case RolloverStores(pod=pod):
            markers = await ctx.admin.rollover(_base(by_name[pod]), token)
            progress = record_rollover(progress, pod, markers)
            # Persist the markers at once: they are the only record of this rollover.
            await ctx.kube.patch_status(
                cr.kind.plural, cr.namespace, cr.name, {"downgrade": progress_to_status(progress)}
            )
            listed = ", ".join(f"{s}={lid}" for s, lid in sorted(markers.items())) or "no stores"
            ctx.events.emit(body, "Normal", "LastBatchedLedger", f"{pod}: {listed}")
        case RunVerifier(markers=markers, taken_at=taken_at):
            await ctx.kube.apply(builders.markers_config_map(cr, markers, format_time(taken_at)))
            await ctx.kube.create_if_absent(builders.verifier_job(cr, ctx.settings, creation_stamp(now)))
    return progress


def _base(view: PodView) -> str:
    base = podtls.pod_base(view.obj)
    if base is None:
        raise AdminError(f"{view.name} has no pod IP")
    return base
