"""The buffered writer on a real managed ledger: how many loop turns a record waits for its write.

At one transaction in flight every loop turn between a record's submit and its ledger write is on the
transaction's critical path. The unbatched log's write starts one turn after the submit (when the
ledger's group-commit task first runs); the adaptive batched log must not add a turn on top of its own
end-of-turn flush, so the flush hands the entry to the ledger and starts its write in that callback.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from txnkeeper.bufferedwriter import TXN_LOG_CODEC, BatchedWriteConfig, BufferedWriter, WritePosition
from txnkeeper.ledger import LedgerWriteError, ManagedLedgerFactory
from txnkeeper.ledger.fileio import FileIO

from .test_writer_logic import rec


class WriteSeenIO(FileIO):
    """Real file I/O that signals each write to a ledger file (not the watermark, from the I/O thread)."""

    def __init__(self) -> None:
        self.written = threading.Event()
        self.ledger_fds: set[int] = set()

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        if path.suffix == ".ledger":
            self.ledger_fds.add(fd)
        else:
            self.ledger_fds.discard(fd)
        return fd

    disk_full = False

    def pwrite_all(self, fd: int, data: bytes | Sequence[bytes | memoryview], offset: int) -> None:
        if self.disk_full and fd in self.ledger_fds:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwrite_all(fd, data, offset)
        if fd in self.ledger_fds:
            self.written.set()


async def test_adaptive_idle_flush_starts_the_ledger_write_in_its_own_callback(tmp_path: Path) -> None:
    io = WriteSeenIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ledger = await factory.open("log")
    writer = BufferedWriter(ledger, TXN_LOG_CODEC, BatchedWriteConfig(enabled=True, flush_mode="adaptive"))
    assert await writer.write(rec(1)) == WritePosition(ledger.current_ledger_id(), 0, 1, 0)
    io.written.clear()

    both = [writer.submit(rec(2)), writer.submit(rec(3))]
    assert writer.pending_records == 2, "records written in one turn wait for the end of that turn"
    await asyncio.sleep(0)  # one loop turn: the idle flush (queued before this resumption) has run
    assert writer.pending_records == 0
    # Blocking the loop thread: no further loop turn can pass, so the write must already be submitted.
    assert io.written.wait(timeout=30), "the batch's write waited for another loop turn"
    positions = await asyncio.gather(*both)
    assert [(p.entry_id, p.batch_size, p.batch_index) for p in positions] == [(1, 2, 0), (1, 2, 1)]
    await writer.close()
    await factory.close()


async def test_a_failed_batch_write_fails_its_records_and_flush_still_returns(tmp_path: Path) -> None:
    """Batches are settled by the ledger's callback (add_entry_notify), not a future: a failed write
    must still reach every record of the batch, and flush()/close() must not wait forever for it."""
    io = WriteSeenIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ledger = await factory.open("log")
    writer = BufferedWriter(ledger, TXN_LOG_CODEC, BatchedWriteConfig(enabled=True, flush_mode="adaptive"))
    kept = await writer.write(rec(1))
    io.disk_full = True
    sink: list[int] = []
    lost = [writer.submit(rec(n), sink) for n in (2, 3)]
    await asyncio.wait_for(writer.flush(), 30)
    for future in lost:
        with pytest.raises(LedgerWriteError, match="No space left on device"):
            await future
    assert sink == [-1, -1], "each record's sink hears FAILED"
    assert writer.pending_records == 0
    await asyncio.wait_for(writer.close(), 30)
    assert kept.entry_id == 0
    await factory.close()
