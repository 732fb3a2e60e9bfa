"""Crash test: SIGKILL a writing child at random moments, reopen, and check the durability promises.

Every acknowledged entry is present and intact (unless a durable mark-delete let it be trimmed), no
entry appears that the child never appended, positions and ledger ids keep increasing across restarts,
and the cursor never goes back. Bounded for CI (50 kills); SOAK_SCALE=N multiplies the kills.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerFactory, Position

from .crash_child import NAME, payload

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = 50 * int(os.environ.get("SOAK_SCALE", "1"))
SEQ_STRIDE = 10_000_000
HANG_GUARD_SECONDS = 120.0  # catches a stuck child only; never judges speed


@dataclass
class History:
    acked: dict[int, Position] = field(default_factory=dict)  # seq -> position, over every run
    mark_delete: Position | None = None  # the newest mark-delete the child reported durable
    deleted: set[Position] = field(default_factory=set)  # individual deletes reported durable
    batch_deleted: dict[Position, set[int]] = field(default_factory=dict)  # batch indexes reported durable
    highest_seen: Position | None = None  # the newest entry present at the last verification
    run_positions: list[Position] = field(default_factory=list)  # acknowledged in the current run
    ledgers: set[int] = field(default_factory=set)
    trims: int = 0
    batch_checks: int = 0
    torn_tails: int = 0


def run_child(root: Path, run: int, rng: random.Random) -> list[bytes]:
    """Start a child, SIGKILL it at a random moment, return every line it reported."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(run * SEQ_STRIDE), str(rng.randrange(1 << 30))],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    lines: list[bytes] = []
    mode = rng.random()
    try:
        if mode < 0.1:
            time.sleep(rng.uniform(0.0, 0.3))  # a random kill moment in start-up or recovery
        else:
            # A fifth of the runs are killed right after a trim that deleted a ledger, so the trims
            # and batch-index deletes the test counts happened by choice, not by the machine's speed.
            after_trim = 0.3 <= mode < 0.5
            target = 0 if mode < 0.5 else rng.randint(1, 200)
            acks = 0
            deadline = time.monotonic() + HANG_GUARD_SECONDS
            while True:
                assert time.monotonic() < deadline, f"child {run} made no progress in {HANG_GUARD_SECONDS}s"
                line = child.stdout.readline()
                assert line, f"child {run} exited early with status {child.poll()}"
                lines.append(line)
                acks += line.startswith(b"A ")
                if after_trim:
                    if line.startswith(b"T ") and line.strip() != b"T":
                        break
                elif (target == 0 and line == b"R\n") or (target and acks >= target):
                    break
    finally:
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()  # written before the kill: to EOF, every line was promised
        child.stdout.close()
        child.wait(timeout=30)
    # each line is one os.write (whole or absent), but never judge a line without its end
    return lines + [line for line in rest.splitlines(keepends=True) if line.endswith(b"\n")]


def record(lines: list[bytes], history: History) -> None:
    history.run_positions = []
    for line in lines:
        kind, *fields = line.decode().split()
        if kind == "A":
            seq, ledger, entry = map(int, fields)
            history.acked[seq] = Position(ledger, entry)
            history.run_positions.append(Position(ledger, entry))
            history.ledgers.add(ledger)
        elif kind == "M":
            history.mark_delete = Position(int(fields[0]), int(fields[1]))
        elif kind == "D":
            history.deleted.add(Position(int(fields[0]), int(fields[1])))
        elif kind == "B":
            position = Position(int(fields[0]), int(fields[1]))
            history.batch_deleted.setdefault(position, set()).add(int(fields[2]))
        elif kind == "T" and fields:
            history.trims += 1


async def verify(root: Path, history: History, run: int) -> None:
    # ids continue: everything acknowledged in this run is newer than all that existed before it
    if history.run_positions and history.highest_seen is not None:
        assert min(history.run_positions) > history.highest_seen, f"run {run} reused a position"
    factory = ManagedLedgerFactory(root)
    try:
        ml = await factory.open(NAME)
        history.torn_tails += len(ml.torn_tails_cut)
        cursor = await ml.open_cursor("crash-cursor")
        md = cursor.mark_delete_position()
        assert md is not None
        if history.mark_delete is not None:
            assert md >= history.mark_delete, f"cursor went back from {history.mark_delete} to {md}"
        assert all(cursor.is_deleted(p) for p in history.deleted), "a durable delete was lost"
        for position, indexes in history.batch_deleted.items():
            history.batch_checks += 1
            assert all(cursor.is_batch_index_deleted(position, i) for i in indexes), f"{position} lost acks"
        entries = await ml.read_entries(Position(0, 0), 1_000_000)
        present: dict[Position, bytes] = {e.position: e.data for e in entries}
        seen_seqs: set[int] = set()
        for entry in entries:
            seq = int(entry.data.split(b":", 1)[0])
            assert entry.data == payload(seq), f"entry {entry.position} holds data nobody appended"
            assert seq not in seen_seqs, f"seq {seq} appears twice"
            assert seq // SEQ_STRIDE <= run, f"entry {entry.position} from a run that never happened"
            seen_seqs.add(seq)
            acked_at = history.acked.get(seq)
            assert acked_at is None or acked_at == entry.position, f"seq {seq} moved"
        for seq, position in history.acked.items():
            if position in present:
                assert present[position] == payload(seq)
            else:
                assert position <= md, f"acknowledged entry {position} (seq {seq}) is missing"
                assert position.ledger_id not in ml.ledger_ids(), f"{position} missing from a live ledger"
        if entries:
            newest = entries[-1].position
            assert history.highest_seen is None or newest >= history.highest_seen
            history.highest_seen = newest
        # forget what was trimmed: it can never come back and the check stays cheap
        live = set(ml.ledger_ids())
        history.acked = {s: p for s, p in history.acked.items() if p.ledger_id in live}
        history.deleted = {p for p in history.deleted if p.ledger_id in live}
        history.batch_deleted = {p: i for p, i in history.batch_deleted.items() if p.ledger_id in live}
        assert ml.ledger_ids() == sorted(ml.ledger_ids())
    finally:
        await factory.close()


@pytest.mark.soak
@pytest.mark.timeout(600)
async def test_sigkill_never_loses_an_acknowledged_entry(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "20260521")))
    history = History()
    total_acked = 0
    for run in range(1, KILLS + 1):
        lines = run_child(tmp_path, run, rng)
        record(lines, history)
        total_acked += len(history.run_positions)
        await verify(tmp_path, history, run)
    assert total_acked > KILLS * 50, "too few appends acknowledged for the test to mean anything"
    assert len(history.ledgers) > KILLS, "the runs did not cross ledger rollovers"
    assert history.trims >= KILLS // 10, "too few trims happened between kills"
    assert history.batch_checks > KILLS, "too few batch-index deletes were checked after a kill"
