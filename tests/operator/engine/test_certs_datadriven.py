"""Certificate engine scenarios as data files (scenarios/certs/*.txt), in the style of
test_engine_datadriven: a command, ``----``, the exact output; TXNKEEPER_REWRITE_SCENARIOS=1 rewrites the
outputs from the engine's behaviour (review that diff). The simulated namespace (certsim.py) checks after
every write and every tick that every pod trusts every certificate it can be shown and none has expired.

Every scenario is also replayed with the operator dying once in the first pass that starts in each CA
rotation phase it passes (idle, trust-new, reissue, retire-old), after each number of that pass's
writes (0, 1, ...): the engine remembers nothing but the Secrets, so the namespace must end as the
uninterrupted run ends (the same certificates in the same roles, the same phase), with the invariant
holding throughout.

Commands (the clock starts Saturday 2026-01-03 22:00 UTC):
  resource NAME [pods=N]           a resource with N pods (default 2) that serve what NAME-tls holds
  spec KEY=DURATION ...            spec.tls from now on (renewBefore, certificateValidity, ca.validity,
                                   ca.renewBefore, ca.overlap)
  reconcile NAME                   one pass for NAME: its writes, then its status.tls
  run [rounds=N]                   a tick then a pass for every resource, until a round writes nothing
                                   (at most N rounds, default 20): the writes, then every status.tls
  advance DURATION                 the clock moves on (the operator not running), then a tick; from
                                   then on an expired certificate is no invariant violation
  live DURATION [step=DURATION]    the clock moves on in steps (default 1h) with the operator running
                                   (a ``run`` after each): the writes, each with its time, then every
                                   status.tls
  tick                             pods re-read their Secret (all but stuck ones)
  annotate KEY=VALUE [SECRET]      an annotation on SECRET (default txnkeeper-ca; kubectl annotate)
  stuck POD / unstick POD          POD never re-reads its files (a broken reload) / does again
  corrupt SECRET KEY               SECRET's KEY replaced by bytes that are not PEM
  swap-key SECRET                  SECRET's tls.key (or ca.key) replaced by another key
  delete SECRET                    kubectl delete secret
  foreign SECRET                   SECRET is not owned by its resource (someone else made it)
  leaf-as-ca                       txnkeeper-ca holds a certificate that is not a CA (with its key)
  pods                             what each pod serves and trusts
  secrets                          every Secret: its certificates and annotations
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pytest

from txnkeeper.contract import pki
from txnkeeper_operator.engine import certs

from .certsim import NAMESPACE, SimNamespace
from .test_engine_datadriven import _blocks

SCENARIOS = Path(__file__).parent / "scenarios" / "certs"
REWRITE = os.environ.get("TXNKEEPER_REWRITE_SCENARIOS") == "1"
PATHS = sorted(SCENARIOS.glob("*.txt"))
SPEC_KEYS = {
    "renewBefore": "renew_before",
    "certificateValidity": "validity",
    "ca.validity": "ca_validity",
    "ca.renewBefore": "ca_renew_before",
    "ca.overlap": "overlap",
}


@dataclass
class CrashOnce:
    """The operator dies after ``writes`` writes of the first pass that starts in ``phase`` and has
    more writes than that."""

    phase: str
    writes: int
    fired: bool = False


class _Runner:
    def __init__(self, crash: CrashOnce | None = None) -> None:
        self.sim = SimNamespace()
        self.crash = crash
        # For each phase a pass started in: the most writes one such pass made.
        self.passes: dict[str, int] = {}
        # Each resource's status.tls as its last pass computed it.
        self.views: dict[str, str] = {}
        self.restarted = False

    def _pass(self, name: str) -> list[str]:
        sim = self.sim
        phase = sim.phase()
        plan = sim.plan(name)
        self.passes[phase] = max(self.passes.get(phase, 0), len(plan.actions))
        actions = plan.actions
        crash = self.crash
        if crash is not None and not crash.fired and crash.phase == phase and len(actions) > crash.writes:
            crash.fired = True
            self.restarted = True  # the next round is the restarted operator's
            actions = actions[: crash.writes]
        lines = []
        for action in actions:
            sim.apply(action)
            event = f" [{action.event}]" if action.event else ""
            lines.append(f"{name}: {action.step} {action.secret}{event}: {sim.readable(action.message)}")
        # After the writes: the labels of what they brought are known.
        self.views[name] = f"{name}: {plan.view.phase}: {sim.readable(plan.view.message)}"
        return lines

    def execute(self, command: str) -> str:
        word, *args = command.split()
        sim = self.sim
        options = dict(a.split("=", 1) for a in args if "=" in a)
        if word == "resource":
            sim.add(args[0], int(options.get("pods", "2")))
        elif word == "spec":
            unknown = set(options) - set(SPEC_KEYS)
            if unknown:
                raise ValueError(f"unknown spec keys {sorted(unknown)}")
            sim.spec = replace(
                sim.spec,
                **{SPEC_KEYS[k]: certs.parse_duration(v, k) for k, v in options.items()},
            )
        elif word == "reconcile":
            lines = self._pass(args[0])
            return "\n".join([*lines, self.views[args[0]]])
        elif word == "run":
            return self._run(int(options.get("rounds", "20")))
        elif word == "advance":
            sim.now += certs.parse_duration(args[0], "advance")
            sim.check_expiry = False
            sim.tick()
        elif word == "live":
            return self._live(certs.parse_duration(args[0], "live"), options.get("step", "1h"))
        elif word == "tick":
            sim.tick()
        elif word == "annotate":
            key, _, value = args[0].partition("=")
            self._edit(args[1] if len(args) > 1 else certs.CA_SECRET, annotations={key: value})
        elif word in ("stuck", "unstick"):
            sim.pod(args[0]).stuck = word == "stuck"
        elif word == "corrupt":
            self._edit(args[0], data={args[1]: b"garbage, not PEM\n"})
        elif word == "swap-key":
            key = certs.CA_KEY if args[0] == certs.CA_SECRET else certs.TLS_KEY
            other = pki.new_ca("other", now=sim.now, validity=certs.TlsSpec().ca_validity)
            self._edit(args[0], data={key: other.key_pem})
        elif word == "leaf-as-ca":
            ca = pki.new_ca("other", now=sim.now, validity=certs.TlsSpec().ca_validity)
            leaf = pki.issue(ca, "x", hosts=["x"], now=sim.now, validity=certs.TlsSpec().validity)
            self._edit(certs.CA_SECRET, data={certs.CA_CERT: leaf.cert_pem, certs.CA_KEY: leaf.key_pem})
        elif word == "delete":
            del sim.secrets[args[0]]
        elif word == "foreign":
            sim.secrets[args[0]] = replace(sim.secrets[args[0]], owned=False)
        elif word == "pods":
            return self._pods()
        elif word == "secrets":
            return self._secrets()
        else:
            raise ValueError(f"unknown scenario command {word!r}")
        return ""

    def _edit(
        self, secret: str, *, data: dict[str, bytes] | None = None, annotations: dict[str, str] | None = None
    ) -> None:
        before = self.sim.secrets[secret]
        self.sim.secrets[secret] = replace(
            before,
            data={**before.data, **(data or {})},
            annotations={**before.annotations, **(annotations or {})},
        )

    def _run(self, rounds: int) -> str:
        lines: list[str] = []
        for _ in range(rounds):
            # Pods re-read their files first: a round that writes nothing then saw them as they are.
            self.sim.tick()
            wrote = False
            for name in sorted(self.sim.resources):
                got = self._pass(name)
                wrote = wrote or bool(got) or self.restarted
                self.restarted = False
                lines += got
            if not wrote:
                break
        else:
            lines.append(f"(still writing after {rounds} rounds)")
        lines.append(f"ca phase: {self.sim.phase()}")
        lines += [self.views[name] for name in sorted(self.sim.resources)]
        return "\n".join(lines)

    def _live(self, span: timedelta, step_text: str) -> str:
        sim = self.sim
        step = certs.parse_duration(step_text, "step")
        end = sim.now + span
        lines: list[str] = []
        while sim.now < end:
            sim.now = min(sim.now + step, end)
            sim.tick()
            stamp = sim.now.strftime("%Y-%m-%d %H:%M")
            lines += [f"{stamp} {line}" for line in self._run(20).splitlines()[: -1 - len(sim.resources)]]
        lines.append(f"ca phase: {sim.phase()}")
        lines += [self.views[name] for name in sorted(sim.resources)]
        return "\n".join(lines)

    def _pods(self) -> str:
        sim = self.sim
        out = []
        for res in sim.resources.values():
            for pod in res.pods:
                report = sim.report(pod)
                trusts = ",".join(sorted(sim.label(f) for f in report.trusted)) or "nothing"
                stuck = " (stuck)" if pod.stuck else ""
                out.append(
                    f"{pod.name}: serves {sim.label(report.fingerprint)} from {sim.label(report.issuer)},"
                    f" trusts {trusts}{stuck}"
                )
        return "\n".join(out)

    def _secrets(self) -> str:
        sim = self.sim
        out = []
        for name, secret in sorted(sim.secrets.items()):
            parts = []
            for key, value in sorted(secret.data.items()):
                if key == certs.CA_PREVIOUS_KEY:
                    parts.append(f"{key}=held")  # only through trust-new
                if key.endswith(".key"):
                    continue
                try:
                    labels = [sim.label(pki.fingerprint(c)) for c in pki.load_bundle(value, what=key)]
                except pki.PkiError:
                    labels = ["unreadable"]
                parts.append(f"{key}={'+'.join(labels)}")
            notes = [
                f"{k.removeprefix('txnkeeper.io/')}={sim.readable(v[:12]) if len(v) == 64 else v}"
                for k, v in sorted(secret.annotations.items())
            ]
            out.append(f"{name}: {' '.join(parts)}" + (f" ({', '.join(notes)})" if notes else ""))
        return "\n".join(out)

    def ending(self) -> str:
        """Where the namespace ended: leaves renamed in order of appearance here (which resource's was
        issued first may differ after a restart; which pods serve the same one may not)."""
        text = "\n".join([f"ca phase: {self.sim.phase()}", self._pods(), self._secrets()])
        order: dict[str, str] = {}
        return re.sub(r"\bcert\d+\b", lambda m: order.setdefault(m.group(0), f"leaf{len(order) + 1}"), text)


def _play(path: Path, crash: CrashOnce | None = None) -> tuple[_Runner, list[str]]:
    runner = _Runner(crash)
    blocks = _blocks(path.read_text())
    assert blocks, f"{path} holds no scenario"
    return runner, [runner.execute(command) for _, command, _ in blocks]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_cert_scenario(path: Path) -> None:
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
def test_cert_scenario_survives_an_operator_restart_in_every_phase(path: Path) -> None:
    baseline, _ = _play(path)
    for phase, writes in sorted(baseline.passes.items()):
        for cut in range(writes):
            crash = CrashOnce(phase, cut)
            restarted, _ = _play(path, crash)
            where = f"{path.name}: the operator died after {cut} writes of the first {phase or 'idle'} pass"
            assert crash.fired, f"{where}: never reached"
            assert restarted.ending() == baseline.ending(), where


def test_scenarios_cover_every_rotation_phase() -> None:
    seen: set[str] = set()
    for path in PATHS:
        runner, _ = _play(path)
        seen |= set(runner.passes)
    assert seen >= {"idle", "trust-new", "reissue", "retire-old"}, seen


def test_hosts_are_the_services_names_and_the_loopback() -> None:
    assert certs.resource_hosts("txn", NAMESPACE) == (
        "*.txn.ns.svc", "*.txn.ns.svc.cluster.local", "txn.ns.svc", "txn.ns.svc.cluster.local", "txn.ns",
        "txn", "localhost", "127.0.0.1",
    )  # fmt: skip
