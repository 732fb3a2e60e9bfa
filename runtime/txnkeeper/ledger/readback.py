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

Wire format (little-endian): request = ledger_id u64, first entry u64, count u64, start u64, end u64,
path length u16, path bytes; response = status u8, body length u64, body. Status 0: the framed entries;
1: a corrupt record (entry id i64, file offset i64, reason); 2: an OSError (errno i32, message).
"""

from __future__ import annotations

import atexit
import contextlib
import errno as errno_codes
import os
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path
from typing import IO

from .entry_format import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_PREFIX
from .errors import CorruptEntryError
from .offload import timeline

_REQUEST = struct.Struct("<QQQQQH")
_RESPONSE = struct.Struct("<BQ")
_CORRUPT = struct.Struct("<qq")
_OS_ERROR = struct.Struct("<i")
_BLOCK_ENTRY_HEADER = struct.Struct(">iq")  # offload.block framing: entry_len, entry_id (Pulsar's)
_OK, _CORRUPT_STATUS, _OS_ERROR_STATUS = 0, 1, 2
_WORKER_CODE = "from txnkeeper.ledger.readback import serve; serve()"


class ReadBackWorkerDied(OSError):
    """The read-back worker process died or broke the protocol mid-call (the call's data is lost)."""


class _Corrupt(Exception):
    def __init__(self, entry_id: int, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.entry_id, self.offset, self.reason = entry_id, offset, reason


def frame_records(chunk: bytes | bytearray, first_entry_id: int, count: int) -> bytearray:
    """Check ``count`` consecutive records read from a ledger file and frame their data for a block.

    Checks what ``entry_format.decode_records`` checks; raises ``_Corrupt`` at the first bad record.
    Slices are memoryviews: no per-entry bytes object is made.
    """
    out = bytearray()
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
    return out


def _answer(request: bytes, path: str) -> tuple[int, bytes | bytearray]:
    _ledger_id, first, count, start, end, _ = _REQUEST.unpack(request)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            chunk = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
    except OSError as exc:
        return _OS_ERROR_STATUS, _OS_ERROR.pack(exc.errno or 0) + str(exc).encode()
    try:
        return _OK, frame_records(chunk, first, count)
    except _Corrupt as bad:
        return _CORRUPT_STATUS, _CORRUPT.pack(bad.entry_id, start + bad.offset) + bad.reason.encode()


def serve(stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None) -> None:
    """The worker's loop: one request at a time until stdin closes (the ledger process is gone)."""
    source = stdin or sys.stdin.buffer
    sink = stdout or sys.stdout.buffer
    while True:
        request = source.read(_REQUEST.size)
        if len(request) < _REQUEST.size:
            return
        path_len = _REQUEST.unpack(request)[5]
        path = source.read(path_len).decode()
        status, body = _answer(request, path)
        sink.write(_RESPONSE.pack(status, len(body)))
        sink.write(body)
        sink.flush()


class ReadBackWorker:
    """The client: one worker process, one call at a time (callers block on a thread, not the loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

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

    def frame(self, path: Path, ledger_id: int, first: int, count: int, *, start: int, end: int) -> bytearray:
        """Entries ``first``..``first+count-1`` of the ledger file at ``path`` (their records span
        ``start``..``end``, all durable), checked and block-framed. Blocking: call it on a thread.

        Raises CorruptEntryError (naming file, entry and offset) for a bad record, the worker's OSError
        for a failed read, and ReadBackWorkerDied when the worker dies mid-call.
        """
        name = os.fsencode(path)
        request = _REQUEST.pack(ledger_id, first, count, start, end, len(name)) + name
        started = timeline.now()
        with self._lock:
            proc = self._started()
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
                    f"the offload read-back worker (pid {proc.pid}) died (exit status {code}) while reading "
                    f"entries {ledger_id}:{first}..{first + count - 1} from {path} ({exc}); nothing was "
                    "lost: the streaming segment is marked Failed and retried with a new worker",
                ) from exc
        timeline.span("worker", started)
        if status == _OK:
            return body
        if status == _CORRUPT_STATUS:
            entry_id, offset = _CORRUPT.unpack_from(body, 0)
            reason = bytes(body[_CORRUPT.size :]).decode()
            raise CorruptEntryError(ledger_id, entry_id, path, offset, reason)
        if status == _OS_ERROR_STATUS:
            (code,) = _OS_ERROR.unpack_from(body, 0)
            raise OSError(code, f"offload read-back of {path}: {bytes(body[_OS_ERROR.size :]).decode()}")
        self._discard()
        raise ReadBackWorkerDied(errno_codes.EPROTO, f"the offload read-back worker answered status {status}")

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._discard()
            # -I: the worker imports only this installed package and the standard library.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _WORKER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
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
