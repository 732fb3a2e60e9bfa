"""Engine scenarios written as data files (etcd raft's datadriven style), all read by this one test.

Each file in scenarios/ is a sequence of blocks: a command line, ``----``, and the exact output the
command must produce. The simulated cluster (opsim.py) raises InvariantViolation the moment any pod
runs, or could be recreated, at a format level below what its live data needs, so every step of every
scenario is also checked for safety. Set TXNKEEPER_REWRITE_SCENARIOS=1 to rewrite the expected outputs
from the engine's current behaviour (then review the diff: that diff is the behaviour change).

Every scenario is also replayed with the operator restarting once, at the first decision in each phase
its ``run``/``steps`` commands pass through, in each way it can die (before persisting anything, after
persisting the decision but before acting, after acting but before persisting the action's result):
the actions taken must be the uninterrupted run's (a repeated action, e.g. a second rollover of the same
pod, is the only allowed difference: it only makes LastBatchedLedger stricter) and the pods must end
the same, with the invariant holding throughout. A file therefore never restarts the operator itself:
the replay covers every phase it passes in every mode, and a restart of its own would fight that one.

Commands (DESIRED is ``VERSION [on] [replicas=N] [records=N] [delay=MS]``; ``on`` enables the batch
log, records/delay change its limits):
  new                              an empty cluster (no StatefulSet yet)
  install DESIRED                  a cluster already reconciled to DESIRED
  run DESIRED [until=PHASE] [after=ACTION]
                                   reconcile until Ready with nothing to do (or until PHASE, or until
                                   ACTION, which may hold spaces, was the last action taken); prints
                                   the actions taken, the phases passed, the last decision's phase and
                                   conditions, and every pod
  step DESIRED                     one decision; prints its phase, action and reason
  steps N DESIRED                  N x (one decision, tick): prints the actions and decisions, a run of
                                   equal lines once with its count
  tick [SECONDS]                   the world moves on (load writes, trims, the verifier finishes)
  pin POD / unpin POD              a never-ending transaction pins (or stops pinning) POD's ledgers
  crash POD                        the pod is deleted; the StatefulSet recreates it from the template
  crashloop POD / recover POD      the pod is unready and stays so (crash-looping) / starts normally
  set-batch POD on|off             someone sets POD's batch log through the admin API by hand
  pause / resume                   the pause annotation is set / removed
  unreachable / reachable          the pods' admin APIs stop / start answering
  delete-statefulset [orphan]      kubectl delete sts (--cascade=orphan: the pods keep running)
  verifier-seconds N               how long the verifier Job takes from now on
  verifier-vanishes                the running verifier Job disappears without a report
  verifier-fails MESSAGE           the running verifier Job fails without a report
  report stale                     a safe report from before the downgrade's markers existed is present
  judge DESIRED report=KIND        what the engine would decide, at the downgrade gate, given a safe
                                   report of KIND (wrong-markers, other-round, no-taken-at, superset,
                                   matching) instead of the real one; nothing is acted on
  template DESIRED                 overwrite the StatefulSet template by hand (a naive operator)
  controller DESIRED               the StatefulSet controller recreates missing pods from the template
  invariant                        "ok", or the violation the invariant checker finds
  pods                             every pod with its batch-log limits and readiness
  markers                          the stores the last verifier request covered
  offload POD N                    POD's volume now holds N tier-only ledgers (PIP-76, needs 3.x)
  offload-config on|off            the template's config offloads automatically (on: running 3.x
                                   pods too, as if started with it; off: running pods keep theirs)
  persisted                        which keys the persisted status.downgrade holds (or "none")
  windows EXPR[; EXPR...]          spec.maintenanceWindows from now on (cron in UTC; none: no windows)
  now                              the simulated clock (UTC; the scenarios start Saturday 22:00)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from txnkeeper_operator.engine import (
    Decision,
    Desired,
    Observed,
    Phase,
    Template,
    VerifierReport,
    decide,
    format_level,
)

from .opsim import CONFIG, OFF, ON, T0, InvariantViolation, SimCluster, desired, installed

SCENARIOS = Path(__file__).parent / "scenarios"
REWRITE = os.environ.get("TXNKEEPER_REWRITE_SCENARIOS") == "1"
CRASH_MODES = ("before", "between", "after")
# What ``run`` accepts: DESIRED's options, and where to stop.
RUN_OPTIONS = frozenset({"replicas", "records", "delay", "until"})


def _blocks(text: str) -> list[tuple[str, str, str]]:
    """(comment, command, expected output) triples; # lines before a command are its comment."""
    blocks: list[tuple[str, str, str]] = []
    lines = text.splitlines()
    comment: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("#"):
            comment.append(line)
            continue
        if not line:
            continue
        if i >= len(lines) or lines[i].strip() != "----":
            raise ValueError(f"command {line!r} at line {i} is not followed by a ---- line")
        i += 1
        out: list[str] = []
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        blocks.append(("".join(c + "\n" for c in comment), line, "\n".join(out)))
        comment = []
    return blocks


