"""Shared fixtures for the managed-ledger tests: real directories, real files, real fsyncs."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import FileIO, ManagedLedgerFactory


@pytest.fixture
async def factory(tmp_path: Path) -> AsyncIterator[ManagedLedgerFactory]:
    f = ManagedLedgerFactory(tmp_path / "data")
    yield f
    await f.close()


class FaultyIO(FileIO):
    """Real file I/O with switchable faults (fault injection at the file layer, not a mock)."""

    def __init__(self) -> None:
        self.disk_full = False  # pwrite fails with ENOSPC (after writing ``partial_bytes``)
        self.partial_bytes = 0
        self.truncate_fails = False
        self.metadata_fails = False  # write_file_atomically fails with ENOSPC
        self.unlink_fails = False
        self.ledger_create_fails = False  # creating a new ledger file fails with ENOSPC
        self.writes_failed = 0
        # A full disk fails writes that need new blocks: appends to ledger files, not the in-place
        # overwrites of the watermark's fixed slots.
        self.ledger_fds: set[int] = set()

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        if self.ledger_create_fails and path.suffix == ".ledger" and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device")
        fd = super().open(path, flags, mode)
        if path.suffix == ".ledger":
            self.ledger_fds.add(fd)
        else:
            self.ledger_fds.discard(fd)
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.disk_full and fd in self.ledger_fds:
            self.writes_failed += 1
            if self.partial_bytes and len(data) > self.partial_bytes:
                written = super().pwrite(fd, memoryview(data)[: self.partial_bytes], offset)
                self.partial_bytes = 0
                return written
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().pwrite(fd, data, offset)

    def truncate(self, fd: int, size: int) -> None:
        if self.truncate_fails:
            raise OSError(errno.EIO, "Input/output error")
        super().truncate(fd, size)

    def unlink(self, path: Path) -> None:
        if self.unlink_fails:
            raise OSError(errno.EIO, "Input/output error")
        super().unlink(path)

    def write_file_atomically(self, path: Path, data: bytes) -> None:
        if self.metadata_fails:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write_file_atomically(path, data)


async def wait_for(condition: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    """Wait until ``condition()`` holds, failing after ``within`` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.005)
