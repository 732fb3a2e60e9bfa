"""Fixtures for store tests: a real managed-ledger factory on a temporary directory (real fsync'd files)."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from txnkeeper.ledger import FileIO, ManagedLedgerFactory


class FailingIO(FileIO):
    """The real file layer, except that ``pwrite`` fails with ENOSPC while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = False

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.failing:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return self.pwrite(fd, b"".join(buffers), offset)  # one primitive to fail, as the ledger's


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "pv"


@pytest.fixture
async def factory(data_dir: Path) -> AsyncIterator[ManagedLedgerFactory]:
    f = ManagedLedgerFactory(data_dir, io_threads=2)
    yield f
    await f.close()
