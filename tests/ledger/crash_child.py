"""Child process of the crash test: appends forever, reporting every acknowledged position.

Usage: crash_child.py ROOT FIRST_SEQ SEED. Lines on stdout (each one os.write, so a line is either
fully in the pipe or not at all): "R" once open, "A seq ledger entry" after each acknowledged append,
"M ledger entry" after a durable mark-delete, "D ledger entry" after a durable individual delete,
"B ledger entry index" after a durable batch-index delete (batches of 8), "T id,id" after a trim.
It runs until SIGKILLed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
from pathlib import Path

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position

NAME = "persistent://crash/ns/log"
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=40, max_size_per_ledger_bytes=6000)
APPENDERS = 8


def payload(seq: int) -> bytes:
    """Deterministic, self-describing entry data (so the parent can tell any entry's origin)."""
    body = hashlib.sha256(b"%d" % seq).digest() * (1 + seq % 7)
    return b"%d:" % seq + body[: 1 + seq % 200]


def report(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def main(root: Path, first_seq: int, seed: int) -> None:
    rng = random.Random(seed)
    factory = ManagedLedgerFactory(root)
    ml = await factory.open(NAME, CONFIG)
    cursor = await ml.open_cursor("crash-cursor")
    report("R")
    next_seq = first_seq
    acked: list[Position] = []
    enough = asyncio.Event()

    async def appender() -> None:
        nonlocal next_seq
        while True:
            seq = next_seq
            next_seq += 1
            position = await ml.add_entry(payload(seq))
            acked.append(position)
            if len(acked) >= 60:
                enough.set()
            report(f"A {seq} {position.ledger_id} {position.entry_id}")

    async def consumer() -> None:
        while True:
            await enough.wait()
            enough.clear()
            behind = sorted(acked[:-30])
            del acked[: len(behind)]
            if rng.random() < 0.5:
                picked = rng.sample(behind, k=min(5, len(behind)))
                await cursor.delete(picked)
                for p in picked:
                    report(f"D {p.ledger_id} {p.entry_id}")
            for p in rng.sample(behind[len(behind) // 2 :], k=2):
                index = rng.randrange(8)
                await cursor.delete_batch_indexes(p, 8, [index])
                report(f"B {p.ledger_id} {p.entry_id} {index}")
            target = behind[len(behind) // 2]
            await cursor.mark_delete(target)
            report(f"M {target.ledger_id} {target.entry_id}")
            trimmed = await ml.trim()
            report("T " + ",".join(map(str, trimmed)))

    await asyncio.gather(*(appender() for _ in range(APPENDERS)), consumer())


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
