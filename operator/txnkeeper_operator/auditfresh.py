"""Whether the offload audit's report is the last audit's: decided from its Jobs and its schedule.

Why: the report ConfigMap keeps whatever report a verify-offload Job last wrote. A Job that dies without
writing one (killed for memory, past its activeDeadlineSeconds, an image it cannot pull, a crash before
the report) leaves the previous report in place, and status.offloadAudit would go on showing it as if
it were current: a tier that went bad since would look clean. So the operator compares the report's
``generatedAt`` with the last audit Job (and, once finished Jobs are gone after their TTL, with the
CronJob's last schedule time plus a grace period) and says so when the last run did not report.

Pure: the reconciler passes in the Jobs, the CronJob's ``status.lastScheduleTime`` and the time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from txnkeeper_operator.engine.persist import format_time, parse_time

# A run may legitimately last the Job's activeDeadlineSeconds (builders: 3600 s); a report later than
# that after the schedule, with no Job left to look at, is overdue.
RUN_GRACE = timedelta(seconds=3600 + 600)
# generatedAt comes from the audit pod's clock, Job times from the API server's.
CLOCK_SKEW = timedelta(minutes=2)

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AuditRun:
    """One verify-offload Job, as far as freshness goes."""

    job: str
    started: datetime
    finished: datetime | None  # None: still running
    failure: str  # "" unless the Job failed: its reason and message


def audit_runs(jobs: Sequence[Obj], instance: str) -> list[AuditRun]:
    """The audit Jobs of resource ``instance`` (a listing by the audit component label may hold other
    resources' Jobs of the namespace)."""
    runs = []
    for job in jobs:
        meta = job.get("metadata") or {}
        if (meta.get("labels") or {}).get("app.kubernetes.io/instance") != instance:
            continue
        status = job.get("status") or {}
        raw_start = status.get("startTime") or meta.get("creationTimestamp")
        if not isinstance(raw_start, str):
            continue
        finished: datetime | None = None
        failure = ""
        for cond in status.get("conditions") or []:
            if cond.get("status") != "True" or cond.get("type") not in {"Complete", "Failed"}:
                continue
            raw = cond.get("lastTransitionTime") or status.get("completionTime") or raw_start
            finished = parse_time(str(raw))
            if cond.get("type") == "Failed":
                failure = f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
        runs.append(AuditRun(str(meta.get("name", "?")), parse_time(raw_start), finished, failure))
    return runs


def report_time(report: Mapping[str, Any] | None) -> datetime | None:
    """The report's generatedAt (None: no report, or a time that cannot be read)."""
    raw = (report or {}).get("generatedAt")
    if not isinstance(raw, str):
        return None
    try:
        return parse_time(raw)
    except ValueError:
        return None


def stale_reason(
    reported_at: datetime | None,
    runs: Sequence[AuditRun],
    last_schedule: datetime | None,
    now: datetime,
    *,
    cron_job: str,
    grace: timedelta = RUN_GRACE,
) -> str | None:
    """Why the last audit run left no report (the report at ``reported_at`` is older than that run),
    or None while the report is the last run's, a run is in progress, or one may still report."""

    def covers(moment: datetime) -> bool:
        return reported_at is not None and reported_at >= moment - CLOCK_SKEW

    shown = (
        f"; status.offloadAudit still shows the earlier report of {format_time(reported_at)}"
        if reported_at is not None
        else ""
    )
    latest = max(runs, key=lambda r: r.started, default=None)
    if latest is not None:
        if latest.finished is None:
            return None  # running: it may still report
        if not covers(latest.started):
            how = f"failed ({latest.failure})" if latest.failure else "finished"
            return (
                f"the last offload audit, Job {latest.job} started {format_time(latest.started)}, {how}"
                f" without writing a report{shown}; check its logs (kubectl logs job/{latest.job}), fix"
                f" the cause and run it again (kubectl create job --from=cronjob/{cron_job} NAME)"
            )
    if last_schedule is not None and not covers(last_schedule) and now > last_schedule + grace:
        if latest is not None and latest.started >= last_schedule - CLOCK_SKEW:
            return None  # that run's Job reported (checked above)
        return (
            f"no offload audit report since the run scheduled at {format_time(last_schedule)} (more than"
            f" {int(grace.total_seconds() // 60)} min ago) and no Job of it is left to look at{shown};"
            f" check the CronJob's events (kubectl describe cronjob/{cron_job}) and run it by hand"
            f" (kubectl create job --from=cronjob/{cron_job} NAME) to see its logs"
        )
    return None
