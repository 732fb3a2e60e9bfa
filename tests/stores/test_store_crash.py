"""SIGKILL a process writing batched transaction-log records: every acknowledged record of a transaction
not deleted is replayed at the position its writer was told, and no deleted transaction comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from txnkeeper.bufferedwriter import WritePosition
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.txnlog import TransactionLogStore, TxnID

CHILD = Path(__file__).with_name("crash_writer.py")
DELETE_EVERY = 3  # crash_writer ends every third transaction once its records are acknowledged
RECORDS_PER_TXN = 2
ACKS_BEFORE_KILL = 1500


def run_until_killed(root: Path) -> tuple[dict[int, list[WritePosition]], set[int]]:
    acked: dict[int, list[WritePosition]] = {}
    deleted: set[int] = set()
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        count = 0
        for line in child.stdout:
            kind, seq, *rest = line.split()
            if kind == "ack":
                acked.setdefault(int(seq), []).append(WritePosition(*map(int, rest)))
                count += 1
            else:
                deleted.add(int(seq))
            if count >= ACKS_BEFORE_KILL:
                break
            assert time.monotonic() < deadline, "the child wrote too slowly"
        assert count >= ACKS_BEFORE_KILL, f"child ended early: {child.stderr.read() if child.stderr else ''}"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    return acked, deleted


def test_nothing_acknowledged_is_lost_and_nothing_deleted_returns(tmp_path: Path) -> None:
    acked, deleted = run_until_killed(tmp_path)

    async def replay() -> dict[TxnID, list[WritePosition]]:
        factory = ManagedLedgerFactory(tmp_path, io_threads=1)
        store = await TransactionLogStore.open(factory, 0)
        state = await store.replay()
        await store.close()
        await factory.close()
        return {txn: s.positions for txn, s in state.items()}

    replayed = asyncio.run(replay())
    assert deleted, "the run should have ended some transactions"
    for seq in deleted:
        assert TxnID(0, seq) not in replayed, f"deleted transaction {seq} came back"
    for seq, positions in acked.items():
        if seq % DELETE_EVERY == 0 and len(positions) == RECORDS_PER_TXN:
            continue  # its delete may have been under way at the kill: partly deleted is fine
        got = replayed.get(TxnID(0, seq))
        assert got is not None, f"acknowledged transaction {seq} was lost"
        assert set(positions) <= set(got), f"acknowledged records of {seq} lost: {positions} vs {got}"
    assert any(p.batch_size > 1 for ps in acked.values() for p in ps), "records were batched"
