"""The bounded form of the soak (tests/fault/soak.py) that every test run includes.

Plain SIGKILLs must never cost an acknowledged record nor serve wrong data, and reopening after one must
never refuse. After a mutation of one file of each kind, reopening must refuse naming the file or serve
exactly what was acknowledged. SOAK_SCALE=N multiplies the kills; ``make soak`` runs the long form.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .soak import FAILURES, soak

SCALE = int(os.environ.get("SOAK_SCALE", "1"))
SEED = int(os.environ.get("SOAK_SEED", "20261124"))

KINDS = ["ledger-data", "meta", "cursor", "sequence", "routes", "subscriptions", "side-file"]


def failures(report: dict[str, Any]) -> dict[str, Any]:
    return {c: report[c] for c in FAILURES if report[c]} | (
        {"examples": report["examples"], "replay": report["replay"]} if report["failed_trial_seeds"] else {}
    )


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_plain_kills_lose_nothing_and_never_refuse(tmp_path: Path) -> None:
    report = soak(kills=40 * SCALE, mutations_per_kill=0, seed=SEED, workdir=tmp_path)
    assert report["kills"] >= 40 * SCALE
    assert report["verifications"] == report["kills"]
    assert not failures(report), failures(report)


@pytest.mark.soak
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "kind",
    KINDS,
)
def test_a_damaged_file_is_refused_by_name_or_served_intact(kind: str, tmp_path: Path) -> None:
    report = soak(kills=4 * SCALE, mutations_per_kill=4, seed=SEED, workdir=tmp_path, kinds=frozenset({kind}))
    if report["mutations"] == 0:
        pytest.skip(f"the workload leaves no file of kind {kind} on this branch")
    assert report["mutations_by_kind"] == {kind: report["mutations"]}
    assert not failures(report), failures(report)
