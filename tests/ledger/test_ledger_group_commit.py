"""Group commit: many appends share one fsync, and no append resolves before its fsync returned."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
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


class WriteSeenIO(GatedSyncIO):
    """Signals (thread-safely) each data pwrite to a ledger file, so the loop can block on it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def pwrite_all(self, fd: int, data: bytes | Sequence[bytes | memoryview], offset: int) -> None:
        super().pwrite_all(fd, data, offset)
        if fd in self.ledger_fds:
            self.written.set()


async def test_start_queued_writes_submits_the_write_in_the_same_callback(tmp_path: Path) -> None:
    """The buffered writer's end-of-turn flush must not wait a loop turn for the flush task: with
    start_queued_writes the I/O thread writes while the loop thread is still inside this callback.
    (Blocking the loop thread here means no loop turn can pass: without the early start the write
    could not begin and the wait would time out.)"""
    io = WriteSeenIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    await ml.add_entry(b"first")  # the ledger file exists; what follows is a plain append
    io.written.clear()
    append = ml.add_entry(b"now")
    ml.start_queued_writes()
    assert io.written.wait(timeout=30), "the write did not start before the loop turned"
    assert (await append).entry_id == 1
    await factory.close()


async def test_start_queued_writes_never_splits_the_group_behind_a_running_write(tmp_path: Path) -> None:
    """While a write runs, start_queued_writes does nothing: what is queued meanwhile still shares
    the next write and fsync (group commit at high concurrency is unchanged)."""
    io = GatedSyncIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log")
    await ml.add_entry(b"create the ledger file")
    io.syncs = 0
    io.gate.clear()
    first = ml.add_entry(b"a")
    ml.start_queued_writes()
    await wait_for(lambda: io.waiting == 1, what="the first write's fsync to start")
    behind = [ml.add_entry(b"%d" % i) for i in range(8)]
    ml.start_queued_writes()  # a write runs: must not submit a second one beside it
    ml.start_queued_writes()
    io.gate.set()
    positions = await asyncio.gather(first, *behind)
    assert [p.entry_id for p in positions] == list(range(1, 10))
    assert io.syncs == 2, "the eight appends queued behind the running write share one fsync"
    await factory.close()


async def test_appends_after_an_early_start_follow_it_in_order(tmp_path: Path) -> None:
    """Appends queued in the same callback after an early start go in the next write, after it, and
    reads see every entry in append order."""
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    head = ml.add_entry(b"head")
    ml.start_queued_writes()
    ml.start_queued_writes()  # the head is already submitted: a second call takes nothing more
    rest = [ml.add_entry(b"rest-%d" % i) for i in range(3)]
    positions = await asyncio.gather(head, *rest)
    assert [p.entry_id for p in positions] == [0, 1, 2, 3]
    entries = await ml.read_entries(positions[0], 4)
    assert [e.data for e in entries] == [b"head", b"rest-0", b"rest-1", b"rest-2"]
    await factory.close()


async def test_start_queued_writes_on_a_closed_ledger_does_nothing(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    await ml.add_entry(b"x")
    await ml.close()
    ml.start_queued_writes()
    assert ml.state == "Closed"
    await factory.close()
