"""The ``filesystem`` blob-store driver: the same PIP-76 objects as files in a directory.

For clusters without object storage, a directory (typically an RWX volume) holds the segment objects
under their keys. Writes go to a hidden temporary file, are fsynced, renamed into place and the
directory fsynced, so a reader (or a crash) never sees a half-written object under its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from . import timeline
from .blobstore import BlobStore, BlobUpload, check_key, check_range
from .errors import BlobNotFound, BlobStoreError, BlobStoreUnavailable

_TEMP_PREFIX = ".txnkeeper-upload-"
# An upload writes and fdatasyncs its object in slices this large. Left to the kernel, a streaming
# segment's blocks pile up as tens of MiB of dirty pages that are written back in bursts; when the
# directory shares a disk with the ledgers (the default beside them, or one small volume), every
# group commit's fdatasync then queues behind such a burst: 10-25 ms p99 appends instead of 3-7 ms
# with offload off. Syncing each slice as it is written keeps the tier's writeback small and steady.
WRITE_SLICE_BYTES = 256 * 1024
# ``read_checked`` reads into buffers kept for the next read rather than a fresh block-sized object
# each time: a few of them (a reader and its read-ahead), and none larger than this, so an idle store
# holds at most READ_BUFFERS * READ_BUFFER_MAX_BYTES.
READ_BUFFERS = 4
READ_BUFFER_MAX_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


class _BufferPool:
    """Reusable read buffers, shared by the worker threads of one store."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        with self._lock:
            for n, buf in enumerate(self._free):
                if len(buf) >= size:
                    return self._free.pop(n)
        return bytearray(size)

    def give(self, buf: bytearray) -> None:
        if len(buf) > READ_BUFFER_MAX_BYTES:
            return
        with self._lock:
            if len(self._free) >= READ_BUFFERS:
                self._free.remove(min(self._free, key=len))  # keep the larger ones: they fit more reads
            self._free.append(buf)


# The background stream syncs smaller slices: a group commit's fdatasync that arrives while a tier
# slice is being synced waits for it, so the slice's size is what a producer's append can lose. With
# 256 KiB slices the slowest 1 % of appends coincided with tier writes 3-4x as often as appends in
# general, with 32 KiB no more often (docs/performance.md, issue 13). Smaller slices cost more
# fdatasyncs per MiB, so they are for keeping up with producers, not for catching up or manual offload.
STREAMING_WRITE_SLICE_BYTES = 32 * 1024
# Catching up (more than the offloader's catch-up threshold not yet streamed), the stream syncs 64 KiB
# slices, not the driver's 256 KiB: the read-back worker still starts each one in a gap between group
# commits (ledger.commit_activity), and a 64 KiB slice mostly ends before the next commit arrives;
# 32 KiB slices fell behind producing at 40 MiB/s, 256 KiB ones collided (docs/performance.md).
STREAMING_CATCH_UP_SLICE_BYTES = 64 * 1024


class FileSystemBlobStore(BlobStore):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.location = f"file://{self.root}"
        self._buffers = _BufferPool()

    def _path(self, key: str) -> Path:
        return self.root / check_key(self.location, key)

    def _error(self, key: str | None, exc: OSError, doing: str) -> BlobStoreError:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and key is not None:
            return BlobNotFound(self.location, key, "no such object")
        if exc.errno in (errno.EIO, errno.ESTALE, errno.ENOTCONN, errno.ETIMEDOUT):
            return BlobStoreUnavailable(
                self.location, key, f"{doing} failed: {exc.strerror}", "check the volume's mount"
            )
        return BlobStoreError(self.location, key, f"{doing} failed: {exc.strerror or exc}")

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise BlobStoreUnavailable(
                self.location, None, "the offload directory does not exist", "create it or mount the volume"
            )

    # Blocking helpers, run in a worker thread.

    def _write_file(self, key: str, data: bytes) -> None:
        self._check_root()
        final = self._path(key)
        upload = _FileUpload(self, key, final)
        upload.write_sync(data)
        upload.complete_sync()

    def _read_range(self, key: str, offset: int, length: int | None) -> bytes:
        """The one place object bytes are read (tests count calls to it)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
        except IsADirectoryError:
            raise BlobNotFound(self.location, key, "no such object") from None
        except OSError as exc:
            raise self._error(key, exc, "read") from exc

    def _read_into(self, key: str, offset: int, into: memoryview) -> int:
        """Object bytes from ``offset`` into ``into`` (up to its length): how many were read, fewer
        where the object ends. With ``_read_range``, the only places object bytes are read."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except IsADirectoryError:
            raise BlobNotFound(self.location, key, "no such object") from None
        except OSError as exc:
            raise self._error(key, exc, "read") from exc
        try:
            done = 0
            while done < len(into):
                n = os.preadv(fd, [into[done:]], offset + done)
                if n == 0:
                    break  # the object ends here
                done += n
            return done
        except IsADirectoryError:
            raise BlobNotFound(self.location, key, "no such object") from None
        except OSError as exc:
            raise self._error(key, exc, "read") from exc
        finally:
            os.close(fd)

    def _read_checked(self, key: str, offset: int, length: int, check: Callable[[memoryview], T]) -> T:
        buf = self._buffers.take(length)
        try:
            with memoryview(buf) as whole:
                n = self._read_into(key, offset, whole[:length])
                with whole[:n] as view:
                    return check(view)
        finally:
            self._buffers.give(buf)

    def _length(self, key: str) -> int:
        path = self._path(key)
        try:
            st = path.stat()
        except OSError as exc:
            raise self._error(key, exc, "stat") from exc
        if not path.is_file():
            raise BlobNotFound(self.location, key, "no such object")
        return st.st_size

    def _list(self, prefix: str) -> list[str]:
        self._check_root()
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = Path(dirpath).relative_to(self.root)
            for name in filenames:
                if name.startswith(_TEMP_PREFIX):
                    continue
                key = str(rel_dir / name) if str(rel_dir) != "." else name
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error(key, exc, "delete") from exc
        _sync_dir(path.parent)

    # BlobStore API.

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._write_file, key, data)

    def open_upload(self, key: str) -> BlobUpload:
        return _FileUpload(self, key, self._path(key))

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_range(self.location, key, offset, length)
        return await asyncio.to_thread(self._read_range, key, offset, length)

    async def read_checked(self, key: str, offset: int, length: int, check: Callable[[memoryview], T]) -> T:
        check_range(self.location, key, offset, length)
        return await asyncio.to_thread(self._read_checked, key, offset, length, check)

    async def length(self, key: str) -> int:
        return await asyncio.to_thread(self._length, key)

    async def list(self, prefix: str = "") -> list[str]:
        return await asyncio.to_thread(self._list, prefix)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._delete, key)


