"""SIGKILL a process writing batched transaction-log records: every acknowledged record of a transaction
not deleted is replayed at the position its writer was told, and no deleted transaction comes back.

The verdict depends only on what the child reported before the kill: the parent kills it at a moment
it chooses, then reads the pipe to EOF (every line in the pipe was written before the kill). A
transaction whose delete was announced may be whole, partly deleted or gone; one whose delete returned
must be gone; every other acknowledged record must be there.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from txnkeeper.bufferedwriter import WritePosition
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.txnlog import TransactionLogStore, TxnID

from .crash_writer import DELETE_EVERY, RECORDS_PER_TXN

CHILD = Path(__file__).with_name("crash_writer.py")
ACKS_BEFORE_KILL = 600
HANG_GUARD_SECONDS = 240.0  # only catches a child that stopped making progress, never judges speed


@dataclass
class Observed:
    """What the child announced before it was killed."""

    acked: dict[int, list[WritePosition]] = field(default_factory=dict)
    deleting: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)

    def take(self, line: bytes) -> int:
        """Record one complete line; returns 1 for an acknowledgement."""
        kind, seq, *rest = line.decode().split()
        if kind == "ack":
            self.acked.setdefault(int(seq), []).append(WritePosition(*map(int, rest)))
            return 1
        if kind == "deleting":
            self.deleting.add(int(seq))
        elif kind == "deleted":
            self.deleted.add(int(seq))
        else:
            raise AssertionError(f"unexpected line from the child: {line!r}")
        return 0


def run_until_killed(root: Path) -> Observed:
    observed = Observed()
    child = subprocess.Popen([sys.executable, str(CHILD), str(root)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        count = 0
        while count < ACKS_BEFORE_KILL:
            line = child.stdout.readline()
            assert line, f"the child exited early with status {child.wait()}"
            count += observed.take(line)
            assert time.monotonic() < deadline, f"the child made no progress in {HANG_GUARD_SECONDS}s"
    finally:
        child.kill()
        rest = child.stdout.read()  # written before the kill: part of what was promised
        child.stdout.close()
        child.wait(timeout=30)
    for line in rest.splitlines(keepends=True):
        if line.endswith(b"\n"):  # each line is one atomic write, but never judge a partial one
            observed.take(line)
    return observed


def test_nothing_acknowledged_is_lost_and_nothing_deleted_returns(tmp_path: Path) -> None:
    observed = run_until_killed(tmp_path)

    async def replay() -> dict[TxnID, list[WritePosition]]:
        factory = ManagedLedgerFactory(tmp_path, io_threads=1)
        store = await TransactionLogStore.open(factory, 0)
        state = await store.replay()
        await store.close()
        await factory.close()
        return {txn: s.positions for txn, s in state.items()}

    replayed = asyncio.run(replay())
    assert observed.deleted, "the run should have ended some transactions"
    assert observed.deleted <= observed.deleting
    for seq in observed.deleted:
        assert TxnID(0, seq) not in replayed, f"deleted transaction {seq} came back"
    for seq, positions in observed.acked.items():
        got = replayed.get(TxnID(0, seq))
        if seq in observed.deleting:
            # its delete was under way at the kill: whole, partly deleted or gone, but nothing else
            assert got is None or set(got) <= set(positions), f"{seq}: {got} vs acked {positions}"
            continue
        assert got is not None, f"acknowledged transaction {seq} was lost"
        assert set(positions) <= set(got), f"acknowledged records of {seq} lost: {positions} vs {got}"
    assert all(len(ps) <= RECORDS_PER_TXN for ps in observed.acked.values())
    assert all(seq % DELETE_EVERY == 0 for seq in observed.deleting)
    assert any(p.batch_size > 1 for ps in observed.acked.values() for p in ps), "records were batched"
