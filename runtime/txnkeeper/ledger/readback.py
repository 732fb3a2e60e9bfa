"""Streaming offload's read-back in a worker process: durable records in, checked and block-framed out.

Why a process: streaming offload reads back every entry the producers write, checks both CRCs of each
record and frames it for a PIP-76 block. Done on a thread, that per-entry Python work held the GIL for
hundreds of microseconds at a time while the event loop and the group-commit threads (returning from
fdatasync) waited for it, and producers' p99 latency grew 5-7x with streaming on (docs/performance.md,
issue 13). The worker does that work on its own interpreter; the managed ledger's process only blocks
in pipe reads (GIL released) and gets one buffer per batch.

What stays in the ledger process: which byte range is durable (the confirmed offsets after fsync) and
every metadata decision. The worker opens the ledger file itself, preads exactly that range, checks each
record as the read path does (``entry_format.decode_records``: header CRC, entry id, length, data CRC)
and returns the entries framed as in a streaming block (``offload.block.frame_entry``), or refuses,
naming the entry and byte offset: corruption is never framed. A worker that dies (killed, out of
memory) fails the call with ``ReadBackWorkerDied``, an OSError, so the offloader marks the segment
Failed and retries it as for a store error; the next call starts a new worker. The worker exits when
its stdin closes, so a killed ledger process leaves no worker behind.

Staged blocks (the filesystem tier): framed entries returned over the pipe still cost the ledger
process a copy per batch, a multi-MiB block seal and the tier writes with their fdatasyncs, all beside
its producers (issue 13: the slowest appends coincided with block uploads). So the worker can also keep
a block: ``stage`` frames the entries into a block the worker holds (nothing comes back), and
``write_block`` seals it (header, padding, CRC), writes it at a given offset of the upload's temporary
file, fdatasyncs it in slices and answers only (CRC, length). The ledger process keeps every decision
and the upload's visibility (its fsync, rename and directory fsync on complete): an upload's bytes are
durable before the writer records the block, and the object appears only once complete. A staged block
lives only in the worker that built it: block ids are never reused, and a call for a block held by a
worker that has since been replaced raises ``StagedBlockLost`` before anything is sent (the writer
stages the block again from the local files); a worker dying during a call fails it as above.

Each tier slice (write + fdatasync) starts in a gap between the ledger process's group commits: that
process publishes them in a shared page (``commit_activity``, a memfd passed to the worker at its
start; the worker's argument is its descriptor), and the worker waits, at most 10 ms per slice, until
none is in flight and one just ended. Without the page the worker writes without waiting.

The worker runs at SCHED_IDLE where Linux allows it (unprivileged), else as it is: it then gets a core
only when the ledger's threads do not want it, so a group commit returning from fdatasync never waits
for read-back work. Offload lags under full CPU load rather than slowing producers (PIP-76's rule).

Wire format (little-endian): request = op u8, block u64, ledger_id u64, first entry u64, count u64,
start u64, end u64, path length u16, path bytes (``write_block``: first = the block's first entry id,
count = its minimum size, start = the file offset, end = the fdatasync slice size or 0); response =
status u8, body length u64, body.
Status 0: the framed entries (``frame``), nothing (``stage``, ``drop``), or CRC u32 + length u64
(``write_block``); 1: a corrupt record (entry id i64, file offset i64, reason); 2: an OSError (errno
i32, message).
"""

from __future__ import annotations

import atexit
import contextlib
import errno as errno_codes
import itertools
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

from . import commit_activity
from .commit_activity import SliceGate
from .entry_format import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_PREFIX
from .errors import CorruptEntryError
from .offload import timeline
from .offload.block import HEADER_SIZE, seal_block
from .offload.errors import StagedBlockLost
from .offload.filesystem import WRITE_SLICE_BYTES, write_synced