def write_synced(
    fd: int,
    data: bytes | bytearray | memoryview,
    offset: int,
    slice_bytes: int = WRITE_SLICE_BYTES,
    before_slice: Callable[[], object] | None = None,
) -> None:
    """Write ``data`` at ``offset`` of ``fd`` and fdatasync it, slice by slice. Blocking; the
    read-back worker process writes the blocks it uploads with it too, waiting ``before_slice`` (a
    gap between the ledgers' group commits) before each slice."""
    view = memoryview(data)
    while view:
        if before_slice is not None:
            waited = timeline.now()
            before_slice()
            timeline.span("tier_wait", waited)
        started = timeline.now()
        n = os.pwrite(fd, view[:slice_bytes], offset)
        synced = timeline.now()
        os.fdatasync(fd)
        timeline.span("tier_write", started, synced)
        timeline.span("tier_sync", synced)
        view = view[n:]
        offset += n


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _FileUpload(BlobUpload):
    """Appends to a hidden temporary file beside the target; rename on complete makes it visible."""

    local_files = True

    def __init__(self, store: FileSystemBlobStore, key: str, final: Path) -> None:
        self.store = store
        self.key = key
        self.final = final
        self.temp = final.parent / f"{_TEMP_PREFIX}{final.name}-{uuidlib.uuid4().hex}"
        self.fd: int | None = None
        self.written = 0
        self.done = False

    def _open_sync(self) -> int:
        if self.done:
            raise BlobStoreError(self.store.location, self.key, "upload already completed or aborted")
        if self.fd is None:
            self.store._check_root()
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        return self.fd

    def write_sync(self, data: bytes | bytearray) -> None:
        try:
            write_synced(self._open_sync(), data, self.written)
            self.written += len(data)
        except OSError as exc:
            self.abort_sync()
            raise self.store._error(None, exc, f"write of {self.key!r}") from exc

    def local_file(self) -> str:
        """The hidden temporary file (created now if need be): a block written there at the length
        written so far and fdatasynced by the read-back worker is part of the object once ``appended``."""
        try:
            self._open_sync()
        except OSError as exc:
            self.abort_sync()
            raise self.store._error(None, exc, f"write of {self.key!r}") from exc
        return str(self.temp)

    def appended(self, length: int) -> None:
        if self.done:
            raise BlobStoreError(self.store.location, self.key, "upload already completed or aborted")
        self.written += length

    def complete_sync(self) -> int:
        if self.done:
            raise BlobStoreError(self.store.location, self.key, "upload already completed or aborted")
        try:
            if self.fd is None:
                self.write_sync(b"")
            assert self.fd is not None
            started = timeline.now()
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.temp, self.final)
            _sync_dir(self.final.parent)
            timeline.span("tier_sync", started)
        except OSError as exc:
            self.abort_sync()
            raise self.store._error(None, exc, f"completing {self.key!r}") from exc
        self.done = True
        return self.written

    def abort_sync(self) -> None:
        self.done = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            self.temp.unlink()

    async def write(self, data: bytes | bytearray) -> None:
        await asyncio.to_thread(self.write_sync, data)

    async def complete(self) -> int:
        return await asyncio.to_thread(self.complete_sync)

    async def abort(self) -> None:
        await asyncio.to_thread(self.abort_sync)
