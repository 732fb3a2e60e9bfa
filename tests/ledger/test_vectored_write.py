"""A ledger group goes to the file as its buffers (``pwritev``), never joined first: every byte must
land where a joined write would have put it, also when the kernel writes less than asked and when a
group has more buffers than one call may carry (``IOV_MAX``)."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from txnkeeper.ledger import FileIO


class ShortWritesIO(FileIO):
    """Real writes, at most ``limit`` bytes per call, counting calls and the buffers each carried."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[int] = []

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        self.calls.append(len(buffers))
        taken: list[memoryview] = []
        room = self.limit
        for buffer in buffers:
            if room <= 0:
                break
            taken.append(buffer[:room])
            room -= len(taken[-1])
        return super().pwritev(fd, taken, offset)


@pytest.mark.parametrize("limit", [1, 7, 4096, 1 << 30])
def test_short_vectored_writes_continue_where_they_stopped(tmp_path: Path, limit: int) -> None:
    rng = random.Random(limit)
    buffers: list[bytes | memoryview] = [os.urandom(rng.choice([0, 1, 20, 300, 5000])) for _ in range(60)]
    buffers[3] = memoryview(bytearray(b"a view, not bytes"))
    io = ShortWritesIO(limit)
    path = tmp_path / "group"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        io.pwrite(fd, b"HEAD", 0)
        io.pwrite_all(fd, buffers, 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"HEAD" + b"".join(bytes(b) for b in buffers)
    assert all(count > 0 for count in io.calls)  # empty buffers are never sent


def test_more_buffers_than_one_call_may_carry(tmp_path: Path) -> None:
    iov_max = os.sysconf("SC_IOV_MAX")
    buffers: list[bytes | memoryview] = [bytes([i % 251]) * 3 for i in range(iov_max * 2 + 5)]
    io = ShortWritesIO(1 << 30)
    path = tmp_path / "group"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        io.pwrite_all(fd, buffers, 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(bytes(b) for b in buffers)
    assert max(io.calls) <= iov_max and len(io.calls) == 3


def test_a_write_that_writes_nothing_is_an_error(tmp_path: Path) -> None:
    class StuckIO(FileIO):
        def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
            return 0

    fd = os.open(tmp_path / "group", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="pwritev wrote 0 bytes at offset 0"):
            StuckIO().pwrite_all(fd, [b"data"], 0)
    finally:
        os.close(fd)
