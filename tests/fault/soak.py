"""Crash-and-mutate soak of the stores, with a JSON verdict (issue 11's acceptance suite).

Why it exists: the crash tests each guard one layer; this drives a workload touching every file kind a
pod writes (tests/fault/workload.py) and judges, after each SIGKILL and after each mutation of one file
(a bit flip, a truncation at a random offset or on a ledger record boundary), whether reopening either
refuses naming the file or serves exactly what was acknowledged. The verdict uses only what the child
reported before its kill: the pipe is drained to EOF after the kill.

  python -m tests.fault.soak --kills 1000 --json          # prints one JSON object
  python -m tests.fault.soak --trial-seed S --json        # replays one trial (printed with a failure)

Categories: ``silent_loss`` (an acknowledged, undeleted record, route, subscription or cursor position
is gone), ``wrong_data`` (something served differs from what was written, was never written, or was
deleted and came back), ``refusals`` (open failed; fine after a mutation if the error names the file),
``refusals_after_plain_kill`` and ``refusals_without_file_name`` (failures), ``unexpected_errors``
(the harness could not judge: the child died by itself, or an open hung).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.coordinator.recovery import highest_sequence
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.ledger import ManagedLedgerFactory, Position
from txnkeeper.ledger.entry_format import FILE_HEADER, RECORD_HEADER
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.txnlog import TransactionLogStore, TxnID

from . import workload as w

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_SECONDS = 120.0  # a child or an open that makes no progress this long is reported, not judged
EXAMPLES = 3  # examples kept per failure category and mutation kind
MODES = ("on", "off", "mixed")
FILE_KINDS = frozenset(("ledger-data", "meta", "cursor", "sequence", "routes", "subscriptions", "side-file"))
KINDS_HELP = ", ".join(sorted(FILE_KINDS))
FAILURES = (
    "silent_loss",
    "wrong_data",
    "refusals_after_plain_kill",
    "refusals_without_file_name",
    "unexpected_errors",
)


@dataclass
class Observed:
    """Everything the children of one trial reported before their kills."""

    sequences: set[int] = field(default_factory=set)
    txn_records: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # seq -> k -> pos
    acks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    entries: dict[int, Position] = field(default_factory=dict)
    deleting: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    mark_intents: list[Position] = field(default_factory=list)
    mark_done: list[Position] = field(default_factory=list)
    route_intents: dict[str, list[str]] = field(default_factory=dict)
    route_done: dict[str, str] = field(default_factory=dict)  # the latest durable address per topic
    subscription_intents: set[tuple[str, str]] = field(default_factory=set)
    subscriptions_done: set[tuple[str, str]] = field(default_factory=set)

    def take(self, line: str) -> None:
        kind, *f = line.split()
        if kind == "Q":
            self.sequences.add(int(f[0]))
        elif kind == "A":
            self.txn_records.setdefault(int(f[0]), {})[int(f[1])] = tuple(map(int, f[2:]))
        elif kind == "P":
            self.acks[int(f[0])] = tuple(map(int, f[1:]))
        elif kind == "E":
            self.entries[int(f[0])] = Position(int(f[1]), int(f[2]))
        elif kind == "X":
            self.deleting.add(int(f[0]))
        elif kind == "XD":
            self.deleted.add(int(f[0]))
        elif kind == "MI":
            self.mark_intents.append(Position(int(f[0]), int(f[1])))
        elif kind == "MD":
            self.mark_done.append(Position(int(f[0]), int(f[1])))
        elif kind == "RI":
            self.route_intents.setdefault(f[0], []).append(f[1])
        elif kind == "RD":
            self.route_done[f[0]] = f[1]
            # an older intent can no longer win: the table is rewritten whole, in order
            self.route_intents[f[0]] = self.route_intents[f[0]][self.route_intents[f[0]].index(f[1]) :]
        elif kind == "SI":
            self.subscription_intents.add((f[0], f[1]))
        elif kind == "SD":
            self.subscriptions_done.add((f[0], f[1]))
        elif kind not in ("R", "C"):
            raise ValueError(f"unknown line from the workload: {line!r}")


class Verdict:
    """Findings of one verification: each a (category, message)."""

    def __init__(self) -> None:
        self.findings: list[tuple[str, str]] = []

    def loss(self, message: str) -> None:
        self.findings.append(("silent_loss", message))

    def wrong(self, message: str) -> None:
        self.findings.append(("wrong_data", message))


async def verify(root: Path, seen: Observed) -> Verdict:
    """Reopen everything as a pod would and check it against what was observed (raises on refusal)."""
    v = Verdict()
    factory = ManagedLedgerFactory(w.ledgers_dir(root), io_threads=1)
    opened: list[Any] = []
    try:
        txnlog = await TransactionLogStore.open(factory, w.COORDINATOR, ledger_config=w.LEDGER_CONFIG)
        opened.append(txnlog)
        pending = await PendingAckStore.open(
            factory, w.ACK_TOPIC, w.ACK_SUBSCRIPTION, ledger_config=w.LEDGER_CONFIG
        )
        opened.append(pending)
        txns = await txnlog.replay()
        acks = await pending.replay()
        check_txn_log(v, seen, txns)
        check_pending_acks(v, seen, acks)
        sequence = SequenceAllocator(w.sequence_path(root))
        sequence.load(highest_sequence(txns, w.COORDINATOR))
        if seen.sequences and sequence.last < max(seen.sequences):
            v.wrong(f"the sequence reopened at {sequence.last} below handed-out id {max(seen.sequences)}")
        routes = RouteTable(w.routes_path(root))
        routes.load()
        check_routes(v, seen, routes)
        await check_data_topic(v, seen, factory)
        topics = w.topic_service(root, factory, BatchedWriteConfig())
        opened.append(topics)
        await topics.recover()
        registered = set(topics.pending_ack_handles())
        for key in sorted(seen.subscriptions_done - registered):
            v.loss(f"registered subscription {key} is missing")
        for key in sorted(registered - seen.subscription_intents):
            v.wrong(f"subscription {key} was never registered")
    finally:
        # a close failing after a refusal must not replace the refusal's message
        for closable in [*reversed(opened), factory]:
            with contextlib.suppress(Exception):
                await closable.close()
    return v


def check_txn_log(v: Verdict, seen: Observed, txns: dict[TxnID, Any]) -> None:
    for txn_id, state in txns.items():
        seq = txn_id.least
        if txn_id.most != w.COORDINATOR or seq not in seen.sequences:
            v.wrong(f"txn log serves {txn_id}, never written")
            continue
        if seq in seen.deleted:
            v.wrong(f"txn log serves {txn_id}, whose delete completed")
        want = w.expected_new(seq)
        if state.complete and (state.timeout_ms, state.owner, state.start_time) != (
            want.timeout_ms,
            want.owner,
            want.start_time,
        ):
            v.wrong(f"txn {seq}: NEW record differs: {state.timeout_ms} {state.owner!r} {state.start_time}")
        if any(p != w.expected_partition(seq) for p in state.partitions):
            v.wrong(f"txn {seq}: partitions {state.partitions} differ from what was written")
    for seq, records in seen.txn_records.items():
        if seq in seen.deleting:
            continue
        state = txns.get(TxnID(w.COORDINATOR, seq))
        if state is None:
            v.loss(f"acknowledged txn {seq} is missing from the txn log")
            continue
        have = {tuple(p) for p in state.positions}
        for k, position in records.items():
            if position not in have:
                v.loss(f"txn {seq}: acknowledged record {k} at {position} is missing (have {sorted(have)})")
        if 0 in records and not state.complete:
            v.loss(f"txn {seq}: acknowledged NEW record is missing")
        if 1 in records and state.partitions != [w.expected_partition(seq)]:
            v.loss(f"txn {seq}: acknowledged partition missing: {state.partitions}")


def check_pending_acks(v: Verdict, seen: Observed, acks: dict[TxnID, Any]) -> None:
    for txn_id, state in acks.items():
        seq = txn_id.least
        if txn_id.most != w.COORDINATOR or seq not in seen.sequences:
            v.wrong(f"pending-ack store serves {txn_id}, never written")
            continue
        if seq in seen.deleted:
            v.wrong(f"pending-ack store serves {txn_id}, whose delete completed")
        if any(a != w.expected_ack(seq) for a in state.acks) or state.outcome is not None:
            v.wrong(f"pending-ack of {seq} differs from what was written: {state.acks} {state.outcome}")
    for seq, position in seen.acks.items():
        if seq in seen.deleting:
            continue
        state = acks.get(TxnID(w.COORDINATOR, seq))
        if state is None or position not in {tuple(p) for p in state.positions}:
            v.loss(f"acknowledged pending-ack record of {seq} at {position} is missing")


def check_routes(v: Verdict, seen: Observed, routes: RouteTable) -> None:
    for k in range(w.ROUTE_TOPICS):
        topic = w.route_topic(k)
        got = routes.get(topic)
        allowed = seen.route_intents.get(topic, [])
        if got is not None and got not in allowed:
            if topic in seen.route_done and got in [w.route_address(s) for s in seen.sequences]:
                v.loss(f"route of {topic} went back to {got} (durable: {seen.route_done[topic]})")
            else:
                v.wrong(f"route of {topic} is {got}, never learned")
        elif got is None and topic in seen.route_done:
            v.loss(f"learned route of {topic} ({seen.route_done[topic]}) is missing")


async def check_data_topic(v: Verdict, seen: Observed, factory: ManagedLedgerFactory) -> None:
    ml = await factory.open(w.DATA_TOPIC, w.LEDGER_CONFIG)
    cursor = await ml.open_cursor(w.CURSOR)
    md = cursor.mark_delete_position()
    assert md is not None
    if seen.mark_done and md < max(seen.mark_done):
        v.loss(f"the cursor went back to {md} from durable mark-delete {max(seen.mark_done)}")
    may_be_gone = max(seen.mark_intents) if seen.mark_intents else None
    entries = await ml.read_entries(Position(0, 0), 10_000_000)
    present = {e.position: e.data for e in entries}
    for entry in entries:
        head = entry.data.split(b":", 1)[0]
        seq = int(head) if head.isdigit() else -1
        if seq not in seen.sequences or entry.data != w.payload(seq):
            v.wrong(f"topic entry {entry.position} holds data nobody wrote: {entry.data[:40]!r}")
        elif seq in seen.entries and seen.entries[seq] != entry.position:
            v.wrong(f"topic entry of {seq} moved from {seen.entries[seq]} to {entry.position}")
    for seq, position in seen.entries.items():
        if may_be_gone is not None and position <= may_be_gone:
            continue
        if md >= position:
            v.loss(f"the cursor skipped unconsumed entry {position} (seq {seq}): mark-delete {md}")
        if position not in present:
            v.loss(f"acknowledged topic entry {position} (seq {seq}) is missing")


# --- one trial: kills, then mutations of copies -----------------------------------------------------


@dataclass
class Stats:
    kills: int = 0
    trials: int = 0
    verifications: int = 0
    refusals: int = 0
    mutations: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)  # "<kind>/<op>: refused|opened-ok|failed"
    failures: Counter[str] = field(default_factory=Counter)  # verifications with such a finding
    findings: Counter[str] = field(default_factory=Counter)  # every finding
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failed_trials: list[int] = field(default_factory=list)

    def fail(self, category: str, trial_seed: int, message: str, **extra: Any) -> None:
        self.failures[category] += 1
        if trial_seed not in self.failed_trials:
            self.failed_trials.append(trial_seed)
        # examples per category and mutation kind, so a rare kind is not hidden behind a common one
        key = f"{category} after {extra.get('kind', 'a plain kill')}"
        examples = self.examples.setdefault(key, [])
        if len(examples) < EXAMPLES:
            examples.append({"trial_seed": trial_seed, "message": message[:500], **extra})


def run_child(
    root: Path, seed: int, mode: str, rng: random.Random, seen: Observed, *, target: int | None = None
) -> str | None:
    """Run one workload child to a kill point ``rng`` chooses (or after ``target`` reported events);
    returns an error if it died by itself."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.workload", str(root), str(seed), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert child.stdout is not None and child.stderr is not None
    lines: list[bytes] = []
    error = None
    roll = rng.random()
    # kill at start-up/recovery, right after recovery, or after a random number of reported events
    if target is None:
        target = -1 if roll < 0.05 else 0 if roll < 0.15 else rng.randint(1, 400)
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        events = 0
        while target >= 0:
            line = child.stdout.readline()
            if not line:
                error = f"the workload exited by itself ({child.wait()}): {child.stderr.read()[-800:]!r}"
                break
            lines.append(line)
            if line == b"R\n" and target == 0:
                break
            events += line != b"R\n"
            if target and events >= target:
                break
            if time.monotonic() > deadline:
                error = f"the workload made no progress in {HANG_GUARD_SECONDS}s"
                break
    finally:
        child.kill()
        rest = child.stdout.read()  # written before the kill: observed
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    lines += rest.splitlines(keepends=True)
    for raw in lines:
        if raw.endswith(b"\n"):  # a line is one atomic write; still, never judge a partial one
            seen.take(raw.decode())
    return error