def _describe(d: Decision) -> str:
    return "none" if d.action is None else f"{type(d.action).__name__} {getattr(d.action, 'pod', '')}".strip()


def _decision_line(d: Decision) -> str:
    return f"phase {d.phase}; action {_describe(d)}; reason {d.reason}"


def _desired(args: list[str]) -> Desired:
    """VERSION [on] [replicas=N] [records=N] [delay=MS]."""
    options = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    batch = ON if "on" in args[1:] else OFF
    if "records" in options:
        batch = replace(batch, max_records=int(options["records"]))
    if "delay" in options:
        batch = replace(batch, max_delay_millis=int(options["delay"]))
    return desired(args[0], batch, int(options.get("replicas", "3")))


class CrashOnce:
    """The operator dies (in ``mode``) at the first decision in ``phase``, and never again."""

    def __init__(self, phase: Phase, mode: str) -> None:
        self.phase, self.mode, self.fired = phase, mode, False

    def __call__(self, decision: Decision) -> bool:
        if self.fired or decision.phase != self.phase:
            return False
        self.fired = True
        return True


class _Runner:
    def __init__(self, crash: CrashOnce | None = None) -> None:
        self.sim: SimCluster | None = None
        self.crash = crash
        # Phases the reconcile loops (run, steps) passed through: where a restart is checked.
        self.phases: list[Phase] = []
        # The logs of the clusters an earlier new/install replaced (a file may hold several stories).
        self.earlier: list[str] = []
        # spec.maintenanceWindows of every DESIRED from the ``windows`` command on.
        self.windows: tuple[str, ...] = ()

    def _wanted(self, args: list[str]) -> Desired:
        return replace(_desired(args), maintenance_windows=self.windows)

    def cluster(self) -> SimCluster:
        if self.sim is None:
            raise ValueError("the scenario must start with 'new' or 'install'")
        return self.sim

    def log(self) -> list[str]:
        """Everything every cluster of the scenario logged, in order."""
        return self.earlier + self.cluster().log

    def pod(self, name: str) -> int:
        for ordinal, pod in self.cluster().pods.items():
            if pod.name == name:
                return ordinal
        raise ValueError(f"no pod {name!r} in the simulated cluster")

    def execute(self, command: str) -> str:
        command, _, after = command.partition(" after=")
        word, *args = command.split()
        if word in ("new", "install") and self.sim is not None:
            self.earlier += self.sim.log
        if word == "new":
            self.sim = SimCluster()
            return ""
        if word == "install":
            want = self._wanted(args)
            self.sim = installed(want.version, want.batch, want.replicas)
            return ""
        sim = self.cluster()
        if word == "step":
            return _decision_line(sim.step(self._wanted(args)))
        if word == "run":
            return self._run(sim, self._wanted(args), dict(a.split("=", 1) for a in args if "=" in a), after)
        if word == "steps":
            return self._steps(sim, int(args[0]), self._wanted(args[1:]))
        if word == "judge":
            report = dict(a.split("=", 1) for a in args if "=" in a)["report"]
            return self._judge(sim, self._wanted(args), report)
        handled = self._world(sim, word, args, command)
        if handled is None:
            raise ValueError(f"unknown scenario command {word!r}")
        return handled

    def _world(self, sim: SimCluster, word: str, args: list[str], command: str) -> str | None:
        """Commands that change (or look at) the simulated world without a decision of the engine."""
        if word == "tick":
            sim.tick(int(args[0]) if args else 1)
        elif word == "windows":
            self.windows = tuple(w.strip() for w in command.partition(" ")[2].split(";") if w.strip())
        elif word == "now":
            return sim.now.strftime("%A %Y-%m-%d %H:%M:%S UTC")
        elif word in ("pin", "unpin"):
            sim.pods[self.pod(args[0])].pinned = word == "pin"
        elif word == "crash":
            sim.crash_pod(self.pod(args[0]))
        elif word in ("crashloop", "recover"):
            pod = sim.pods[self.pod(args[0])]
            pod.crashlooping = word == "crashloop"
            pod.ready = pod.ready and word == "recover"
        elif word == "set-batch":
            sim.pods[self.pod(args[0])].batch = ON if args[1] == "on" else OFF
        elif word in ("pause", "resume"):
            sim.paused = word == "pause"
        elif word in ("unreachable", "reachable"):
            sim.reachable = word == "reachable"
        elif word == "delete-statefulset":
            sim.delete_statefulset(orphan=args == ["orphan"])
        elif word == "verifier-seconds":
            sim.verifier_seconds = int(args[0])
        elif word == "verifier-vanishes":
            sim.verifier_running = False
        elif word == "verifier-fails":
            sim.verifier_running = False
            sim.verifier_failed_at, sim.verifier_failure = sim.now, command.partition(" ")[2]
        elif word == "report" and args == ["stale"]:
            sim.report = VerifierReport(T0, {}, True)
        elif word == "template":
            want = self._wanted(args)
            sim.template = Template(want.version, want.batch)
        elif word == "controller":
            try:
                sim._statefulset_controller(self._wanted(args))
            except InvariantViolation as violation:
                return f"violation: {violation}"
            return "ok"
        elif word == "invariant":
            try:
                sim.check_invariant()
            except InvariantViolation as violation:
                return f"violation: {violation}"
            return "ok"
        elif word == "pods":
            return "\n".join(
                f"{p.name} {p.version} {'on' if p.batch.enabled else 'off'} records={p.batch.max_records}"
                f" size={p.batch.max_size_bytes} delay={p.batch.max_delay_millis}"
                f" {'ready' if p.ready else 'unready'}"
                for p in sorted(sim.pods.values(), key=lambda p: p.ordinal)
            )
        elif word == "offload":
            pod = sim.pods[self.pod(args[0])]
            if format_level(pod.version) < 3:
                raise ValueError(f"{pod.name} runs {pod.version}: only 3.x pods offload")
            pod.tier_only = int(args[1])
        elif word == "offload-config":
            sim.offload_auto = args[0] == "on"
            if sim.offload_auto:
                for pod in sim.pods.values():
                    pod.automatic = format_level(pod.version) >= 3
        elif word == "markers":
            return ", ".join(sorted(sim.verifier_markers)) or "none"
        elif word == "persisted":
            return "none" if sim.persisted is None else ", ".join(sorted(sim.persisted))
        else:
            return None
        return ""

    def _run(self, sim: SimCluster, want: Desired, options: dict[str, str], after: str) -> str:
        seen, decided = len(sim.log), len(sim.decisions)
        unknown = sorted(set(options) - RUN_OPTIONS)
        if unknown:
            # A scenario does not restart the operator itself: the replay restarts it in every phase.
            raise ValueError(f"unknown run option(s) {unknown}; known: {sorted(RUN_OPTIONS)}")
        until = options.get("until")
        stop: Callable[[Decision], bool] | None = None
        if until:
            stop = lambda d: d.phase == Phase(until)  # noqa: E731
        elif after:
            stop = lambda d: sim.actions()[-1:] == [after]  # noqa: E731
        crash = self.crash
        mode = crash.mode if crash is not None else "before"
        last = sim.run(want, until=stop, crash_when=crash, crash_mode=mode)
        self._passed(sim, decided)
        return self._report(sim, seen, decided, last)

    def _steps(self, sim: SimCluster, count: int, want: Desired) -> str:
        decided = len(sim.decisions)
        lines: list[str] = []
        for _ in range(count):
            crash = None
            if self.crash is not None and self.crash(decide(want, sim.observe(), sim.progress(), CONFIG)):
                crash = self.crash.mode
            logged = len(sim.log)
            d = sim.step(want, crash=crash)
            lines += [line for line in sim.log[logged:] if not line.startswith(("crash", "operator"))]
            lines.append(_decision_line(d))
            sim.tick()
        self._passed(sim, decided)
        return "\n".join(
            line if n == 1 else f"{line} (x{n})"
            for line, n in ((k, len(list(g))) for k, g in itertools.groupby(lines))
        )

    def _passed(self, sim: SimCluster, decided: int) -> None:
        for d in sim.decisions[decided:]:
            if d.phase not in self.phases:
                self.phases.append(d.phase)

    @staticmethod
    def _judge(sim: SimCluster, want: Desired, kind: str) -> str:
        """Decide at the gate with a hand-made safe report of ``kind`` in place of the verifier's."""
        progress = sim.progress()
        gate = progress.downgrade
        if gate is None or gate.markers_complete_at is None:
            raise ValueError(
                "judge needs a downgrade whose markers are complete (run ... until=VerifyingDowngrade)"
            )
        markers, taken = gate.flat_markers(), gate.markers_complete_at
        made = sim.now + timedelta(seconds=1)
        reports = {
            "wrong-markers": VerifierReport(made, {s: ledger - 1 for s, ledger in markers.items()}, True),
            "other-round": VerifierReport(made, markers, True, (), taken - timedelta(seconds=30)),
            "no-taken-at": VerifierReport(made, markers, True),
            "superset": VerifierReport(made, {**markers, "gone/s9": 4}, True, (), taken),
            "matching": VerifierReport(made, markers, True, (), taken),
        }
        if kind not in reports:
            raise ValueError(f"unknown report kind {kind!r}; known: {sorted(reports)}")
        obs = sim.observe()
        obs = Observed(
            obs.template,
            obs.pods,
            sim.now + timedelta(seconds=2),
            replace(obs.verifier, report=reports[kind]),
        )
        d = decide(want, obs, progress, CONFIG)
        safe = d.condition("DowngradeSafe")
        return f"{_decision_line(d)}\nDowngradeSafe={safe.status} {safe.reason}"

    @staticmethod
    def _report(sim: SimCluster, seen: int, decided: int, last: Decision) -> str:
        lines = [line for line in sim.log[seen:] if not line.startswith(("crash", "operator"))]
        phases: list[str] = []
        for d in sim.decisions[decided:]:
            if str(d.phase) not in phases:
                phases.append(str(d.phase))
        lines.append("phases: " + ", ".join(phases))
        lines.append(f"phase {last.phase}")
        lines += [f"{c.type}={c.status} {c.reason}: {c.message}" for c in last.conditions]
        pods = sorted(sim.pods.values(), key=lambda p: p.ordinal)
        lines.append(
            "pods: "
            + ", ".join(
                f"{p.name} {p.version} {'on' if p.batch.enabled else 'off'}{'' if p.ready else ' unready'}"
                + (f" tier-only={p.tier_only}" if p.tier_only else "")
                for p in pods
            )
        )
        sim.check_invariant()
        return "\n".join(lines)


