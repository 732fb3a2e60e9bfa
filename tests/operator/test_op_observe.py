"""Reading the cluster: readiness, verifier Jobs and the report ConfigMap, never optimistic."""

from __future__ import annotations

import json
from typing import Any

from txnkeeper_operator import naming
from txnkeeper_operator.engine.persist import parse_time
from txnkeeper_operator.observe import latest_failure, pod_ready, verifier_running, verifier_state


def _job(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": at, "reason": "BackoffLimitExceeded"}
                for t, at in conditions
            ]
        },
    }


def test_terminating_or_unconditioned_pods_are_not_ready() -> None:
    ready = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_ready(ready)
    assert not pod_ready({**ready, "metadata": {"deletionTimestamp": "2026-11-21T22:00:00Z"}})
    assert not pod_ready({"metadata": {}, "status": {}})


def test_verifier_jobs_running_and_latest_failure() -> None:
    old = _job("v-1", ("Failed", "2026-11-21T22:00:00Z"))
    new = _job("v-2", ("Failed", "2026-11-21T22:05:00Z"))
    done = _job("v-3", ("Complete", "2026-11-21T22:06:00Z"))
    running = {"metadata": {"name": "v-4"}, "status": {"active": 1}}
    assert not verifier_running([old, new, done]) and verifier_running([done, running])
    at, why = latest_failure([old, new, done])
    assert at == parse_time("2026-11-21T22:05:00Z") and "v-2" in why and "BackoffLimitExceeded" in why
    assert latest_failure([done]) == (None, "")


def test_an_unusable_report_is_no_report_and_says_why() -> None:
    cm = {"data": {naming.REPORT_KEY: json.dumps({"kind": "VerifierReport", "safe": "yes"})}}
    state, problem = verifier_state([], cm)
    assert state.report is None and problem is not None and "unusable" in problem
    assert verifier_state([], {"data": {}}) == (verifier_state([], None)[0], None)