def ledger_record_boundaries(data: bytes) -> list[int]:
    """Offsets where a record of a ledger file starts (and its end), walking the length fields."""
    offsets = [FILE_HEADER.size]
    while offsets[-1] + RECORD_HEADER.size <= len(data):
        (length,) = struct.unpack_from("<I", data, offsets[-1])
        nxt = offsets[-1] + RECORD_HEADER.size + length
        if nxt > len(data):
            break
        offsets.append(nxt)
    return offsets


def file_kind(path: Path) -> str | None:
    name = path.name
    if name == "LOCK" or name.endswith(".tmp"):
        return None
    if name.endswith(".ledger"):
        return "ledger-data"
    if name == "meta.json":
        return "meta"
    if path.parent.name == "cursors":
        return "cursor"
    if name.endswith(".sequence"):
        return "sequence"
    if name in ("routes.json", "subscriptions.json"):
        return name.removesuffix(".json")
    return "side-file"  # any other file a ledger keeps (e.g. a watermark)


def mutate(
    root: Path, rng: random.Random, kinds: frozenset[str] | None = None
) -> tuple[str, str, Path, str] | None:
    """Damage one file of a random kind (of ``kinds``, if given): returns (kind, op, path, description)."""
    by_kind: dict[str, list[Path]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        kind = file_kind(path)
        if kind is not None and (kinds is None or kind in kinds) and path.stat().st_size > 0:
            by_kind.setdefault(kind, []).append(path)
    if not by_kind:
        return None
    kind = rng.choice(sorted(by_kind))
    path = rng.choice(by_kind[kind])
    data = bytearray(path.read_bytes())
    ops = ["flip", "truncate"] + (["truncate-boundary"] if kind == "ledger-data" else [])
    op = rng.choice(ops)
    if op == "flip":
        offset, bit = rng.randrange(len(data)), rng.randrange(8)
        data[offset] ^= 1 << bit
        what = f"flipped bit {bit} of byte {offset}"
    else:
        if op == "truncate-boundary":
            boundaries = [b for b in ledger_record_boundaries(bytes(data)) if b < len(data)]
            offset = rng.choice(boundaries) if boundaries else rng.randrange(len(data))
        else:
            offset = rng.randrange(len(data))
        what = f"truncated from {len(data)} to {offset} bytes"
        del data[offset:]
    with open(path, "r+b") as handle:  # in place, like a damaged disk (no rename)
        handle.truncate(len(data))
        handle.seek(0)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return kind, op, path, what


def open_and_judge(
    root: Path, seen: Observed, stats: Stats, trial_seed: int, mutated: tuple[str, str, Path, str] | None
) -> str:
    """Verify ``root``; returns "opened-ok", "refused" or "failed" and books the findings."""
    stats.verifications += 1
    where = (
        {}
        if mutated is None
        else {
            "kind": f"{mutated[0]}/{mutated[1]}",
            "file": str(mutated[2].relative_to(root)),
            "mutation": mutated[3],
        }
    )
    try:
        verdict = asyncio.run(asyncio.wait_for(verify(root, seen), HANG_GUARD_SECONDS))
    except TimeoutError:
        stats.fail("unexpected_errors", trial_seed, "reopening hung", **where)
        return "failed"
    except Exception as exc:
        stats.refusals += 1
        message = f"{type(exc).__name__}: {exc}"
        if mutated is None:
            stats.fail("refusals_after_plain_kill", trial_seed, message)
            return "failed"
        if mutated[2].name not in message:
            stats.fail("refusals_without_file_name", trial_seed, message, **where)
            return "failed"
        return "refused"
    # a category counts once per verification (one damaged file can lose many records); every
    # finding is still counted in findings_by_category
    for category in sorted({category for category, _ in verdict.findings}):
        messages = [m for c, m in verdict.findings if c == category]
        stats.findings[category] += len(messages)
        stats.fail(category, trial_seed, f"{messages[0]} (+{len(messages) - 1} more)", **where)
    return "failed" if verdict.findings else "opened-ok"


def run_trial(
    trial_seed: int,
    workdir: Path,
    stats: Stats,
    mutations_per_kill: float,
    kinds: frozenset[str] | None = None,
) -> None:
    """One trial: 1-3 killed runs on a fresh directory, each judged; then mutations of copies."""
    rng = random.Random(trial_seed)
    stats.trials += 1
    mode = rng.choice(MODES)
    runs = rng.randint(1, 3)
    root = workdir / f"trial-{trial_seed}"
    seen = Observed()
    root.mkdir(parents=True)
    try:
        for _ in range(runs):
            error = run_child(root, rng.randrange(1 << 30), mode, rng, seen)
            stats.kills += 1
            if error is not None:
                stats.fail("unexpected_errors", trial_seed, error)
                return
            snapshot = workdir / "snapshot"
            shutil.rmtree(snapshot, ignore_errors=True)
            shutil.copytree(root, snapshot)  # the raw crash state, before a reopen repairs it
            if open_and_judge(root, seen, stats, trial_seed, None) == "failed":
                return
        wanted = int(runs * mutations_per_kill + rng.random())
        for _ in range(wanted):
            copy = workdir / "mutated"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(snapshot, copy)
            mutated = mutate(copy, rng, kinds)
            if mutated is None:
                continue
            kind, op, _, _ = mutated
            stats.mutations[kind] += 1
            outcome = open_and_judge(copy, seen, stats, trial_seed, mutated)
            stats.outcomes[f"{kind}/{op}: {outcome}"] += 1
    finally:
        for path in (root, workdir / "snapshot", workdir / "mutated"):
            shutil.rmtree(path, ignore_errors=True)


def soak(
    kills: int,
    mutations_per_kill: float,
    seed: int,
    workdir: Path,
    kinds: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Run trials until ``kills`` SIGKILLs happened; returns the JSON verdict (see the module doc)."""
    stats = Stats()
    master = random.Random(seed)
    started = time.monotonic()
    while stats.kills < kills:
        run_trial(master.randrange(1 << 32), workdir, stats, mutations_per_kill, kinds)
    report: dict[str, Any] = {
        "seed": seed,
        "kills": stats.kills,
        "trials": stats.trials,
        "verifications": stats.verifications,
        "mutations": sum(stats.mutations.values()),
        "mutations_by_kind": dict(sorted(stats.mutations.items())),
        "refusals": stats.refusals,
        **{category: stats.failures[category] for category in FAILURES},
        "findings_by_category": dict(sorted(stats.findings.items())),
        "outcomes_by_mutation": dict(sorted(stats.outcomes.items())),
        "examples": stats.examples,
        "failed_trial_seeds": stats.failed_trials,
        "replay": "python -m tests.fault.soak --trial-seed SEED --json",
        "seconds": round(time.monotonic() - started, 1),
    }
    return report


def replay(
    trial_seed: int, mutations_per_kill: float, workdir: Path, kinds: frozenset[str] | None = None
) -> dict[str, Any]:
    stats = Stats()
    run_trial(trial_seed, workdir, stats, mutations_per_kill, kinds)
    return {
        "trial_seed": trial_seed,
        "kills": stats.kills,
        "refusals": stats.refusals,
        **{category: stats.failures[category] for category in FAILURES},
        "outcomes_by_mutation": dict(stats.outcomes),
        "examples": stats.examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fault.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs to run (default 1000)")
    parser.add_argument("--mutations-per-kill", type=float, default=1.5, help="mutated copies per kill")
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random, printed)")
    parser.add_argument("--trial-seed", type=int, default=None, help="replay one trial")
    parser.add_argument("--kinds", default=None, help=f"comma-separated file kinds to mutate ({KINDS_HELP})")
    parser.add_argument("--json", action="store_true", help="print only the JSON verdict")
    parser.add_argument("--workdir", type=Path, default=None, help="where trials run (default: a temp dir)")
    args = parser.parse_args(argv)
    # a cut torn tail after a kill is expected here, thousands of times: keep the output to the verdict
    logging.getLogger("txnkeeper").setLevel(logging.ERROR)
    if args.kills <= 0 or args.mutations_per_kill < 0:
        parser.error("--kills must be positive and --mutations-per-kill not negative")
    kinds = frozenset(args.kinds.split(",")) if args.kinds else None
    if kinds is not None and not kinds <= FILE_KINDS:
        parser.error(f"--kinds: unknown kind(s) {sorted(kinds - FILE_KINDS)}; known: {KINDS_HELP}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    with tempfile.TemporaryDirectory(prefix="txnkeeper-soak-", dir=args.workdir) as tmp:
        if args.trial_seed is not None:
            report = replay(args.trial_seed, args.mutations_per_kill, Path(tmp), kinds)
        else:
            report = soak(args.kills, args.mutations_per_kill, seed, Path(tmp), kinds)
    if not args.json:
        print(f"soak: {report['kills']} kills; failures are listed with their trial seed", file=sys.stderr)
    print(json.dumps(report, indent=1, sort_keys=True))
    failed = any(report[category] for category in FAILURES)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
