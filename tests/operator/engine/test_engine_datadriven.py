"""Engine scenarios written as data files (etcd raft's datadriven style), all read by this one test.

Each file in scenarios/ is a sequence of blocks: a command line, ``----``, and the exact output the
command must produce. The simulated cluster (opsim.py) raises InvariantViolation the moment any pod
runs, or could be recreated, at a format level below what its live data needs, so every step of every
scenario is also checked for safety. Set TXNKEEPER_REWRITE_SCENARIOS=1 to rewrite the expected outputs
from the engine's current behaviour (then review the diff: that diff is the behaviour change).

Commands:
  new                              an empty cluster (no StatefulSet yet)
  install VERSION [on]             a cluster already reconciled to VERSION (batch log on with ``on``)
  run VERSION [on] [until=PHASE] [after=ACTION]
                                   reconcile until Ready with nothing to do (or until PHASE, or until
                                   ACTION, which may hold spaces, was the last action taken); prints
                                   the actions taken, the phases passed, the last decision's phase and
                                   conditions, and every pod
  step VERSION [on]                one decision; prints its phase, action and reason
  tick [SECONDS]                   the world moves on (load writes, trims, the verifier finishes)
  pin POD / unpin POD              a never-ending transaction pins (or stops pinning) POD's ledgers
  offload POD N                    POD's volume now holds N tier-only ledgers (PIP-76, needs 3.x)
  offload-config on|off            the template's config offloads automatically (on: running 3.x
                                   pods too, as if started with it; off: running pods keep theirs)
  run ... restart-in=PHASE [restart-mode=before|between|after]
                                   the operator restarts once, at the first decision in PHASE
  persisted                        which keys the persisted status.downgrade holds (or "none")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper_operator.engine import Decision, Phase, format_level

from .opsim import OFF, ON, SimCluster, desired, installed

SCENARIOS = Path(__file__).parent / "scenarios"
REWRITE = os.environ.get("TXNKEEPER_REWRITE_SCENARIOS") == "1"


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


class _Runner:
    def __init__(self) -> None:
        self.sim: SimCluster | None = None

    def cluster(self) -> SimCluster:
        if self.sim is None:
            raise ValueError("the scenario must start with 'new' or 'install'")
        return self.sim

    def execute(self, command: str) -> str:
        command, _, after = command.partition(" after=")
        word, *args = command.split()
        flags = [a for a in args[1:] if "=" not in a]
        options = dict(a.split("=", 1) for a in args[1:] if "=" in a)
        if word == "new":
            self.sim = SimCluster()
            return ""
        if word == "install":
            self.sim = installed(args[0], ON if "on" in flags else OFF)
            return ""
        sim = self.cluster()
        if word in ("run", "step"):
            want = desired(args[0], ON if "on" in flags else OFF)
            seen, decided = len(sim.log), len(sim.decisions)
            if word == "step":
                d = sim.step(want)
                return f"phase {d.phase}; action {_describe(d)}; reason {d.reason}"
            until = options.get("until")
            stop: Callable[[Decision], bool] | None = None
            if until:
                stop = lambda d: d.phase == Phase(until)  # noqa: E731
            elif after:
                stop = lambda d: sim.actions()[-1:] == [after]  # noqa: E731
            crash: Callable[[Decision], bool] | None = None
            if "restart-in" in options:
                crash = lambda d: d.phase == Phase(options["restart-in"])  # noqa: E731
            mode = options.get("restart-mode", "between")
            last = sim.run(want, until=stop, crash_when=crash, crash_mode=mode)
            return self._report(sim, seen, decided, last)
        if word == "tick":
            sim.tick(int(args[0]) if args else 1)
            return ""
        if word == "offload":
            pod = next(p for p in sim.pods.values() if p.name == args[0])
            if format_level(pod.version) < 3:
                raise ValueError(f"{pod.name} runs {pod.version}: only 3.x pods offload")
            pod.tier_only = int(args[1])
            return ""
        if word == "offload-config":
            sim.offload_auto = args[0] == "on"
            if sim.offload_auto:
                for pod in sim.pods.values():
                    pod.automatic = format_level(pod.version) >= 3
            return ""
        if word in ("pin", "unpin"):
            pod = next(p for p in sim.pods.values() if p.name == args[0])
            pod.pinned = word == "pin"
            return ""
        if word == "persisted":
            return "none" if sim.persisted is None else ", ".join(sorted(sim.persisted))
        raise ValueError(f"unknown scenario command {word!r}")

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


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.txt")), ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
    runner = _Runner()
    blocks = _blocks(path.read_text())
    assert blocks, f"{path} holds no scenario"
    actual = [runner.execute(command) for _, command, _ in blocks]
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