def _play(path: Path, crash: CrashOnce | None = None) -> tuple[_Runner, list[str]]:
    runner = _Runner(crash)
    blocks = _blocks(path.read_text())
    assert blocks, f"{path} holds no scenario"
    return runner, [runner.execute(command) for _, command, _ in blocks]


def _essential(log: list[str]) -> list[str]:
    kept = [a for a in log if a not in ("verify", "operator restart") and not a.startswith("crash")]
    return [a for a, _ in itertools.groupby(kept)]


def _ending(sim: SimCluster) -> list[tuple[str, str, bool, bool]]:
    # Not the batched ledgers: a restart costs a tick, in which the load may write another batched
    # entry; the invariant (checked too) is what must hold for them.
    pods = sorted(sim.pods.values(), key=lambda p: p.ordinal)
    return [(p.name, p.version, p.batch.enabled, p.ready) for p in pods]


PATHS = sorted(SCENARIOS.glob("*.txt"))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
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
def test_scenario_survives_an_operator_restart_in_every_phase(path: Path) -> None:
    baseline, _ = _play(path)
    sim = baseline.cluster()
    for phase, mode in itertools.product(baseline.phases, CRASH_MODES):
        crash = CrashOnce(phase, mode)
        restarted, _ = _play(path, crash)
        where = f"{path.name}: operator restart ({mode}) at the first {phase} decision"
        assert crash.fired, f"{where}: the scenario never reached {phase} again"
        again = restarted.cluster()
        assert restarted.log().count("operator restart") == 1, where
        assert _essential(restarted.log()) == _essential(baseline.log()), where
        assert _ending(again) == _ending(sim), where
        again.check_invariant()


