"""Hand the C heap's free pages back to the operating system now and then, while a pod runs.

Why: a store's steady traffic frees as much as it allocates, but not in place: transaction-buffer
snapshots, consumers' read batches and grown tables leave free chunks between live ones, and glibc keeps
the pages under them. In the hour-long memory soak a store's heap held 15-25 MB more free memory at the
end than at the 10-minute mark at the same memory in use, and its resident set grew by as much
(docs/performance.md). ``malloc_trim`` releases every whole free page, in the middle of a heap too; the
connection table already calls it after a large cut (protocol/server.py), this does it on a timer when
glibc reports enough free memory to be worth a call.

The trim runs in a worker thread (it gives up the GIL; on a heap of a few hundred MB it takes a few ms to
tens of ms, under glibc's arena lock) at most every ``INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from txnkeeper import memtrim

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
# Free heap memory below this is left alone: a trim would return little, and the next burst of
# allocations would take it back from the system anyway.
MIN_FREE_BYTES = 8 * 1024 * 1024


class HeapTrimmer:
    """The timer; ``trims`` and ``seconds`` count what it did (the pod's metrics)."""

    def __init__(self, interval: float = INTERVAL_S, min_free: int = MIN_FREE_BYTES) -> None:
        self.interval = interval
        self.min_free = min_free
        self.trims = 0
        self.seconds = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if memtrim.available() and memtrim.heap_usage() is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.trim_if_worthwhile)
            except OSError as exc:  # ctypes reports a failed call this way; the next round tries again
                log.warning("returning free heap memory to the OS failed: %s", exc)

    def trim_if_worthwhile(self) -> bool:
        """Trim if the heap holds at least ``min_free`` free bytes; whether it did."""
        usage = memtrim.heap_usage()
        if usage is None or usage.free < self.min_free:
            return False
        started = time.monotonic()
        memtrim.trim()
        self.seconds += time.monotonic() - started
        self.trims += 1
        return True