_REQUEST = struct.Struct("<BQQQQQQH")
_RESPONSE = struct.Struct("<BQ")
_CORRUPT = struct.Struct("<qq")
_OS_ERROR = struct.Struct("<i")
_WRITTEN = struct.Struct("<IQ")
_BLOCK_ENTRY_HEADER = struct.Struct(">iq")  # offload.block framing: entry_len, entry_id (Pulsar's)
_OK, _CORRUPT_STATUS, _OS_ERROR_STATUS = 0, 1, 2
_FRAME, _STAGE, _WRITE, _DROP = 0, 1, 2, 3
_WORKER_CODE = (
    "import sys; from txnkeeper.ledger.readback import run_when_idle, serve; run_when_idle(); "
    "serve(commit_page_fd=int(sys.argv[1]) if len(sys.argv) > 1 else None)"
)


class ReadBackWorkerDied(OSError):
    """The read-back worker process died or broke the protocol mid-call (the call's data is lost)."""


class _Corrupt(Exception):
    def __init__(self, entry_id: int, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.entry_id, self.offset, self.reason = entry_id, offset, reason


def frame_records(
    chunk: bytes | bytearray, first_entry_id: int, count: int, out: bytearray | None = None
) -> bytearray:
    """Check ``count`` consecutive records read from a ledger file and frame their data for a block,
    appended to ``out`` (a new buffer if None), which is returned.

    Checks what ``entry_format.decode_records`` checks; raises ``_Corrupt`` at the first bad record,
    having appended nothing. Slices are memoryviews: no per-entry bytes object is made.
    """
    if out is None:
        out = bytearray()
    mark = len(out)
    try:
        _frame_into(out, chunk, first_entry_id, count)
    except _Corrupt:
        del out[mark:]  # a staged block keeps only whole, checked batches
        raise
    return out


def _frame_into(out: bytearray, chunk: bytes | bytearray, first_entry_id: int, count: int) -> None:
    view = memoryview(chunk)
    unpack = RECORD_HEADER.unpack_from
    pack = _BLOCK_ENTRY_HEADER.pack
    crc32 = zlib.crc32
    prefix = RECORD_PREFIX.size
    size = len(chunk)
    pos = 0
    for entry_id in range(first_entry_id, first_entry_id + count):
        if size - pos < RECORD_HEADER_SIZE:
            raise _Corrupt(entry_id, pos, "record cut short")
        length, stored_id, data_crc, header_crc = unpack(chunk, pos)
        if crc32(view[pos : pos + prefix]) != header_crc or stored_id != entry_id:
            raise _Corrupt(entry_id, pos, "bad record header (checksum or entry id)")
        start = pos + RECORD_HEADER_SIZE
        end = start + length
        if end > size or crc32(view[start:end]) != data_crc:
            raise _Corrupt(entry_id, pos, "bad data checksum")
        out += pack(length, entry_id)
        out += view[start:end]
        pos = end


def _os_error(exc: OSError) -> tuple[int, bytes]:
    return _OS_ERROR_STATUS, _OS_ERROR.pack(exc.errno or 0) + str(exc).encode()


def _answer(
    request: bytes, path: str, blocks: dict[int, bytearray], gate: SliceGate | None = None
) -> tuple[int, bytes | bytearray]:
    """One request against the blocks this worker holds (``blocks``: staged block id -> its bytes);
    ``gate``: the ledger process's group commits, which tier slices keep clear of."""
    op, block, _ledger_id, first, count, start, end, _ = _REQUEST.unpack(request)
    if op == _DROP:
        blocks.pop(block, None)
        return _OK, b""
    if op == _WRITE:
        staged = blocks.pop(block, None)
        if staged is None:
            return _os_error(OSError(errno_codes.ENOENT, f"no staged block {block} in this worker"))
        try:
            crc = seal_block(_ledger_id, first, staged, count)
            fd = os.open(path, os.O_WRONLY)  # the ledger process created the upload's file
            try:
                write_synced(fd, staged, start, end or WRITE_SLICE_BYTES, None if gate is None else gate.wait)
            finally:
                os.close(fd)
        except OSError as exc:
            return _os_error(exc)
        return _OK, _WRITTEN.pack(crc, len(staged))
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            chunk = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
    except OSError as exc:
        return _os_error(exc)
    try:
        if op == _STAGE:
            frame_records(chunk, first, count, blocks.setdefault(block, bytearray(HEADER_SIZE)))
            return _OK, b""
        return _OK, frame_records(chunk, first, count)
    except _Corrupt as bad:
        return _CORRUPT_STATUS, _CORRUPT.pack(bad.entry_id, start + bad.offset) + bad.reason.encode()


def run_when_idle(set_scheduler: Callable[[], None] | None = None) -> bool:
    """Put this process at SCHED_IDLE (Linux; no privilege needed); False, silently, where the
    platform or its policy does not allow it (the worker then runs at its normal priority)."""
    try:
        if set_scheduler is not None:
            set_scheduler()
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def serve(
    stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None, commit_page_fd: int | None = None
) -> None:
    """The worker's loop: one request at a time until stdin closes (the ledger process is gone).
    ``commit_page_fd``: the ledger process's ``commit_activity`` page (None: tier slices never wait)."""
    source = stdin or sys.stdin.buffer
    sink = stdout or sys.stdout.buffer
    blocks: dict[int, bytearray] = {}
    gate = None
    if commit_page_fd is not None:
        try:
            gate = SliceGate(commit_page_fd)
        except (OSError, ValueError):
            gate = None  # advice only: write without waiting
    while True:
        request = source.read(_REQUEST.size)
        if len(request) < _REQUEST.size:
            return
        path_len = _REQUEST.unpack(request)[7]
        path = source.read(path_len).decode()
        status, body = _answer(request, path, blocks, gate)
        sink.write(_RESPONSE.pack(status, len(body)))
        sink.write(body)
        sink.flush()


class ReadBackWorker:
    """The client: one worker process, one call at a time (callers block on a thread, not the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._generation = 0  # how many worker processes this client started
        self._block_ids = itertools.count(1)  # never reused, across workers
        self._held_by: dict[int, int] = {}  # staged block id -> generation of the worker holding it

    @property
    def pid(self) -> int | None:
        """The running worker's pid (None: none started, or the last one died)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the worker now if none runs (blocking: call it on a thread), so that its interpreter
        start does not land in the first read-back, while producers are already appending."""
        with self._lock:
            self._started()

    def new_block(self) -> int:
        """An id for a block to stage in the worker (``frame(..., into=)``, then ``write_block``)."""
        return next(self._block_ids)

    def frame(
        self,
        path: Path,
        ledger_id: int,
        first: int,
        count: int,
        *,
        start: int,
        end: int,
        into: int | None = None,
    ) -> bytearray:
        """Entries ``first``..``first+count-1`` of the ledger file at ``path`` (their records span
        ``start``..``end``, all durable), checked and block-framed: returned, or (``into``) appended to
        that staged block in the worker and an empty buffer returned. Blocking: call it on a thread.

        Raises CorruptEntryError (naming file, entry and offset) for a bad record, the worker's OSError
        for a failed read, ReadBackWorkerDied when the worker dies mid-call, and StagedBlockLost when
        the worker holding block ``into`` was replaced.
        """
        op = _FRAME if into is None else _STAGE
        what = f"reading entries {ledger_id}:{first}..{first + count - 1} from {path}"
        status, body = self._call(op, into or 0, (ledger_id, first, count, start, end), path=path, what=what)
        if status == _CORRUPT_STATUS:
            entry_id, offset = _CORRUPT.unpack_from(body, 0)
            reason = bytes(body[_CORRUPT.size :]).decode()
            raise CorruptEntryError(ledger_id, entry_id, path, offset, reason)
        if status == _OS_ERROR_STATUS:
            (code,) = _OS_ERROR.unpack_from(body, 0)
            raise OSError(code, f"offload read-back of {path}: {bytes(body[_OS_ERROR.size :]).decode()}")
        return body

    def write_block(
        self,
        block: int,
        *,
        ledger_id: int,
        first_entry_id: int,
        min_size: int,
        path: str,
        offset: int,
        slice_bytes: int | None = None,
    ) -> tuple[int, int]:
        """Seal staged ``block`` (entries of ``ledger_id`` from ``first_entry_id``; padded to at least
        ``min_size`` bytes), write it at ``offset`` of the existing file ``path`` and fdatasync it in
        ``slice_bytes`` slices (None: the filesystem driver's); the block is then gone from the worker.
        Returns (CRC, length). Blocking: call it on a thread.

        Raises the worker's OSError for a failed write (the file then holds a partial block: the
        caller aborts the upload), ReadBackWorkerDied and StagedBlockLost as ``frame``.
        """
        what = f"writing staged block {block} (ledger {ledger_id} from entry {first_entry_id}) to {path}"
        status, body = self._call(
            _WRITE,
            block,
            (ledger_id, first_entry_id, min_size, offset, slice_bytes or 0),
            path=path,
            what=what,
        )
        self._held_by.pop(block, None)
        if status == _OS_ERROR_STATUS:
            (code,) = _OS_ERROR.unpack_from(body, 0)
            raise OSError(code, f"offload upload to {path}: {bytes(body[_OS_ERROR.size :]).decode()}")
        crc, length = _WRITTEN.unpack(body)
        return crc, length

    def drop_block(self, block: int) -> None:
        """Forget staged ``block`` (an aborted segment). Blocking; a dead worker held nothing."""
        generation = self._held_by.pop(block, None)
        with self._lock:
            if generation is None or generation != self._generation or self.pid is None:
                return
        with contextlib.suppress(ReadBackWorkerDied):
            self._call(_DROP, block, (0, 0, 0, 0, 0), path="", what=f"dropping staged block {block}")

    def _call(
        self, op: int, block: int, fields: tuple[int, int, int, int, int], *, path: Path | str, what: str
    ) -> tuple[int, bytearray]:
        """One request (``fields``: ledger id, first, count, start, end as the wire format says)."""
        name = os.fsencode(path)
        request = _REQUEST.pack(op, block, *fields, len(name)) + name
        started = timeline.now()
        with self._lock:
            proc = self._started()
            if op in (_STAGE, _WRITE):
                held = self._held_by.setdefault(block, self._generation)
                if held != self._generation:
                    self._held_by.pop(block, None)
                    raise StagedBlockLost(
                        errno_codes.EPIPE,
                        f"staged block {block} was held by a read-back worker that has since died; its "
                        "bytes are gone: stage its entries again from the local files",
                    )
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(request)
                proc.stdin.flush()
                status, length = _RESPONSE.unpack(_read_exact(proc.stdout, _RESPONSE.size))
                body = _read_exact(proc.stdout, length)
            except (OSError, EOFError) as exc:
                code = self._discard()
                raise ReadBackWorkerDied(
                    errno_codes.EPIPE,
                    f"the offload read-back worker (pid {proc.pid}) died (exit status {code}) while {what} "
                    f"({exc}); nothing was lost: the streaming segment is marked Failed and retried with "
                    "a new worker",
                ) from exc
            if status not in (_OK, _CORRUPT_STATUS, _OS_ERROR_STATUS):
                self._discard()
                raise ReadBackWorkerDied(
                    errno_codes.EPROTO, f"the offload read-back worker answered status {status}"
                )
        timeline.span("worker_upload" if op == _WRITE else "worker", started)
        return status, body

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._discard()
            self._generation += 1
            # -I: the worker imports only this installed package and the standard library.
            page = commit_activity.shared()
            command = [sys.executable, "-I", "-c", _WORKER_CODE]
            self._proc = subprocess.Popen(
                command + ([str(page.fd)] if page is not None else []),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(page.fd,) if page is not None else (),
            )
        return self._proc

    def _discard(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return code

    def close(self) -> None:
        with self._lock:
            self._discard()


def _read_exact(stream: IO[bytes], length: int) -> bytearray:
    buffer = bytearray(length)
    view = memoryview(buffer)
    got = 0
    while got < length:
        n = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise EOFError(f"worker output ended after {got} of {length} bytes")
        got += n
    return buffer


_shared: dict[str, ReadBackWorker] = {}
_shared_lock = threading.Lock()


def shared_worker() -> ReadBackWorker:
    """The process's one worker: read-back is bounded by one core whatever the number of ledgers."""
    with _shared_lock:
        return _shared.setdefault("worker", ReadBackWorker())


def _forget_after_fork() -> None:
    _shared.clear()  # a forked child must not share its parent's pipes


def _close_shared() -> None:
    for worker in _shared.values():
        worker.close()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_close_shared)
