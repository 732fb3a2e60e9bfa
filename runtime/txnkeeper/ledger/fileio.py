"""The one seam between the managed ledger and the operating system's file calls.

Everything the ledger does to disk goes through a FileIO object, so fault-injection tests can hand the
factory a subclass that fails exactly one kind of call (for example ``pwrite`` with ENOSPC) while the
rest of the ledger runs for real on real files.
"""

from __future__ import annotations

import os
from pathlib import Path


class FileIO:
    """Thin, blocking wrappers over os.*; always called from an executor thread, never on the loop."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def sync_data(self, fd: int) -> None:
        """Make written data (and the file size it implies) durable."""
        os.fdatasync(fd)

    def sync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def file_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def sync_dir(self, path: Path) -> None:
        """fsync a directory so created, renamed and removed names in it are durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # Composite operations built from the primitives above, so injected faults reach them too.

    def pwrite_all(self, fd: int, data: bytes, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (a short write continues; an error propagates)."""
        view = memoryview(data)
        while view:
            written = self.pwrite(fd, view, offset)
            if written <= 0:
                raise OSError(f"pwrite wrote {written} bytes at offset {offset}")
            view = view[written:]
            offset += written

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

    def write_file_atomically(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data`` so a crash leaves either the old or the new content.

        Write a temp file, fsync it, rename it over the target, fsync the directory.
        """
        tmp = path.with_name(path.name + ".tmp")
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.pwrite_all(fd, data, 0)
            self.sync(fd)
        finally:
            self.close(fd)
        self.replace(tmp, path)
        self.sync_dir(path.parent)


DEFAULT_IO = FileIO()
