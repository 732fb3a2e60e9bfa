"""The one seam between the managed ledger and the operating system's file calls.

Everything the ledger does to disk goes through a FileIO object, so fault-injection tests can hand the
factory a subclass that fails exactly one kind of call (for example ``pwrite`` with ENOSPC) while the
rest of the ledger runs for real on real files. The primitives an atomic file replace needs, and the
replace itself, come from ``txnkeeper.statefile.FileOps`` (the one implementation every state file
uses); this class adds what ledger files need on top.
"""

from __future__ import annotations

import os
from pathlib import Path

from txnkeeper.statefile import FileOps


class FileIO(FileOps):
    """Thin, blocking wrappers over os.*; always called from an executor thread, never on the loop."""

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def sync_data(self, fd: int) -> None:
        """Make written data (and the file size it implies) durable."""
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def file_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    # Composite operations built from the primitives above, so injected faults reach them too.

    def read_all(self, fd: int, size: int, offset: int) -> bytes:
        """Read exactly ``size`` bytes at ``offset`` unless the file ends first."""
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            chunk = self.pread(fd, remaining, offset)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
            offset += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


DEFAULT_IO = FileIO()
