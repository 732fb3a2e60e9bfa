"""Scaling scenarios as data files (scenarios/scaling/*.txt), in the style of test_engine_datadriven.

Each block is a command, ``----`` and the exact output; TXNKEEPER_REWRITE_SCENARIOS=1 rewrites the
outputs from the engine's behaviour (review that diff). The simulated pods (scalesim.py) check after
every step that no acknowledged write is lost, no shard is served twice and no removed pod held data.

Every scenario is also replayed with an interruption at the first action of each move phase its runs
pass through (precopy, fence, receive, switch, release, rollback): the operator dying in each of its
three ways (before persisting the decision, after persisting it but before acting, after the action but
before folding its result in), and the move's source or target pod dying before it applies the verb or after
it applied it but before answering. The replay must end where the uninterrupted run ends (the same
owners after an operator restart: the engine is deterministic; the same per-pod counts after a pod
kill, which can change which ready pod was chosen), with the invariants holding throughout.

Commands:
  cluster store|coordinator replicas=R units=N [max=M]   a resource reconciled at R pods, its first
                                   record (N shards or coordinator ids), maxConcurrentMoves M (default 1)
  scale R                          spec.replicas = R
  run [steps=N]                    reconcile + tick until settled (at most N, default 300): prints the
                                   actions, the phase, ScaleInSafe and the placement
  steps N                          N x (reconcile, tick), printing the actions and the phase
  load UNIT BPS TPS                the unit's measured bytes/s and txn/s (reported by its owner)
  annotate                         txnkeeper.io/rebalance=now
  fail POD VERB N                  POD's next N calls of VERB (precopy, fence, receive, put, release,
                                   discard, unfence) fail
  kill POD [TICKS]                 the pod is down (not Ready) for TICKS ticks (default 2), data kept
  placement                        the record, moves in flight and failed moves
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from txnkeeper_operator.engine.moves import decide
from txnkeeper_operator.engine.placement import (
    MovePhase,
    MoveStep,
    PushPlacement,
    ScalingAction,
    UnitLoad,
)

from .scalesim import PodError, SimScaling, member
from .test_engine_datadriven import _blocks

SCENARIOS = Path(__file__).parent / "scenarios" / "scaling"
REWRITE = os.environ.get("TXNKEEPER_REWRITE_SCENARIOS") == "1"
PATHS = sorted(SCENARIOS.glob("*.txt"))
OPERATOR_MODES = ("before", "between", "after")
POD_MODES = ("kill-before", "kill-after")


def _phase_of(action: ScalingAction) -> MovePhase | None:
    if isinstance(action, MoveStep):
        return action.move.phase
    if isinstance(action, PushPlacement) and action.move is not None:
        return MovePhase.SWITCH
    return None


@dataclass
class Interrupt:
    """Fires once, at the first action of a move in ``phase``: ``who`` is "operator", "source" or
    "target"; ``mode`` an operator crash mode or a pod kill mode."""

    phase: MovePhase
    who: str
    mode: str
    fired: bool = False


class _Runner:
    def __init__(self, interrupt: Interrupt | None = None) -> None:
        self.sim: SimScaling | None = None
        self.interrupt = interrupt
        self.phases: list[MovePhase] = []

    def cluster(self) -> SimScaling:
        if self.sim is None:
            raise ValueError("the scenario must start with 'cluster'")
        return self.sim

    def execute(self, command: str) -> str:
        word, *args = command.split()
        options = dict(a.split("=", 1) for a in args if "=" in a)
        if word == "cluster":
            kind = {"store": "store-shards", "coordinator": "coordinator-ids"}[args[0]]
            self.sim = SimScaling.create(
                kind,  # type: ignore[arg-type]
                int(options["replicas"]),
                int(options["units"]),
                int(options.get("max", "1")),
            )
            self._arm()
            return ""
        sim = self.cluster()
        if word == "scale":
            sim.desired = int(args[0])
        elif word == "run":
            return self._run(int(options.get("steps", "300")), report=True)
        elif word == "steps":
            return self._run(int(args[0]), report=False)
        elif word == "load":
            sim.load[int(args[0])] = UnitLoad(0, float(args[1]), float(args[2]))
        elif word == "annotate":
            sim.annotation = True
        elif word == "fail":
            sim.pods[int(args[0])].fail[args[1]] = int(args[2])
        elif word == "kill":
            sim.kill(int(args[0]), int(args[1]) if len(args) > 1 else 2)
        elif word == "placement":
            return _placement(sim)
        else:
            raise ValueError(f"unknown scenario command {word!r}")
        return ""

    # ---- interruptions ---------------------------------------------------------------------------
    def _arm(self) -> None:
        sim, interrupt = self.cluster(), self.interrupt
        if interrupt is None or interrupt.who == "operator":
            return

        def before(action: ScalingAction) -> None:
            if interrupt.mode == "kill-before" and self._fires(action):
                self._kill(action)
                raise PodError("pod died before it applied the verb")

        def after(action: ScalingAction) -> None:
            if interrupt.mode == "kill-after" and self._fires(action):
                self._kill(action)
                raise PodError("pod died before it answered")

        sim.before, sim.after = before, after

    def _fires(self, action: ScalingAction) -> bool:
        interrupt = self.interrupt
        if interrupt is None or interrupt.fired or _phase_of(action) != interrupt.phase:
            return False
        interrupt.fired = True
        return True

    def _kill(self, action: ScalingAction) -> None:
        assert self.interrupt is not None
        move = action.move if isinstance(action, MoveStep | PushPlacement) else None
        assert move is not None
        ordinal = move.source if self.interrupt.who == "source" else move.target
        if ordinal in self.cluster().pods:
            self.cluster().kill(ordinal, 3)

    def _operator_crash(self) -> str | None:
        sim, interrupt = self.cluster(), self.interrupt
        if interrupt is None or interrupt.who != "operator" or interrupt.fired:
            return None
        peek = decide(sim.observe(), {o: member(o) for o in range(max(sim.replicas, sim.desired))})
        if any(_phase_of(a) == interrupt.phase for a in peek.actions):
            interrupt.fired = True
            return interrupt.mode
        return None

    # ---- the loop --------------------------------------------------------------------------------
    def _run(self, limit: int, *, report: bool) -> str:
        sim = self.cluster()
        start = len(sim.history)
        for _ in range(limit):
            peek = decide(sim.observe(), {o: member(o) for o in range(max(sim.replicas, sim.desired))})
            for action in peek.actions:
                phase = _phase_of(action)
                if phase is not None and phase not in self.phases:
                    self.phases.append(phase)
            crash = self._operator_crash()
            taken = sim.reconcile(crash)  # type: ignore[arg-type]
            sim.tick()
            if report and not taken and crash is None and sim.settled():
                break
        else:
            if report:
                raise AssertionError(f"not settled after {limit} steps: {_placement(sim)}")
        lines = [f"{line} (x{n})" if n > 1 else line for line, n in _grouped(sim.history[start:])]
        lines += [f"phase {sim.phases[0]}", *sim.phases[1:]]
        if report:
            lines.append(_placement(sim))
        return "\n".join(lines)


def _grouped(lines: list[str]) -> list[tuple[str, int]]:
    return [(k, len(list(g))) for k, g in itertools.groupby(lines)]


def _placement(sim: SimScaling) -> str:
    assert sim.record is not None and sim.state is not None
    pods = ", ".join(f"{o}:{list(sim.record.shards_of(o))}" for o in range(sim.replicas))
    out = [f"epoch {sim.record.epoch} replicas {sim.replicas} owners {pods}"]
    out += [f"moving {m.id} {m.phase} failures={m.failures}" for m in sim.state.moves]
    out += [f"failed {f.id} unit {f.unit} {f.source}->{f.target}: {f.error}" for f in sim.state.failed]
    return "\n".join(out)


def _play(path: Path, interrupt: Interrupt | None = None) -> tuple[_Runner, list[str]]:
    runner = _Runner(interrupt)
    blocks = _blocks(path.read_text())
    assert blocks, f"{path} holds no scenario"
    return runner, [runner.execute(command) for _, command, _ in blocks]


def _counts(sim: SimScaling) -> list[int]:
    assert sim.record is not None
    return sorted(len(sim.record.shards_of(o)) for o in range(sim.replicas))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scaling_scenario(path: Path) -> None:
    blocks = _blocks(path.read_text())
    _, actual = _play(path)
    if REWRITE:
        path.write_text(
            "".join(
                f"{note}{command}\n----\n{got}\n\n"
                for (note, command, _), got in zip(blocks, actual, strict=True)
            )
        )
        return
    for (_, command, expected), got in zip(blocks, actual, strict=True):
        assert got == expected, f"{path.name}: {command}\n--- expected\n{expected}\n--- got\n{got}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scaling_survives_an_operator_restart_in_every_move_phase(path: Path) -> None:
    baseline, _ = _play(path)
    end = baseline.cluster()
    assert end.record is not None and end.state is not None
    for phase, mode in itertools.product(baseline.phases, OPERATOR_MODES):
        interrupt = Interrupt(phase, "operator", mode)
        replay, _ = _play(path, interrupt)
        where = f"{path.name}: operator restart ({mode}) at the first {phase} action"
        assert interrupt.fired, where
        sim = replay.cluster()
        assert sim.record is not None and sim.state is not None
        assert sim.record.owners == end.record.owners, where
        assert sim.replicas == end.replicas, where
        assert [f.unit for f in sim.state.failed] == [f.unit for f in end.state.failed], where
        sim.check()


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scaling_survives_a_pod_kill_in_every_move_phase(path: Path) -> None:
    baseline, _ = _play(path)
    end = baseline.cluster()
    assert end.state is not None
    for phase, who, mode in itertools.product(baseline.phases, ("source", "target"), POD_MODES):
        interrupt = Interrupt(phase, who, mode)
        replay, _ = _play(path, interrupt)
        where = f"{path.name}: the {who} killed ({mode}) at the first {phase} action"
        # After it applied the verb: only where some action of the phase succeeds (not in a scenario
        # whose every receive fails); before it: always.
        assert interrupt.fired or mode == "kill-after", where
        sim = replay.cluster()
        assert sim.state is not None
        assert _counts(sim) == _counts(end), where
        assert sim.replicas == end.replicas, where
        assert len(sim.state.failed) == len(end.state.failed), where
        sim.check()
