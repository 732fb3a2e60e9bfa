"""The pod's periodic heap trim (server/heap_trimmer.py) gives a fragmented heap's free pages back."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_waits import wait_until

from txnkeeper import memtrim
from txnkeeper.server.heap_trimmer import HeapTrimmer

pytestmark = pytest.mark.skipif(memtrim.heap_usage() is None, reason="glibc's mallinfo2/malloc_trim needed")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_fragmented_heap_is_trimmed_only_when_enough_is_free() -> None:
    # 1 KB objects (over pymalloc's 512 bytes, so glibc's), every 16th kept: the freed ones leave
    # whole free pages between live chunks, which glibc keeps until a trim.
    objects = [bytes([i % 256]) * 1000 + bytes(i % 7) for i in range(80_000)]
    kept = objects[::16]
    del objects
    usage = memtrim.heap_usage()
    assert usage is not None and usage.free > 30 * 1024 * 1024, usage
    idle = HeapTrimmer(min_free=usage.free * 4)
    assert not idle.trim_if_worthwhile() and idle.trims == 0
    before = rss_bytes()
    trimmer = HeapTrimmer(min_free=16 * 1024 * 1024)
    assert trimmer.trim_if_worthwhile() and trimmer.trims == 1 and trimmer.seconds > 0
    after = rss_bytes()
    assert before - after > 20 * 1024 * 1024, (before, after)
    assert len(kept) == 5_000


async def test_the_timer_trims_and_stops_when_closed() -> None:
    trimmer = HeapTrimmer(interval=0.01, min_free=0)
    trimmer.start()

    async def trimmed_twice() -> bool:
        return trimmer.trims >= 2

    await wait_until(trimmed_twice, 30, "two periodic trims")
    await trimmer.close()
    assert trimmer._task is None