class _LookAtFirst(CrashOnce):
    """A restart hook that never restarts: notes which pods hold tier-only ledgers at the first
    decision in ``phase``, i.e. what the replay's restart in that phase would interrupt."""

    def __init__(self, phase: Phase) -> None:
        super().__init__(phase, "before")
        self.runner: _Runner | None = None
        self.tier_only: list[str] | None = None

    def __call__(self, decision: Decision) -> bool:
        if self.tier_only is None and decision.phase == self.phase and self.runner is not None:
            pods = self.runner.cluster().pods.values()
            self.tier_only = sorted(p.name for p in pods if p.tier_only)
        return False


@pytest.mark.parametrize(
    ("name", "holding"),
    [
        ("offload_downgrade_restores_first", ["tc-0", "tc-2"]),
        ("offload_downgrade_clean_pods_still_offloading", ["tc-0"]),
    ],
)
def test_the_replay_restarts_the_operator_in_every_phase_of_the_restore_gate(
    name: str, holding: list[str]
) -> None:
    """The 3.x -> 2.x restore gate's restarts are the generic replay's: these files pass every phase
    of it (so each is interrupted in every mode), the first RestoringOffloaded decision meets the pods
    in ``holding`` with tier-only ledgers (several, or only one with the others clean but offloading),
    and every pod is asked to restore."""
    look = _LookAtFirst(Phase.RESTORING_OFFLOADED)
    runner = _Runner(look)
    look.runner = runner
    for _, command, _ in _blocks((SCENARIOS / f"{name}.txt").read_text()):
        runner.execute(command)
    gate = [Phase.RESTORING_OFFLOADED, Phase.WAITING_FOR_PODS, Phase.ROLLING_DOWNGRADE, Phase.READY]
    assert [p for p in runner.phases if p in gate] == gate
    assert look.tier_only == holding
    requested = {line.split()[1] for line in runner.log() if line.startswith("restore-request")}
    assert requested == {"tc-0", "tc-1", "tc-2"}
    assert "operator restart" not in runner.log()
