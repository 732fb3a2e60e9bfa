"""What ``verify now``, ``pause`` and ``resume`` change, and the calls that change it.

``verify now`` does what ``kubectl create job --from=cronjob/NAME-verifier`` does (the Job spec is the
CronJob's jobTemplate, owned by the CronJob, annotated as a manual instantiation) and makes sure the Job
carries the verifier labels: the operator recognises verifier Jobs by ``txnkeeper.io/verifier-of=NAME``
(a running one holds a downgrade's verifier step), and the Job writes its report to the ConfigMap
``NAME-verifier-report`` that the operator reads into ``status.lastVerifierReport``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from txnkeeper_operator import naming
from txnkeeper_operator.kubectl_plugin.connect import REQUEST_TIMEOUT, Cluster
from txnkeeper_operator.kubectl_plugin.failures import PluginError, call
from txnkeeper_operator.kubectl_plugin.reads import Obj, cron_job, rbac_name
from txnkeeper_operator.kubectl_plugin.refs import Ref

# kubectl create job --from=cronjob/... sets it: tells people and tools the Job was not scheduled.
INSTANTIATE_ANNOTATION = "cronjob.kubernetes.io/instantiate"
# Job names are pod label values (job-name): 63 characters at most, with the server's 5-character suffix.
MAX_JOB_NAME = 63
GENERATED_SUFFIX = 5


def manual_job_prefix(resource: str) -> str:
    prefix = f"{naming.verifier(resource)}-manual-"
    return prefix[: MAX_JOB_NAME - GENERATED_SUFFIX]


def job_from_cron_job(cron: Mapping[str, Any], resource: str) -> Obj:
    """The Job ``kubectl create job --from=cronjob/...`` would make, with the verifier's labels. Named by
    the API server (generateName), so two runs in the same second never collide."""
    template = cron["spec"]["jobTemplate"]
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "generateName": manual_job_prefix(resource),
            "namespace": cron["metadata"]["namespace"],
            "labels": {**(meta.get("labels") or {}), **naming.verifier_labels(resource)},
            "annotations": {**(meta.get("annotations") or {}), INSTANTIATE_ANNOTATION: "manual"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": cron["metadata"]["name"],
                    "uid": cron["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": copy.deepcopy(template["spec"]),
    }


def verify_now(cluster: Cluster, ref: Ref, obj: Obj) -> tuple[Obj, str]:
    """Create the on-demand verifier Job; returns it and a note about the schedule."""
    assert ref.name is not None
    name = naming.verifier(ref.name)
    cron = cron_job(cluster, name)
    if cron is None:
        raise PluginError(
            f"{ref} has no verifier CronJob {name!r} in namespace {cluster.namespace!r}: the operator"
            " creates it (suspended unless spec.verifier.schedule is set) when it reconciles the resource;"
            " check that the operator runs and that the resource is not paused, or set"
            " spec.verifier.schedule (e.g. '*/30 * * * *') for periodic runs"
        )
    body = job_from_cron_job(cron, ref.name)
    job = call(
        cluster.batch.create_namespaced_job,
        cluster.namespace, body,
        verb="create", resource="jobs.batch", namespace=cluster.namespace, server=cluster.server,
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    created: Obj = cluster.api.sanitize_for_serialization(job)
    schedule = str(((obj.get("spec") or {}).get("verifier") or {}).get("schedule") or "")
    note = (
        f"periodic runs: {schedule!r} (spec.verifier.schedule)"
        if schedule
        else "no periodic runs: spec.verifier.schedule is empty (set it, e.g. '*/30 * * * *', to run"
        " the verifier periodically)"
    )
    return created, note


def pause_patch(paused: bool) -> Obj:
    """The merge patch that sets (``"true"``) or removes (null) the pause annotation."""
    return {"metadata": {"annotations": {naming.PAUSE_ANNOTATION: "true" if paused else None}}}


def set_paused(cluster: Cluster, ref: Ref, paused: bool) -> Obj:
    assert ref.name is not None
    patched: Obj = call(
        cluster.custom.patch_namespaced_custom_object,
        naming.GROUP, naming.API_VERSION, cluster.namespace, ref.kind.plural, ref.name, pause_patch(paused),
        _content_type="application/merge-patch+json",
        verb="patch", resource=rbac_name(ref.kind), namespace=cluster.namespace, server=cluster.server,
        name=ref.name, _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    return patched
