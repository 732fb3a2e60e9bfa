"""When this process's group commits run, published in a shared page for the offload read-back worker.

Why: with a filesystem tier on the ledgers' disk, the read-back worker's tier slices (a 32 KiB write and
its fdatasync, with an ext4 journal commit since the object grows) and the group commits' fdatasyncs
share one device queue and one journal. A group commit that starts while a tier slice is being synced
waits for it (issue 13: 99 % of the slow group commits overlapped a tier write; producers' p99 2.3-2.5x
with streaming on). The worker cannot see the ledgers' threads, so the ledger process publishes two
numbers in a page of shared memory (a memfd handed to the worker at its start): how many group commits
are in flight, and when the last one ended (CLOCK_MONOTONIC ns, the same clock in every process). The
worker starts a tier slice only when none is in flight and one just ended (the gap before the next
commit is then longest) or none ran for a while; it waits at most ``MAX_WAIT_NS`` per slice, so offload
still progresses under constant commits, with a page that stopped changing, or without a page at all.

The page is advice only: nothing durable depends on it, a stale or garbled page costs at most the
bounded wait. Layout (native byte order, one writer process): in-flight count u64, last end ns u64.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

_PAGE = struct.Struct("=QQ")
_IN_FLIGHT = struct.Struct("=Q")
_PAGE_SIZE = mmap.PAGESIZE

# The worker's rule (see SliceGate.wait): go when no commit is in flight and the last ended at most
# FRESH_NS ago (just after a commit: the whole gap to the next one is free) or at least IDLE_NS ago
# (commits are rare now: a collision is unlikely anyway); otherwise poll every POLL_S, at most
# MAX_WAIT_NS per slice.
FRESH_NS = 300_000
IDLE_NS = 4_000_000
MAX_WAIT_NS = 10_000_000
POLL_S = 0.0001


class CommitActivity:
    """The ledger process's side: group commits mark their start and end here (any thread)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("txnkeeper-commit-activity")  # close-on-exec; the worker: pass_fds
        try:
            os.ftruncate(self.fd, _PAGE_SIZE)
            self._page = mmap.mmap(self.fd, _PAGE_SIZE)
        except OSError:
            os.close(self.fd)
            raise
        self._lock = threading.Lock()  # the loop's inline writes and the pool's threads both count
        self._in_flight = 0

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1
            _IN_FLIGHT.pack_into(self._page, 0, self._in_flight)

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            _PAGE.pack_into(self._page, 0, self._in_flight, time.monotonic_ns())

    def close(self) -> None:
        self._page.close()
        os.close(self.fd)


class SliceGate:
    """The worker's side: wait for a gap between group commits before a tier slice (bounded)."""

    def __init__(self, fd: int) -> None:
        self._page = mmap.mmap(fd, _PAGE_SIZE, prot=mmap.PROT_READ)
        os.close(fd)  # the mapping keeps the page

    def read(self) -> tuple[int, int]:
        """(group commits in flight, when the last ended in CLOCK_MONOTONIC ns; 0: none yet)."""
        in_flight, last_end = _PAGE.unpack_from(self._page, 0)
        return in_flight, last_end

    def wait(self, max_wait_ns: int = MAX_WAIT_NS) -> int:
        """Block until a tier slice may start; returns how long it waited (ns)."""
        began = now = time.monotonic_ns()
        deadline = began + max_wait_ns
        while True:
            in_flight, last_end = self.read()
            if in_flight == 0 and (now - last_end <= FRESH_NS or now - last_end >= IDLE_NS):
                return now - began
            if now >= deadline:  # constant commits, a commit stuck, or a page nobody updates
                return now - began
            time.sleep(POLL_S)
            now = time.monotonic_ns()


_shared: dict[str, CommitActivity | None] = {}
_shared_lock = threading.Lock()


def shared() -> CommitActivity | None:
    """This process's page (made on first use); None where memfd or mmap is unavailable (the worker
    then writes without waiting, as before)."""
    with _shared_lock:
        if "page" not in _shared:
            try:
                _shared["page"] = CommitActivity()
            except (AttributeError, OSError):
                _shared["page"] = None
        return _shared["page"]


def current() -> CommitActivity | None:
    """The page if one was made (a worker was started), else None: commits then publish nothing."""
    return _shared.get("page")


def _forget_after_fork() -> None:
    _shared.clear()  # a forked child's commits are its own; its worker gets a page of its own


os.register_at_fork(after_in_child=_forget_after_fork)
