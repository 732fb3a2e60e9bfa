"""Fail a verifier job whose cluster gives it no executor, instead of letting it hang.

On a cluster master a job's tasks wait for executors. When none ever registers (executor pods that
cannot be scheduled: quota, node selectors, an image the nodes cannot pull; executors that cannot reach
the driver), Spark waits without end and the job only dies at its Kubernetes deadline, minutes later
and without a report, so the operator shows a stale one. Waiting here, with a deadline and a message
that says where to look, turns that into a failure report the downgrade gate shows at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from txnkeeper.verifier.model import VerifierInfraError

ENV_WAIT_SECONDS = "TXNKEEPER_VERIFIER_EXECUTOR_WAIT_SECONDS"
# Above Spark's own wait for all executors on Kubernetes (spark_k8s: maxRegisteredResourcesWaitingTime
# 180 s), so a slow but working cluster is not failed here first.
DEFAULT_WAIT_SECONDS = 240.0
_POLL_SECONDS = 0.5


def wait_seconds(env: Mapping[str, str]) -> float:
    text = env.get(ENV_WAIT_SECONDS, "")
    if not text:
        return DEFAULT_WAIT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 24 * 3600:
        raise VerifierInfraError(f"{ENV_WAIT_SECONDS} must be seconds in (0, 86400], got {text!r}")
    return value


def registered_executors(context: Any) -> int:
    """Executors registered with this driver (Spark counts the driver itself among them)."""
    return max(0, len(context._jsc.sc().statusTracker().getExecutorInfos()) - 1)


def await_executors(context: Any, env: Mapping[str, str] | None = None) -> None:
    """Return once at least one executor registered (at once in local mode, which has none of its
    own); raise VerifierInfraError when none did within the wait."""
    master = str(context.master)
    if master.startswith("local"):
        return
    timeout = wait_seconds(os.environ if env is None else env)
    deadline = time.monotonic() + timeout
    while registered_executors(context) == 0:
        if time.monotonic() >= deadline:
            raise VerifierInfraError(
                f"no Spark executor registered with the driver within {timeout:g} s (master {master}); "
                "nothing was checked. On Kubernetes look at the executor pods (label "
                "app.kubernetes.io/component=verifier-executor: `kubectl describe pod`, the namespace's "
                "events and quota); on a standalone cluster at the master's workers and free cores"
            )
        time.sleep(_POLL_SECONDS)
