"""The operator restarting in every phase of a full lifecycle resumes from persisted progress + pods.

Each case runs install 1.0.0 -> upgrade to 2.0.0 with batching -> pause -> downgrade to 1.0.0 held by a
long transaction, then released; the operator "dies" once, at the first decision in the given phase,
before persisting anything, after persisting the decision but before acting, or after acting but
before persisting what the action returned (the handlers persist progress before they act). The
outcome must match the uninterrupted run action for action (a repeated rollover of the same pod is the
only allowed difference: it only makes LastBatchedLedger stricter), and the invariant holds throughout.
"""

from __future__ import annotations

import itertools

import pytest

from txnkeeper_operator.engine import Decision, Phase

from .opsim import ON, SimCluster, desired

LIFECYCLE_PHASES = [
    Phase.CREATING,
    Phase.READY,
    Phase.ROLLING_UPGRADE,
    Phase.WAITING_FOR_PODS,
    Phase.ENABLING_BATCH_LOG,
    Phase.PAUSED,
    Phase.DISABLING_BATCH_LOG,
    Phase.ROLLING_OVER_LEDGERS,
    Phase.VERIFYING_DOWNGRADE,
    Phase.DOWNGRADE_BLOCKED,
    Phase.ROLLING_DOWNGRADE,
]


class CrashOnce:
    """Fires at the first decision in ``phase`` and never again."""

    def __init__(self, phase: Phase | None) -> None:
        self.phase = phase
        self.fired = False

    def __call__(self, decision: Decision) -> bool:
        if self.fired or decision.phase != self.phase:
            return False
        self.fired = True
        return True


def lifecycle(crash: CrashOnce, mode: str) -> SimCluster:
    sim = SimCluster()
    sim.run(desired("1.0.0"), crash_when=crash, crash_mode=mode)
    sim.tick()
    sim.run(desired("2.0.0", ON), crash_when=crash, crash_mode=mode)
    sim.tick()
    sim.paused = True
    sim.run(desired("1.0.0"), until=lambda d: d.phase == Phase.PAUSED, crash_when=crash, crash_mode=mode)
    sim.tick()
    sim.paused = False
    sim.pods[1].pinned = True
    sim.run(
        desired("1.0.0"),
        until=lambda d: d.phase == Phase.DOWNGRADE_BLOCKED,
        crash_when=crash,
        crash_mode=mode,
    )
    for _ in range(8):
        decision = sim.step(desired("1.0.0"), crash=mode if crash(_probe(sim)) else None)
        assert decision.action is None or "verify" in sim.log[-1] or sim.log[-1] == "operator restart"
        sim.tick()
    sim.pods[1].pinned = False
    sim.run(desired("1.0.0"), crash_when=crash, crash_mode=mode)
    return sim


def _probe(sim: SimCluster) -> Decision:
    from txnkeeper_operator.engine import decide

    from .opsim import CONFIG

    return decide(desired("1.0.0"), sim.observe(), sim.progress(), CONFIG)


def _essential(log: list[str]) -> list[str]:
    kept = [a for a in log if a not in ("verify", "operator restart") and not a.startswith("crash")]
    return [a for a, _ in itertools.groupby(kept)]


BASELINE = _essential(lifecycle(CrashOnce(None), "before").log)


def test_baseline_lifecycle_is_the_documented_procedure() -> None:
    assert BASELINE == [
        "template 1.0.0 batch=off",
        "template 2.0.0 batch=off",
        "restart tc-2 -> 2.0.0",
        "restart tc-1 -> 2.0.0",
        "restart tc-0 -> 2.0.0",
        "template 2.0.0 batch=on",
        "batch tc-2 on",
        "batch tc-1 on",
        "batch tc-0 on",
        "template 2.0.0 batch=off",
        "batch tc-2 off",
        "batch tc-1 off",
        "batch tc-0 off",
        "rollover tc-2",
        "rollover tc-1",
        "rollover tc-0",
        "template 1.0.0 batch=off",
        "restart tc-2 -> 1.0.0",
        "restart tc-1 -> 1.0.0",
        "restart tc-0 -> 1.0.0",
    ]


@pytest.mark.parametrize("mode", ["before", "between", "after"])
@pytest.mark.parametrize("phase", LIFECYCLE_PHASES, ids=str)
def test_operator_restart_in_every_phase(phase: Phase, mode: str) -> None:
    crash = CrashOnce(phase)
    sim = lifecycle(crash, mode)
    assert crash.fired, f"the lifecycle never reached {phase}"
    assert sim.log.count("operator restart") == 1
    assert _essential(sim.log) == BASELINE
    assert all(p.version == "1.0.0" and p.ready and not p.batched_ledgers for p in sim.pods.values())
    sim.check_invariant()
