"""The acknowledged-entry watermark: the newest entry of a managed ledger known to be durable.

Why it exists: a ledger file's records only prove what is in the file. A file cut exactly on a record
boundary (a bad restore, a filesystem losing a tail) or a ledger file that vanished looks like a log
that simply had fewer entries, and acknowledged entries would be lost in silence; on a pending-ack log
that redelivers messages acked in committed transactions. Closed ledgers have their entry count in the
metadata; the ledger being written has only this watermark, kept in its own small file because it
moves with every group commit while meta.json changes only at rollover and trim.

File ``watermark`` in the managed ledger's directory: 256 bytes, two 128-byte slots. A slot is
magic b"TKWM", u16 version 1, u16 kind 0, u64 sequence, i64 ledger id + i64 entry id of the newest
*confirmed* (fsynced) entry, i64 ledger id + i64 entry id of the newest *written* entry, the 16-byte
boot id of the machine that wrote the slot (-1/-1: none), then u32 CRC32 of those 64 bytes and zero
padding; little-endian. Write n goes to slot n % 2, in place, so a torn write damages at most the slot
being written and the other one still holds the previous value. The file is created whole (temp file,
fsync, rename), so any other size, two bad slots, or a slot with a good checksum but a version or kind
this build does not know is refused, never guessed at.

Two values, because two kinds of crash lose different things:
- *written*: every group commit records its last entry here with a plain pwrite, on the thread
  writing the group (a pool thread, or the loop's for an inline write, ledger/writer.py),
  after the group's data pwrite returned and before its fsync (no fsync of its own, so it costs an
  acknowledgement nothing). A process crash (SIGKILL, OOM kill) loses nothing the kernel already has,
  so on the same boot every written entry must still be in the file: a shorter file is corruption,
  refused, even for the very last group. A group whose write fails rolls the value back before its
  data is cut.
- *confirmed*: a value written only after the entry it names was fsynced, by a write (pwrite + its own
  fdatasync) that runs on the I/O pool alongside later groups' data: one in flight, always carrying
  the newest value, and started at most once per ``CONFIRM_INTERVAL_S`` (a value that arrives sooner
  waits on a timer for the rest of the interval; a failure is logged and retried with the next
  group). Close writes the final value and waits for it. After a power loss or kernel crash (the boot
  id differs) only this value is trusted: it is at or behind the durable data, so it never causes a
  false refusal; it lags by one confirmed write, at most about ``CONFIRM_INTERVAL_S`` plus one
  fdatasync. The interval is there because one write per group was one more hand-off to the pool
  per group commit, a wake-up of another thread for every append at one append in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from . import io_stats
from .errors import CorruptMetadataError
from .fileio import FileIO
from .position import Position

log = logging.getLogger(__name__)

WATERMARK_FILE = "watermark"
WATERMARK_MAGIC = b"TKWM"
WATERMARK_VERSION = 1
WATERMARK_KIND = 0
_SLOT_BODY = struct.Struct("<4sHHQqqqq16s")
_SLOT_CRC = struct.Struct("<I")
SLOT_SIZE = 128
_NO_BOOT = bytes(16)
FILE_SIZE = 2 * SLOT_SIZE
_PADDING = bytes(SLOT_SIZE - _SLOT_BODY.size - _SLOT_CRC.size)
# Confirmed writes start at most this often (seconds); see the module docstring.
CONFIRM_INTERVAL_S = 0.02


def current_boot_id() -> bytes:
    """This boot of the machine (Linux's random boot id); all zeros, which never matches, if unknown."""
    try:
        return uuid.UUID(Path("/proc/sys/kernel/random/boot_id").read_text().strip()).bytes
    except (OSError, ValueError):
        return _NO_BOOT


@dataclass(frozen=True)
class WatermarkState:
    sequence: int
    confirmed: Position | None  # newest fsynced entry; None: nothing recorded yet
    written: Position | None = None  # newest entry whose data pwrite returned (same boot only)
    boot_id: bytes = _NO_BOOT

    def vouched(self, boot_id: bytes) -> Position | None:
        """The newest entry the ledger must still hold, seen from a process running on ``boot_id``."""
        if self.written is not None and boot_id == self.boot_id and boot_id != _NO_BOOT:
            return max(self.written, self.confirmed) if self.confirmed is not None else self.written
        return self.confirmed

    def entry_in(self, ledger_id: int, boot_id: bytes) -> int | None:
        """The newest entry id the ledger ``ledger_id`` must hold (None: the watermark names none there)."""
        floor = self.vouched(boot_id)
        if floor is None or floor.ledger_id != ledger_id:
            return None
        return floor.entry_id


def encode_slot(
    sequence: int, confirmed: Position | None, written: Position | None = None, boot_id: bytes = _NO_BOOT
) -> bytes:
    c_ledger, c_entry = confirmed if confirmed is not None else (-1, -1)
    w_ledger, w_entry = written if written is not None else (-1, -1)
    body = _SLOT_BODY.pack(
        WATERMARK_MAGIC,
        WATERMARK_VERSION,
        WATERMARK_KIND,
        sequence,
        c_ledger,
        c_entry,
        w_ledger,
        w_entry,
        boot_id,
    )
    return body + _SLOT_CRC.pack(zlib.crc32(body)) + _PADDING


def _refuse(path: Path, reason: str) -> CorruptMetadataError:
    return CorruptMetadataError(
        path,
        f"{reason}; this file records the last acknowledged entry. Restore the volume from a backup or "
        "replica; deleting the file skips the shortened-log check once (it is rebuilt on open)",
    )


def decode_watermark(raw: bytes, path: Path) -> WatermarkState:
    if len(raw) != FILE_SIZE:
        raise _refuse(path, f"it is {len(raw)} bytes long, a watermark file is {FILE_SIZE}")
    best: WatermarkState | None = None
    damaged: list[str] = []
    for slot in range(2):
        start = slot * SLOT_SIZE
        body = raw[start : start + _SLOT_BODY.size]
        (crc,) = _SLOT_CRC.unpack_from(raw, start + _SLOT_BODY.size)
        magic, version, kind, sequence, ledger_id, entry_id, w_ledger, w_entry, boot_id = _SLOT_BODY.unpack(
            body
        )
        if magic != WATERMARK_MAGIC or zlib.crc32(body) != crc:
            damaged.append(f"slot {slot} at offset {start} fails its checksum")
            continue
        if version != WATERMARK_VERSION or kind != WATERMARK_KIND:
            raise _refuse(
                path,
                f"slot {slot} has format version {version} kind {kind}; this build reads version "
                f"{WATERMARK_VERSION} kind {WATERMARK_KIND} only (written by a newer txnkeeper?)",
            )
        confirmed = None if ledger_id < 0 else Position(ledger_id, entry_id)
        written = None if w_ledger < 0 else Position(w_ledger, w_entry)
        if best is None or sequence > best.sequence:
            best = WatermarkState(sequence, confirmed, written, boot_id)
    if best is None:
        raise _refuse(path, " and ".join(damaged))
    return best


def load_watermark(io: FileIO, directory: Path) -> WatermarkState | None:
    """Read the watermark (opened read-only); None if the directory has none yet. Blocking."""
    path = directory / WATERMARK_FILE
    try:
        fd = io.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = io.read_all(fd, FILE_SIZE + 1, 0)
    finally:
        io.close(fd)
    return decode_watermark(raw, path)


class WatermarkFile:
    """The open watermark file of a managed ledger being written. Blocking methods run on the
    executor, except ``mark_written``/``unmark_written`` inside an inline group write (on the loop).

    Two threads write it (the thread writing a group marks what it wrote, the pool confirms what was
    fsynced), so the slot sequence and both values change under one lock.
    """

    def __init__(self, io: FileIO, directory: Path, state: WatermarkState) -> None:
        self.io = io
        self.path = directory / WATERMARK_FILE
        self.boot_id = current_boot_id()
        self.sequence = state.sequence
        self.confirmed = state.confirmed
        # What an earlier process of this boot wrote is still vouched for until the next write
        self.written = state.written if state.boot_id == self.boot_id else None
        self._lock = threading.Lock()
        self._fd = io.open(self.path, os.O_RDWR)

    @classmethod
    def create(cls, io: FileIO, directory: Path, confirmed: Position | None) -> WatermarkFile:
        """Write a new file whole (both slots) atomically; ``confirmed`` must already be durable."""
        io.write_file_atomically(directory / WATERMARK_FILE, encode_slot(0, confirmed) * 2)
        return cls(io, directory, WatermarkState(0, confirmed))

    def _put(self, confirmed: Position | None, written: Position | None) -> None:
        """Write the next slot (caller holds the lock); the state moves only once the write returned."""
        sequence = self.sequence + 1
        slot = encode_slot(sequence, confirmed, written, self.boot_id)
        self.io.pwrite_all(self._fd, slot, (sequence % 2) * SLOT_SIZE)
        # Only now: after a failed write the next attempt goes to the same (damaged) slot again and
        # the other slot keeps the last good value.
        self.sequence = sequence
        self.confirmed = confirmed
        self.written = written

    def write(self, confirmed: Position) -> None:
        """Record ``confirmed`` (already fsynced) in the older slot and make it durable."""
        with self._lock:
            self._put(confirmed, self.written)
        self.io.sync_data(self._fd)

    def mark_written(self, written: Position) -> Position | None:
        """Record that ``written``'s data pwrite returned (no fsync); returns the value it replaced."""
        with self._lock:
            previous = self.written
            self._put(self.confirmed, written)
        return previous

    def unmark_written(self, previous: Position | None) -> None:
        """A marked group's write failed and is being cut: vouch again only for what came before."""
        with self._lock:
            self._put(self.confirmed, previous)

    def close(self) -> None:
        if self._fd >= 0:
            self.io.close(self._fd)
            self._fd = -1


class WatermarkKeeper:
    """Moves the watermark behind the group commit without ever delaying an acknowledgement."""

    def __init__(
        self,
        file: WatermarkFile,
        executor: Executor,
        *,
        name: str,
        enabled: bool,
        interval_s: float = CONFIRM_INTERVAL_S,
    ) -> None:
        self._file = file
        self._executor = executor
        self._name = name
        self._enabled = enabled  # False with fsync off: data that is never synced must not be vouched for
        self._interval = interval_s
        self._latest = file.confirmed
        self._in_flight: asyncio.Future[None] | None = None
        self._settled = asyncio.Event()  # no write in flight
        self._settled.set()
        self._failing = False
        self._last_start = -interval_s  # loop time the last confirmed write started
        self._timer: asyncio.TimerHandle | None = None  # a write waiting for the interval to pass

    def mark_written(self, ledger_id: int, entry_id: int) -> Callable[[], None] | None:
        """On the group's writing thread, after its data pwrite: vouch for it (no fsync); returns the undo.

        A failed mark is logged and leaves the previous value: the group is still acknowledged once
        fsynced, only the shortened-log check covers a little less until the next mark.
        """
        if not self._enabled:
            return None
        file = self._file
        try:
            previous = file.mark_written(Position(ledger_id, entry_id))
        except OSError as exc:
            io_stats.WATERMARK.failed("mark")
            log.warning("managed ledger %s: could not mark the watermark %s: %s", self._name, file.path, exc)
            return None

        def undo() -> None:
            try:
                file.unmark_written(previous)
            except OSError as exc:
                log.error(
                    "managed ledger %s: could not take back the watermark of a failed write (%s): %s; if "
                    "this process dies before its ledger is reopened, the next open refuses the shortened "
                    "ledger and the watermark %s must be deleted by hand",
                    self._name,
                    Position(ledger_id, entry_id),
                    exc,
                    file.path,
                )

        return undo

    def note(self, ledger_id: int, entry_id: int) -> None:
        """Entry ``ledger_id:entry_id`` (and everything before it) is durable now. On the loop."""
        if not self._enabled:
            return
        self._latest = Position(ledger_id, entry_id)
        if self._in_flight is None and self._timer is None:
            self._schedule()

    def _schedule(self) -> None:
        # Start the write now if the interval since the last one passed, else when it has.
        loop = asyncio.get_running_loop()
        wait = self._last_start + self._interval - loop.time()
        if wait <= 0:
            self._start()
        else:
            self._timer = loop.call_later(wait, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        if self._in_flight is None and self._latest != self._file.confirmed:
            self._start()

    def _start(self) -> None:
        target = self._latest
        assert target is not None
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        future = loop.run_in_executor(self._executor, self._file.write, target)
        self._in_flight = future
        self._settled.clear()
        future.add_done_callback(lambda done: self._written(done, target))

    def _written(self, future: asyncio.Future[None], target: Position) -> None:
        self._in_flight = None
        self._settled.set()
        exc = None if future.cancelled() else future.exception()
        if exc is not None or future.cancelled():
            io_stats.WATERMARK.failed("confirm")
            if not self._failing:  # once per failure spell: the next group retries
                log.warning(
                    "managed ledger %s: could not update the watermark %s: %s; appends are unaffected, "
                    "the watermark lags until a later write succeeds",
                    self._name,
                    self._file.path,
                    exc,
                )
            self._failing = True
            return
        self._failing = False
        io_stats.WATERMARK.wrote()
        if self._latest != target and self._timer is None:
            self._schedule()

    async def close(self) -> None:
        """Write the newest value (the ledger has drained) and close the file."""
        try:
            # A write in flight may chain one more (now or on a timer): the final write below carries
            # the newest value anyway.
            while self._in_flight is not None or self._timer is not None:
                self._cancel_timer()
                await self._settled.wait()
            if self._enabled and self._latest is not None and self._latest != self._file.confirmed:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._file.write, self._latest
                )
        except OSError as exc:
            log.warning("managed ledger %s: could not write the final watermark: %s", self._name, exc)
        finally:
            self._file.close()

    def release(self) -> None:
        """Close the file if close() could not run to the end (never under a write in flight)."""
        self._cancel_timer()
        if self._in_flight is None:
            self._file.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
