"""Scenario tests of the pure rollout engine that need more than the data files in scenarios/ can say
(hand-made reports, crashes, scale changes, deleted StatefulSets): invariant checked every step.

Every scenario runs on the simulated StatefulSet in opsim.py, which raises InvariantViolation the moment
any pod runs, or could be recreated, at a format level below what its live data needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from txnkeeper_operator.engine import (
    ApplyTemplate,
    ConditionStatus,
    Decision,
    Observed,
    Phase,
    PodState,
    Progress,
    RestartPod,
    Template,
    VerifierReport,
    decide,
)

from .opsim import CONFIG, OFF, ON, T0, InvariantViolation, SimCluster, desired, installed

UPGRADE_ROLL = ["restart tc-2 -> 2.0.0", "restart tc-1 -> 2.0.0", "restart tc-0 -> 2.0.0"]
ENABLE = ["template 2.0.0 batch=on", "batch tc-2 on", "batch tc-1 on", "batch tc-0 on"]
DISABLE = ["template 2.0.0 batch=off", "batch tc-2 off", "batch tc-1 off", "batch tc-0 off"]
ROLLOVERS = ["rollover tc-2", "rollover tc-1", "rollover tc-0"]
DOWN_ROLL = [
    "template 1.0.0 batch=off",
    "restart tc-2 -> 1.0.0",
    "restart tc-1 -> 1.0.0",
    "restart tc-0 -> 1.0.0",
]


def phase_is(phase: Phase) -> Callable[[Decision], bool]:
    return lambda d: d.phase == phase


def _describe(d: Decision) -> str:
    return type(d.action).__name__ + ":" + (getattr(d.action, "pod", "") or "")


def final_state(sim: SimCluster, version: str, batch_on: bool) -> None:
    assert all(p.version == version and p.ready for p in sim.pods.values())
    assert all(p.batch.enabled == batch_on for p in sim.pods.values())
    sim.check_invariant()


# ---- upgrade ---------------------------------------------------------------------------------------


def test_no_pod_is_batched_before_every_pod_is_upgraded() -> None:
    sim = installed("1.0.0")
    sim.run(desired("2.0.0", ON))
    log = sim.actions()
    assert max(i for i, a in enumerate(log) if a.startswith("restart")) < log.index("batch tc-2 on")


# ---- dynamic toggles ---------------------------------------------------------------------------


def test_changing_batch_limits_reconfigures_every_pod() -> None:
    sim = installed("2.0.0", ON)
    smaller = replace(ON, max_records=64, max_delay_millis=5)
    sim.run(desired("2.0.0", smaller))
    assert sim.actions() == [
        "template 2.0.0 batch=on",
        "batch tc-2 on",
        "batch tc-1 on",
        "batch tc-0 on",
    ]
    assert all(p.batch == smaller for p in sim.pods.values())


# ---- downgrade ---------------------------------------------------------------------------------


def test_downgrade_is_held_while_the_verifier_says_not_yet() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[1].pinned = True
    blocked = sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    assert "tc-1/s0" in blocked.reason and "held since" in blocked.reason
    assert blocked.condition("DowngradeSafe").status == ConditionStatus.FALSE
    assert sim.persisted is not None and "blockedSince" in sim.persisted
    for _ in range(12):  # stays held, asks the verifier again, never restarts a pod
        d = sim.step(desired("1.0.0"))
        assert d.phase == Phase.DOWNGRADE_BLOCKED, d.reason
        assert d.condition("DowngradeSafe").status == ConditionStatus.FALSE
        sim.tick()
    assert not any(a.startswith(("restart", "template 1")) for a in sim.actions())
    assert sim.actions().count("verify") >= 2
    sim.pods[1].pinned = False
    sim.run(desired("1.0.0"))
    log = sim.actions()
    assert log[: len(DISABLE) + 3] == [*DISABLE, *ROLLOVERS]
    assert log[-len(DOWN_ROLL) :] == DOWN_ROLL
    final_state(sim, "1.0.0", False)


def test_stale_safe_report_is_not_accepted() -> None:
    sim = installed("2.0.0", ON)
    sim.report = VerifierReport(T0, {}, True)  # from before the markers existed
    sim.run(desired("1.0.0"))
    assert sim.actions() == [*DISABLE, *ROLLOVERS, "verify", *DOWN_ROLL]


def test_report_against_other_markers_is_not_accepted() -> None:
    sim = installed("2.0.0", ON)
    sim.run(desired("1.0.0"), until=phase_is(Phase.VERIFYING_DOWNGRADE))
    progress = sim.progress()
    assert progress.downgrade is not None
    wrong = {store: ledger - 1 for store, ledger in progress.downgrade.flat_markers().items()}
    obs = sim.observe()
    bogus = VerifierReport(sim.now + timedelta(seconds=1), wrong, True)
    obs = Observed(
        obs.template, obs.pods, sim.now + timedelta(seconds=2), replace(obs.verifier, report=bogus)
    )
    d = decide(desired("1.0.0"), obs, progress, CONFIG)
    assert d.phase == Phase.VERIFYING_DOWNGRADE
    assert not isinstance(d.action, RestartPod)


def test_report_against_markers_taken_at_another_time_is_not_accepted() -> None:
    sim = installed("2.0.0", ON)
    sim.run(desired("1.0.0"), until=phase_is(Phase.VERIFYING_DOWNGRADE))
    progress = sim.progress()
    assert progress.downgrade is not None and progress.downgrade.markers_complete_at is not None
    markers = progress.downgrade.flat_markers()
    other_round = progress.downgrade.markers_complete_at - timedelta(seconds=30)
    report = VerifierReport(sim.now + timedelta(seconds=1), markers, True, (), other_round)
    obs = sim.observe()
    obs = Observed(
        obs.template, obs.pods, sim.now + timedelta(seconds=2), replace(obs.verifier, report=report)
    )
    assert not isinstance(decide(desired("1.0.0"), obs, progress, CONFIG).action, RestartPod)
    matching = replace(report, markers_taken_at=progress.downgrade.markers_complete_at)
    obs = replace(obs, verifier=replace(obs.verifier, report=matching))
    assert decide(desired("1.0.0"), obs, progress, CONFIG).condition("DowngradeSafe").status == "True"


def _gate_with_report(make: Callable[[dict[str, int], datetime], VerifierReport]) -> Decision:
    """Stop a downgrade at its gate, hand the engine the report `make` builds, return its decision."""
    sim = installed("2.0.0", ON)
    sim.run(desired("1.0.0"), until=phase_is(Phase.VERIFYING_DOWNGRADE))
    progress = sim.progress()
    assert progress.downgrade is not None and progress.downgrade.markers_complete_at is not None
    report = make(progress.downgrade.flat_markers(), progress.downgrade.markers_complete_at)
    obs = sim.observe()
    obs = Observed(
        obs.template, obs.pods, sim.now + timedelta(seconds=2), replace(obs.verifier, report=report)
    )
    return decide(desired("1.0.0"), obs, progress, CONFIG)


def test_safe_report_that_names_no_markers_taken_at_is_stale() -> None:
    d = _gate_with_report(lambda markers, taken: VerifierReport(taken + timedelta(seconds=1), markers, True))
    assert d.condition("DowngradeSafe").status != "True"
    assert not isinstance(d.action, RestartPod | ApplyTemplate)


def test_safe_report_over_more_markers_than_the_current_ones_is_stale() -> None:
    def superset(markers: dict[str, int], taken: datetime) -> VerifierReport:
        return VerifierReport(taken + timedelta(seconds=1), {**markers, "gone/s9": 4}, True, (), taken)

    d = _gate_with_report(superset)
    assert d.condition("DowngradeSafe").status != "True"
    assert not isinstance(d.action, RestartPod | ApplyTemplate)
    exact = _gate_with_report(
        lambda markers, taken: VerifierReport(taken + timedelta(seconds=1), markers, True, (), taken)
    )
    assert exact.condition("DowngradeSafe").status == "True"


def test_batching_reenabled_during_gate_invalidates_markers() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[1].pinned = True
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    sim.pods[0].batch = ON  # someone used the admin API by hand
    sim.pods[1].pinned = False
    sim.log.clear()
    sim.run(desired("1.0.0"))
    assert sim.actions() == ["batch tc-0 off", *ROLLOVERS, "verify", *DOWN_ROLL]


def test_verifier_that_never_answers_is_requested_again_after_timeout() -> None:
    sim = installed("2.0.0")
    sim.verifier_seconds = 10_000
    sim.run(desired("1.0.0"), until=lambda d: d.action is not None and sim.actions()[-1] == "verify")
    sim.verifier_running = False  # the Job vanished without a report
    for _ in range(int(CONFIG.verifier_timeout.total_seconds()) + 2):
        sim.tick()
        sim.step(desired("1.0.0"))
        if sim.actions().count("verify") == 2:
            break
    assert sim.actions().count("verify") == 2


def test_verifier_job_failing_without_a_report_is_retried_after_the_retry_interval() -> None:
    sim = installed("2.0.0")
    sim.verifier_seconds = 10_000
    sim.run(desired("1.0.0"), until=lambda d: sim.actions()[-1:] == ["verify"])
    sim.verifier_running = False
    sim.verifier_failed_at, sim.verifier_failure = sim.now, "Job txn-verify-1 failed: BackoffLimitExceeded"
    d = sim.step(desired("1.0.0"))
    assert d.action is None and "BackoffLimitExceeded" in d.reason
    for _ in range(int(CONFIG.verifier_retry.total_seconds())):
        sim.tick()
        d = sim.step(desired("1.0.0"))
    assert sim.actions().count("verify") == 2  # well before verifier_timeout
    assert "running it again" in d.reason or sim.verifier_running


def test_unreachable_admin_api_holds_the_gate() -> None:
    sim = installed("2.0.0", ON)
    sim.reachable = False
    for _ in range(5):
        d = sim.step(desired("1.0.0"))
        sim.tick()
    assert d.action is None and "waiting" in d.reason
    assert not sim.actions() or sim.actions() == ["template 2.0.0 batch=off"]
    sim.reachable = True
    sim.run(desired("1.0.0"))
    final_state(sim, "1.0.0", False)


# ---- pods failing -------------------------------------------------------------------------------


def test_pod_crash_mid_upgrade_comes_back_at_template_and_is_not_rolled_twice() -> None:
    sim = installed("1.0.0")
    sim.run(desired("2.0.0", ON), until=lambda d: sim.actions()[-1:] == ["restart tc-2 -> 2.0.0"])
    sim.crash_pod(0)  # recreated by the StatefulSet at 2.0.0, unbatched
    waiting = sim.step(desired("2.0.0", ON))
    assert waiting.action is None and waiting.phase == Phase.WAITING_FOR_PODS
    sim.tick()
    sim.run(desired("2.0.0", ON))
    assert sim.actions() == [
        "template 2.0.0 batch=off",
        "restart tc-2 -> 2.0.0",
        "restart tc-1 -> 2.0.0",
        *ENABLE,
    ]
    final_state(sim, "2.0.0", True)


def test_pod_crash_at_the_gate_comes_back_batched_capable() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[0].pinned = True
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    sim.crash_pod(0)  # the template is still 2.0.0: the pod can read its batched ledgers
    assert sim.pods[0].version == "2.0.0" and not sim.pods[0].batch.enabled
    sim.tick()
    sim.pods[0].pinned = False
    sim.run(desired("1.0.0"))
    final_state(sim, "1.0.0", False)


def test_pod_crash_after_verification_comes_back_old() -> None:
    sim = installed("2.0.0", ON)
    sim.run(desired("1.0.0"), until=lambda d: sim.actions()[-1:] == ["template 1.0.0 batch=off"])
    sim.crash_pod(1)
    sim.tick()
    sim.run(desired("1.0.0"))
    assert sim.actions()[-3:] == [
        "template 1.0.0 batch=off",
        "restart tc-2 -> 1.0.0",
        "restart tc-0 -> 1.0.0",
    ]
    final_state(sim, "1.0.0", False)


def test_unready_pod_at_template_version_is_waited_for() -> None:
    sim = installed("2.0.0", ON)
    sim.crash_pod(1)
    sim.pods[1].crashlooping = True
    for _ in range(3):
        d = sim.step(desired("2.1.0", ON))
        sim.tick()
        assert d.action is None and "tc-1" in d.reason
    sim.pods[1].crashlooping = False
    sim.tick()
    sim.run(desired("2.1.0", ON))
    final_state(sim, "2.1.0", True)


def test_pod_stuck_at_a_stale_version_is_restarted_from_the_template() -> None:
    sim = installed("1.0.0")
    sim.run(desired("2.0.0"), until=lambda d: sim.actions()[-1:] == ["template 2.0.0 batch=off"])
    sim.tick()
    sim.pods[1].ready, sim.pods[1].crashlooping = False, True
    d = sim.step(desired("2.0.0"))
    assert isinstance(d.action, RestartPod) and d.action.pod == "tc-1"
    sim.tick()
    sim.run(desired("2.0.0"))
    final_state(sim, "2.0.0", False)


def test_scale_up_during_the_gate_rolls_over_the_new_pod_too() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[1].pinned = True
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    sim.pods[1].pinned = False
    sim.log.clear()
    sim.run(desired("1.0.0", replicas=4))
    assert sim.actions()[0] == "rollover tc-3"
    assert "restart tc-3 -> 1.0.0" in sim.actions()
    final_state(sim, "1.0.0", False)


def test_scale_down_during_the_gate_does_not_wait_for_the_removed_pod() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[2].pinned = True  # the pod being removed never becomes verifiable
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    sim.log.clear()
    sim.run(desired("1.0.0", replicas=2))
    assert set(sim.verifier_markers) == {"tc-0/s0", "tc-0/s1", "tc-1/s0", "tc-1/s1"}
    assert sim.actions()[-2:] == ["restart tc-1 -> 1.0.0", "restart tc-0 -> 1.0.0"]
    final_state(sim, "1.0.0", False)


def test_scale_up_while_batched_starts_the_new_pod_batched() -> None:
    sim = installed("2.0.0", ON)
    sim.run(desired("2.0.0", ON, replicas=4))
    assert sim.actions() == []
    final_state(sim, "2.0.0", True)


def test_statefulset_deleted_with_orphans_mid_gate_is_recreated_batched_capable() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[1].pinned = True
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    sim.delete_statefulset(orphan=True)
    sim.log.clear()
    sim.step(desired("1.0.0"))
    assert sim.actions() == ["template 2.0.0 batch=off"]
    sim.tick()
    sim.pods[1].pinned = False
    sim.run(desired("1.0.0"))
    final_state(sim, "1.0.0", False)


def test_statefulset_and_pods_deleted_mid_gate_come_back_from_the_persisted_version() -> None:
    sim = installed("2.0.0", ON)
    sim.pods[0].pinned = True
    sim.run(desired("1.0.0"), until=phase_is(Phase.DOWNGRADE_BLOCKED))
    assert sim.persisted is not None and sim.persisted["fromVersion"] == "2.0.0"
    sim.delete_statefulset(orphan=False)  # only the volumes (and the resource's status) remain
    sim.log.clear()
    sim.step(desired("1.0.0"))
    assert sim.actions() == ["template 2.0.0 batch=off"]
    sim.tick()
    sim.pods[0].pinned = False
    sim.run(desired("1.0.0"))
    final_state(sim, "1.0.0", False)


def test_a_naive_recreation_would_have_been_caught() -> None:
    sim = installed("2.0.0", ON)
    sim.delete_statefulset(orphan=False)
    sim.template = Template("1.0.0", OFF)
    with pytest.raises(InvariantViolation):
        sim._statefulset_controller(desired("1.0.0"))


# ---- pause ------------------------------------------------------------------------------------------


def test_pause_stops_all_actions_and_resumes_where_it_was() -> None:
    sim = installed("1.0.0")
    sim.run(desired("2.0.0", ON), until=lambda d: sim.actions()[-1:] == ["restart tc-2 -> 2.0.0"])
    sim.tick()
    sim.paused = True
    for _ in range(4):
        d = sim.step(desired("2.0.0", ON))
        sim.tick()
        assert d.action is None and d.phase == Phase.PAUSED
        assert d.condition("Paused").status == ConditionStatus.TRUE
    assert sim.actions() == ["template 2.0.0 batch=off", "restart tc-2 -> 2.0.0"]
    sim.paused = False
    sim.run(desired("2.0.0", ON))
    assert sim.actions() == ["template 2.0.0 batch=off", *UPGRADE_ROLL, *ENABLE]


# ---- the invariant checker itself can fail -----------------------------------------------------


def test_invariant_checker_catches_a_naive_downgrade() -> None:
    sim = installed("2.0.0", ON)
    sim.template = Template("1.0.0", OFF)
    with pytest.raises(InvariantViolation):
        sim.check_invariant()


def test_engine_never_rolls_down_when_data_may_be_batched() -> None:
    pods = tuple(PodState(i, f"tc-{i}", "2.0.0", True, OFF) for i in range(3))
    obs = Observed(Template("2.0.0", OFF), pods, T0)
    d = decide(desired("1.0.0"), obs, Progress(), CONFIG)
    assert not isinstance(d.action, RestartPod)
    assert d.phase == Phase.ROLLING_OVER_LEDGERS
