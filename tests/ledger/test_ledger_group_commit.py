"""Group commit: many appends share one fsync, and no append resolves before its fsync returned."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory

from .conftest import FileKindIO, wait_for


class GatedSyncIO(FileKindIO):
    """Counts ledger files' data fsyncs and can hold them (a real fsync runs once the gate opens).

    The watermark's own fsyncs (they run beside the next group's) are neither counted nor held.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0
        self.syncs = 0

    def sync_data(self, fd: int) -> None:
        if fd not in self.ledger_fds:
            super().sync_data(fd)
            return
        if not self.gate.is_set():
            self.waiting += 1
            self.gate.wait(timeout=30)
        super().sync_data(fd)
        self.syncs += 1


async def test_no_append_resolves_before_its_fsync(tmp_path: Path) -> None:
    io = GatedSyncIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    io.gate.clear()
    appends = [asyncio.ensure_future(ml.add_entry(b"%d" % i)) for i in range(64)]
    await wait_for(lambda: io.waiting == 1, what="the first group's fsync to start")
    assert not any(a.done() for a in appends)
    assert ml.internal_stats()["currentLedgerEntries"] == 0  # nothing is confirmed yet
    io.gate.set()
    positions = await asyncio.gather(*appends)
    assert [p.entry_id for p in positions] == list(range(64))
    await factory.close()


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    io = GatedSyncIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    grouped = await factory.open("grouped")
    baseline = await factory.open("baseline", ManagedLedgerConfig(group_commit=False))
    io.syncs = 0
    await asyncio.gather(*(grouped.add_entry(b"x" * 100) for _ in range(256)))
    grouped_syncs = io.syncs
    io.syncs = 0
    await asyncio.gather(*(baseline.add_entry(b"x" * 100) for _ in range(256)))
    assert io.syncs == 256  # the baseline: one write + fsync per append
    assert grouped_syncs <= 16, f"256 concurrent appends took {grouped_syncs} fsyncs"
    await factory.close()
