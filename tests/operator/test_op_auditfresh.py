"""The offload audit's freshness decision (pure): a verify-offload run that left no report is named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from txnkeeper_operator import gated, naming
from txnkeeper_operator.auditfresh import RUN_GRACE, AuditRun, audit_runs, report_time, stale_reason
from txnkeeper_operator.engine.persist import format_time
from txnkeeper_operator.resource import Resource

T0 = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
CRON = "txn-verify-offload"


def job(name: str, started: datetime, outcome: str | None, instance: str = "txn") -> dict[str, Any]:
    """A Job object as the API server lists it (``outcome``: Complete, Failed or None: running)."""
    status: dict[str, Any] = {"startTime": format_time(started)}
    if outcome is not None:
        status["conditions"] = [
            {
                "type": outcome,
                "status": "True",
                "reason": "DeadlineExceeded" if outcome == "Failed" else "",
                "message": "Job was active longer than specified deadline" if outcome == "Failed" else "",
                "lastTransitionTime": format_time(started + timedelta(minutes=60)),
            }
        ]
    labels = {**naming.offload_audit_labels(instance)}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def stale(
    report_at: datetime | None, jobs: list[dict[str, Any]], schedule: datetime | None, now: datetime
) -> str | None:
    return stale_reason(report_at, audit_runs(jobs, "txn"), schedule, now, cron_job=CRON)


def test_a_failed_job_newer_than_the_report_makes_it_stale_naming_the_job_and_its_logs() -> None:
    why = stale(
        T0, [job("txn-verify-offload-2", T0 + timedelta(days=1), "Failed")], None, T0 + timedelta(days=2)
    )
    assert why is not None
    assert "Job txn-verify-offload-2" in why and "DeadlineExceeded" in why
    assert "kubectl logs job/txn-verify-offload-2" in why and "earlier report of 2026-11-24T03:00" in why
    # The same without any report at all: the first run died.
    assert "without writing a report" in (
        stale(None, [job("j", T0, "Failed")], None, T0 + timedelta(hours=2)) or ""
    )


def test_a_job_that_reported_even_with_findings_is_current() -> None:
    # Exit 1 (findings) fails the Job, but its report is newer than its start: not stale.
    jobs = [job("old", T0 - timedelta(days=1), "Failed"), job("new", T0 - timedelta(minutes=5), "Failed")]
    assert stale(T0, jobs, T0 - timedelta(minutes=5), T0 + timedelta(days=1)) is None
    # A report stamped a little before the Job start by a skewed pod clock still counts.
    assert (
        stale(T0 - timedelta(seconds=30), [job("j", T0, "Complete")], None, T0 + timedelta(hours=1)) is None
    )


def test_a_running_job_is_never_stale_and_other_resources_jobs_do_not_count() -> None:
    running = [job("j", T0 + timedelta(days=1), None)]
    assert stale(T0, running, T0 + timedelta(days=1), T0 + timedelta(days=3)) is None
    others = [job("x", T0 + timedelta(days=1), "Failed", instance="other")]
    assert audit_runs(others, "txn") == []
    assert stale(T0, others, None, T0 + timedelta(days=3)) is None


def test_a_schedule_without_a_report_after_the_grace_period_is_stale_once_the_jobs_are_gone() -> None:
    schedule = T0 + timedelta(days=1)
    assert stale(T0, [], schedule, schedule + RUN_GRACE - timedelta(minutes=1)) is None  # may still report
    why = stale(T0, [], schedule, schedule + RUN_GRACE + timedelta(minutes=1))
    assert why is not None and "scheduled at 2026-11-25T03:00" in why
    assert f"kubectl describe cronjob/{CRON}" in why
    assert stale(schedule + timedelta(minutes=10), [], schedule, schedule + 2 * RUN_GRACE) is None


def test_report_time_reads_generated_at_or_none() -> None:
    assert report_time({"generatedAt": "2026-11-24T03:00:00Z"}) == T0
    assert report_time({"generatedAt": "yesterday"}) is None
    assert report_time(None) is None
    assert AuditRun("j", T0, None, "").finished is None


def test_the_condition_and_status_say_the_last_audit_did_not_report() -> None:
    cr = Resource.from_body(
        {
            "apiVersion": "txnkeeper.io/v1",
            "kind": "PendingAckStore",
            "metadata": {"name": "txn", "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": {
                "version": "3.0.0",
                "offload": {"driver": "filesystem", "filesystem": {"claimName": "tier"}},
            },
        }
    )
    clean = {"generatedAt": "2026-11-24T03:00:00Z", "ok": True, "findings": []}
    cond = gated.offload_audit_condition(cr, clean, None, "the last offload audit ... check its logs")
    assert (str(cond.status), cond.reason) == ("False", "LastAuditDidNotReport")
    assert gated.audit_status(clean, "why")["stale"] == "why"
    assert gated.audit_status(clean)["stale"] is None  # cleared by the merge patch once current
    assert gated.offload_audit_condition(cr, clean, None).reason == "Clean"
