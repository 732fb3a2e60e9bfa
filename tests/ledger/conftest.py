"""Shared fixtures for the managed-ledger tests: real directories, real files, real fsyncs."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from txnkeeper.ledger import FileIO, ManagedLedgerFactory
from txnkeeper.ledger.watermark import WATERMARK_FILE


@pytest.fixture
async def factory(tmp_path: Path) -> AsyncIterator[ManagedLedgerFactory]:
    f = ManagedLedgerFactory(tmp_path / "data")
    yield f
    await f.close()


class FileKindIO(FileIO):
    """Real file I/O that remembers which open fds are ledger files and which the watermark.

    Fault-injection tests single out one kind of file: a full disk fails appends to ledger files,
    not the watermark's in-place overwrites; a gate holds the ledgers' fsyncs or the watermark's.
    """

    def __init__(self) -> None:
        self.ledger_fds: set[int] = set()
        self.watermark_fds: set[int] = set()

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        for kind, fds in (
            (path.suffix == ".ledger", self.ledger_fds),
            (path.name == WATERMARK_FILE, self.watermark_fds),
        ):
            if kind:
                fds.add(fd)
            else:
                fds.discard(fd)
        return fd


class FaultyIO(FileKindIO):
    """Real file I/O with switchable faults (fault injection at the file layer, not a mock)."""

    def __init__(self) -> None:
        super().__init__()
        self.disk_full = False  # pwrite fails with ENOSPC (after writing ``partial_bytes``)
        self.partial_bytes = 0
        self.truncate_fails = False
        self.metadata_fails = False  # write_file_atomically fails with ENOSPC
        self.unlink_fails = False
        self.ledger_create_fails = False  # creating a new ledger file fails with ENOSPC

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        if self.ledger_create_fails and path.suffix == ".ledger" and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().open(path, flags, mode)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.disk_full and fd in self.ledger_fds:
            if self.partial_bytes and len(data) > self.partial_bytes:
                written = super().pwrite(fd, memoryview(data)[: self.partial_bytes], offset)
                self.partial_bytes = 0
                return written
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return self.pwrite(fd, b"".join(buffers), offset)  # the faults above reach vectored writes too

    def truncate(self, fd: int, size: int) -> None:
        if self.truncate_fails:
            raise OSError(errno.EIO, "Input/output error")
        super().truncate(fd, size)

    def unlink(self, path: Path) -> None:
        if self.unlink_fails:
            raise OSError(errno.EIO, "Input/output error")
        super().unlink(path)

    def write_file_atomically(self, path: Path, data: bytes | Sequence[bytes]) -> None:
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
