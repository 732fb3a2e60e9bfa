"""The bounded form of the cluster soak (tests/fault/cluster_soak.py) that every test run includes.

Real ``txnkeeper serve`` pods (a coordinator and two stores) SIGKILLed at random moments while
applications use the client API: nothing acknowledged may go missing, nothing may be served wrong or
twice where exactly-once was promised, and every refusal must be a clear error. SOAK_SCALE=N
multiplies the kills; ``make soak`` runs the long form (1,000 kills).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .cluster_soak import FAILURES, cluster_soak

SCALE = int(os.environ.get("SOAK_SCALE", "1"))
SEED = int(os.environ.get("SOAK_SEED", "20261127"))
KILLS = 6


def failures(report: dict[str, Any]) -> dict[str, Any]:
    return {c: report[c] for c in FAILURES if report[c]} | (
        {"examples": report["examples"], "replay": report["replay"]} if report["failed_trial_seeds"] else {}
    )


@pytest.mark.soak
@pytest.mark.timeout(900 * SCALE)
def test_pods_killed_under_client_load_lose_nothing_acknowledged(tmp_path: Path) -> None:
    report = cluster_soak(kills=KILLS * SCALE, seed=SEED, workdir=tmp_path)
    assert not failures(report), failures(report)
    assert report["kills"] >= KILLS * SCALE
    assert report["verifications"] == report["cycles"]  # every kill/restart cycle was judged
    # Not vacuous: every kind of acknowledgement was made and judged, and takeovers happened.
    acknowledged = report["acknowledged"]
    for kind in ("plain_sends", "full_txn_commits", "single_key_commits", "named_sends"):
        assert acknowledged[kind] > 0, (kind, acknowledged)
    assert report["reopened_instances"] > 0  # writer ids and producer names opened again
    assert report["takeovers"] > 0  # and a second instance opened while the first one still wrote
