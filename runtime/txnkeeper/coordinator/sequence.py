"""TxnID sequence allocation that never reuses an id after a restart.

Why not only ``max_local_txn_id`` in the log: the coordinator deletes a transaction's records when it
ends, so after a quiet period the log may hold no record at all. A hi/lo reservation file does not
depend on the log: the allocator durably reserves a block of ids (write temp, fsync, rename, fsync
dir) before handing any of them out, and a restart resumes above the reserved ceiling. Ids skipped
by a crash are simply never used.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

RESERVATION_BLOCK = 10_000


class SequenceAllocator:
    """Allocates increasing sequence numbers for one coordinator."""

    def __init__(self, path: Path, block: int = RESERVATION_BLOCK) -> None:
        if block <= 0:
            raise ValueError(f"reservation block must be positive, got {block}")
        self._path = path
        self._block = block
        self._last = 0
        self._ceiling = 0
        self._reserving: asyncio.Future[None] | None = None

    def load(self, floor: int = 0) -> None:
        """Read the persisted ceiling; ``floor`` is the highest id the log still shows (if any)."""
        ceiling = 0
        if self._path.exists():
            text = self._path.read_text().strip()
            try:
                ceiling = int(text)
            except ValueError as exc:
                raise ValueError(f"sequence file {self._path} is corrupt: {text!r}") from exc
        self._last = max(ceiling, floor)
        self._ceiling = self._last

    @property
    def last(self) -> int:
        return self._last

    def next_nowait(self) -> int | None:
        """The next id if the reserved block has one left (no wait), else None: use ``next()``."""
        if self._last >= self._ceiling or self._reserving is not None:
            return None
        self._last += 1
        return self._last

    async def next(self) -> int:
        while self._last >= self._ceiling:
            if self._reserving is None:
                self._reserving = asyncio.get_running_loop().create_future()
                target = self._last + self._block
                try:
                    await asyncio.to_thread(_write_atomically, self._path, str(target))
                    self._ceiling = target
                    self._reserving.set_result(None)
                except BaseException as exc:
                    self._reserving.set_exception(exc)
                    raise
                finally:
                    self._reserving = None
            else:
                await asyncio.shield(self._reserving)
        self._last += 1
        return self._last


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomically(path: Path, text: str) -> None:
    """Durably replace ``path`` with ``text`` (shared with the route table)."""
    _write_atomically(path, text)
