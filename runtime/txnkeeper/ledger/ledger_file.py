"""One ledger: its file on disk, the offset index of its durable entries, and the counters appends use.

The index holds every entry's offset while the ledger is written; once it is closed and every append
to it confirmed (``seal_index``) only a sparse index stays (offset_index.py: a store's memory must not
grow with the data its topics retain). The offloader, which plans batches from exact offsets, loads
the whole index of the closed ledger it reads back (``load_index``) and seals it again after.

A LedgerFile may exist in memory before its file does (a rollover reserves the next ledger at once so
appends keep flowing; the group-commit writer creates the file before the first write to it). The
"assigned" counters move when an append is queued, the "confirmed" ones only after its fsync.
Blocking methods run on an executor thread (``write_and_sync`` also on the loop's, for the writer's
inline path: one small write and fdatasync); the rest run on the event loop.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable
from pathlib import Path

from . import commit_activity, io_stats
from .entry_format import FILE_HEADER, ScanResult, decode_records, file_header, scan, skip_records
from .errors import CorruptEntryError, LedgerWriteError, NoSuchEntryError
from .fileio import FileIO
from .offset_index import SparseIndex


def ledger_file_name(ledger_id: int) -> str:
    return f"{ledger_id:020d}.ledger"


class LedgerFile:
    def __init__(self, io: FileIO, directory: Path, ledger_id: int) -> None:
        self.io = io
        self.ledger_id = ledger_id
        self.path = directory / ledger_file_name(ledger_id)
        self.offsets: array[int] | None = array("q")  # start of each confirmed record; None: sealed
        self.sparse: SparseIndex | None = None  # the anchors a sealed ledger keeps instead
        self.entries = 0  # confirmed
        self.data_bytes = 0  # confirmed payload bytes
        self.file_bytes = FILE_HEADER.size  # confirmed end of file
        self.assigned_entries = 0
        self.assigned_bytes = 0  # payload bytes queued (drives size rollover)
        self.assigned_end = FILE_HEADER.size
        self.created_mono = time.monotonic()
        self.on_disk = False
        self.broken: LedgerWriteError | None = None  # set after a failed write: no more appends here
        self.retired = False  # trimmed: reads fail, fd closes when the last read ends
        self._write_fd = -1
        self._read_fd = -1
        self._readers = 0

    # --- opening -------------------------------------------------------------------------------

    def create(self) -> None:
        """Create the file with its header, durable (file and directory fsync'd). Blocking."""
        fd = self.io.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            self.io.pwrite_all(fd, file_header(self.ledger_id), 0)
            self.io.sync(fd)
        except BaseException:
            self.io.close(fd)
            raise
        self.io.sync_dir(self.path.parent)
        self._write_fd = fd
        self.on_disk = True
        self.created_mono = time.monotonic()

    def check(
        self,
        *,
        writable_tail: bool,
        expected_entries: int | None,
        acknowledged: int | None,
        watermark_path: Path | None,
        verify_data: bool = True,
    ) -> ScanResult:
        """Scan the existing file, opened read-only, and check it against what is known. Blocking.

        ``writable_tail``: the ledger was open for writing, so a torn tail is reported, not raised.
        ``expected_entries``: the count a closed ledger recorded. ``acknowledged``: the newest entry
        id the watermark records in this ledger.
        """
        fd = self.io.open(self.path, os.O_RDONLY)
        try:
            data = self.io.read_all(fd, self.io.file_size(fd), 0)
        finally:
            self.io.close(fd)
        result = scan(
            data,
            self.ledger_id,
            self.path,
            tail_allowed=writable_tail,
            acknowledged=acknowledged,
            watermark_path=watermark_path,
            verify_data=verify_data,
        )
        if expected_entries is not None and len(result.offsets) != expected_entries:
            raise CorruptEntryError(
                self.ledger_id,
                len(result.offsets),
                self.path,
                result.valid_end,
                f"closed ledger should hold {expected_entries} entries, the file holds {len(result.offsets)}",
            )
        return result

    def recover(
        self,
        *,
        writable_tail: bool,
        expected_entries: int | None,
        acknowledged: int | None = None,
        watermark_path: Path | None = None,
        verify_data: bool = True,
    ) -> str | None:
        """Check the file (see check), cut a torn tail (truncate + fsync) and build the index.

        Returns the torn tail's reason, if one was cut. The ledger that was being written is fsynced
        even when nothing is cut: a killed process's last writes may sit only in the page cache, and
        the entries found here become the recovered ledger's durable count (and the watermark).
        """
        result = self.check(
            writable_tail=writable_tail,
            expected_entries=expected_entries,
            acknowledged=acknowledged,
            watermark_path=watermark_path,
            verify_data=verify_data,
        )
        if writable_tail:
            fd = self.io.open(self.path, os.O_RDWR)
            try:
                if result.torn_reason is not None:
                    if result.valid_end < FILE_HEADER.size:
                        self.io.pwrite_all(fd, file_header(self.ledger_id), 0)
                        self.io.truncate(fd, FILE_HEADER.size)
                    else:
                        self.io.truncate(fd, result.valid_end)
                self.io.sync(fd)
            finally:
                self.io.close(fd)
        self.adopt(result)
        return result.torn_reason

    def adopt(self, result: ScanResult) -> None:
        """Take a checked file's index as this ledger's confirmed state (nothing is written)."""
        self.offsets = result.offsets
        self.sparse = None
        self.entries = self.assigned_entries = len(result.offsets)
        self.data_bytes = self.assigned_bytes = result.data_bytes
        self.file_bytes = self.assigned_end = max(result.valid_end, FILE_HEADER.size)
        self.on_disk = True

    # --- writing (group-commit writer) ---------------------------------------------------------

    def write_and_sync(
        self,
        buffers: list[bytes],
        offset: int,
        sync: bool,
        mark_written: Callable[[], Callable[[], None] | None] | None = None,
    ) -> None:
        """Write one group at ``offset`` and make it durable. Blocking.

        ``mark_written`` runs between the data pwrite and the fsync (the watermark's written mark) and
        returns what takes the mark back if the group fails. On failure the partial write is cut
        back to ``offset`` so nothing unacknowledged survives; if even that fails, GroupWriteFailed
        carries ``cut_failure`` and the ledger must be reopened, which cuts it as a torn tail.
        """
        undo: Callable[[], None] | None = None
        activity = commit_activity.current() if sync else None  # the offload worker's tier slices wait
        if activity is not None:
            activity.begin()
        try:
            self.io.pwrite_all(self._write_fd, buffers, offset)
            if mark_written is not None:
                undo = mark_written()
            if sync:
                began = time.perf_counter()
                self.io.sync_data(self._write_fd)
                io_stats.FSYNC.observe(time.perf_counter() - began)
        except OSError as exc:
            if undo is not None:
                undo()  # before the cut: a crash in between must not find the mark past the file's end
            try:
                self.io.truncate(self._write_fd, offset)
                self.io.sync_data(self._write_fd)
            except OSError as cut_exc:
                raise GroupWriteFailed(exc, cut_exc) from exc
            raise GroupWriteFailed(exc, None) from exc
        finally:
            if activity is not None:
                activity.end()

    def open_for_writes(self) -> None:
        """Reopen a recovered (empty) ledger for appends. Blocking."""
        if self._write_fd < 0:
            self._write_fd = self.io.open(self.path, os.O_RDWR)
        self.created_mono = time.monotonic()

    def confirm(self, offsets: list[int], count: int, data_bytes: int, end: int) -> None:
        if self.offsets is None:  # seal_index waits for every assigned append; a bug if not
            raise LedgerWriteError(f"ledger {self.ledger_id} was sealed with appends still to confirm")
        self.offsets.extend(offsets)
        self.entries += count
        self.data_bytes += data_bytes
        self.file_bytes = end

    def close_for_writes(self) -> None:
        if self._write_fd >= 0:
            self.io.close(self._write_fd)
            self._write_fd = -1

    # --- the offset index -----------------------------------------------------------------------

    def seal_index(self) -> None:
        """Keep only the sparse index: the ledger is closed and will never be appended to again.

        A no-op while appends are still to be confirmed (they need the dense index) or when sealed.
        """
        offsets = self.offsets
        if offsets is None or self.entries != self.assigned_entries:
            return
        if self.sparse is None:
            self.sparse = SparseIndex.from_offsets(offsets, self.file_bytes)
        self.offsets = None

    def load_index(self) -> None:
        """Rebuild a sealed ledger's dense index from its file (record headers only). Blocking.

        Raises CorruptEntryError naming file, entry and offset if a header no longer checks.
        """
        if self.offsets is not None:
            return
        fd = self.io.open(self.path, os.O_RDONLY)
        try:
            data = self.io.read_all(fd, self.file_bytes, 0)
        finally:
            self.io.close(fd)
        result = scan(data, self.ledger_id, self.path, tail_allowed=False, verify_data=False)
        if len(result.offsets) != self.entries:
            raise CorruptEntryError(
                self.ledger_id,
                len(result.offsets),
                self.path,
                result.valid_end,
                f"closed ledger should hold {self.entries} entries, the file holds {len(result.offsets)}",
            )
        self.offsets = result.offsets  # the anchors stay: a read on a thread may be using them

    def index_bytes(self) -> int:
        """Memory the offset index takes (dense or sparse)."""
        dense = len(self.offsets) * self.offsets.itemsize if self.offsets is not None else 0
        return dense + (self.sparse.memory_bytes() if self.sparse is not None else 0)

    # --- reading --------------------------------------------------------------------------------

    def read(self, first: int, count: int) -> list[bytes]:
        """Read and verify confirmed entries [first, first+count). Blocking; see begin_read."""
        if self.retired or self._read_fd < 0:
            raise NoSuchEntryError(f"ledger {self.ledger_id} was trimmed")
        last = first + count
        offsets = self.offsets  # one look: the loop may seal the index meanwhile
        if offsets is not None:
            start = offsets[first]
            end = offsets[last] if last < self.entries else self.file_bytes
            chunk = self.io.read_all(self._read_fd, end - start, start)
            return decode_records(
                chunk, first, count, ledger_id=self.ledger_id, path=self.path, base_offset=start
            )
        sparse = self._sealed()
        anchor, start = sparse.at_or_before(first)
        end = sparse.end_at_or_after(last)
        chunk = self.io.read_all(self._read_fd, end - start, start)
        at = skip_records(
            chunk, anchor, first - anchor, ledger_id=self.ledger_id, path=self.path, base_offset=start
        )
        return decode_records(
            chunk, first, count, ledger_id=self.ledger_id, path=self.path, base_offset=start, start=at
        )

    def span(self, first: int, count: int) -> tuple[int, int]:
        """The file offsets [start, end) the confirmed records first..first+count-1 occupy.

        Without I/O while the dense index is loaded; a sealed ledger's walks its file from the
        anchors (at most two small reads: callers that plan from spans load the index first).
        """
        last = first + count
        if first < 0 or count < 1 or last > self.entries:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id} holds {self.entries} durable entries, not {first}..{last - 1}"
            )
        offsets = self.offsets
        if offsets is not None:
            return offsets[first], offsets[last] if last < self.entries else self.file_bytes
        return self._walk_to(first), self._walk_to(last)

    def _sealed(self) -> SparseIndex:
        sparse = self.sparse
        if sparse is None:  # set before offsets is cleared and kept when they are loaded again
            raise NoSuchEntryError(f"ledger {self.ledger_id} has no offset index")
        return sparse

    def _walk_to(self, entry_id: int) -> int:
        """The offset of record ``entry_id`` (the file's end for ``entries``) of a sealed ledger."""
        if entry_id >= self.entries:
            return self.file_bytes
        sparse = self._sealed()
        anchor, start = sparse.at_or_before(entry_id)
        if anchor == entry_id:
            return start
        end = sparse.end_at_or_after(entry_id + 1)
        try:
            fd = self.io.open(self.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise NoSuchEntryError(f"ledger {self.ledger_id} was trimmed") from exc
        try:
            chunk = self.io.read_all(fd, end - start, start)
        finally:
            self.io.close(fd)
        return start + skip_records(
            chunk, anchor, entry_id - anchor, ledger_id=self.ledger_id, path=self.path, base_offset=start
        )

    def begin_read(self) -> None:
        """Pin the read fd while a read runs on a thread (trim closes it only after).

        Called on the event loop, so the fd is opened exactly once (opening an existing file is quick).
        """
        if self._read_fd < 0 and not self.retired:
            self._read_fd = self.io.open(self.path, os.O_RDONLY)
        self._readers += 1

    def end_read(self) -> None:
        self._readers -= 1
        if self.retired and self._readers == 0:
            self._close_read_fd()

    def retire(self) -> None:
        self.retired = True
        self.close_for_writes()
        if self._readers == 0:
            self._close_read_fd()

    def close(self) -> None:
        self.close_for_writes()
        self._close_read_fd()

    def _close_read_fd(self) -> None:
        if self._read_fd >= 0:
            self.io.close(self._read_fd)
            self._read_fd = -1


class GroupWriteFailed(Exception):
    """A group write failed; carries the cause and whether cutting it back failed too."""

    def __init__(self, cause: OSError, cut_failure: OSError | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.cut_failure = cut_failure
