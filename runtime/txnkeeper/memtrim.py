"""Give the C heap's free memory back to the operating system (glibc's ``malloc_trim``).

Why: CPython allocates every object over 512 bytes (a message payload, an encoded frame, a transport's
write buffer) with the C library's malloc. When a connection that held tens of MiB of such objects is
cut, they are freed, but glibc keeps the freed pages inside its heaps: the process's resident set
stays where it peaked. ``malloc_trim(0)`` hands the free pages back (it releases whole free pages in
the middle of its heaps too, not only the top). Measured on a store pod after cutting 32 consumers
that never read (docs/contracts.md §6): see there.

Only glibc has it; elsewhere (musl, macOS) ``trim`` does nothing and says so by returning False.
``heap_usage`` reads glibc's own account of its heaps (``mallinfo2``): what is in use and what is
free but kept, the figures that tell growth of live objects from fragmentation (a metric of every pod).

``apply_policy`` fixes how glibc places large allocations, for the whole process, at start. By default
glibc's mmap threshold is *dynamic*: each time a chunk it had mapped on its own (128 KiB or more) is
freed, the threshold rises to that chunk's size (up to 32 MiB), so from then on buffers of that size (a
transaction-buffer snapshot, a batch of entries read for a consumer, a grown dict's table) are carved
out of the heap and, once freed, leave holes that later small objects pin. Under the memory soak's
transactions (500 txn/s) a store's heap held ~80 MiB free beside ~45 MiB in use, and RSS kept
climbing; with the threshold fixed at 128 KiB (large chunks mapped and unmapped on their own, as
before the first one is freed) and at most two arenas (the ledger's I/O threads and the executor's
otherwise get one each), it held ~18 MiB free and RSS stayed ~25 MiB lower (docs/performance.md).
``TXNKEEPER_MALLOC_POLICY=glibc`` leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txnkeeper.contract.settings.interpreter import MALLOC_POLICIES


def _libc_function(name: str, argtypes: list[Any], restype: Any) -> Any | None:
    """glibc's function ``name`` typed as given, or None where it is missing (not Linux, not glibc, an
    older glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library the interpreter itself runs on
    except OSError:
        return None
    function = getattr(libc, name, None)
    if function is None:
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


_MALLOC_TRIM: Callable[[int], int] | None = _libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes the heaps took from the system with brk/mmap (not mmapped chunks)
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in chunks mmapped one by one (large allocations)
            "usmblks",
            "fsmblks",  # bytes in free fastbin chunks
            "uordblks",  # bytes in use in the heaps
            "fordblks",  # bytes free in the heaps
            "keepcost",
        )
    ]


_MALLINFO2: Callable[[], _MallInfo2] | None = _libc_function("mallinfo2", [], _MallInfo2)  # glibc >= 2.33


@dataclass(frozen=True)
class HeapUsage:
    """What glibc's heaps hold (all arenas): ``free`` is memory freed by the program that the heap keeps
    between live chunks, which a trim returns only where whole pages are free (fragmentation)."""

    in_use: int
    free: int
    mmapped: int  # large chunks, each its own mapping: returned to the system when freed


# mallopt(3) parameters (malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024
ARENA_MAX = 2
POLICIES = MALLOC_POLICIES  # declared with the flag (contract/settings/interpreter.py)


_MALLOPT: Callable[[int, int], int] | None = _libc_function(
    "mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int
)


def check_policy(name: str) -> str:
    """``name`` if it is a known heap policy; else ValueError saying which there are."""
    if name not in POLICIES:
        raise ValueError(
            f"malloc policy {name!r} is unknown: 'fixed' (large allocations mapped on their own from "
            f"{MMAP_THRESHOLD // 1024} KiB, {ARENA_MAX} arenas) or 'glibc' (glibc's own defaults)"
        )
    return name


def apply_policy(name: str) -> bool:
    """Set the process's heap policy (call it at start, before threads); True if glibc took it."""
    if check_policy(name) == "glibc" or _MALLOPT is None:
        return False
    # mallopt answers 1 on success; setting the threshold also stops glibc from raising it.
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(_MALLOPT(_M_ARENA_MAX, ARENA_MAX))


def heap_usage() -> HeapUsage | None:
    """The C heap's bytes in use, free and mmapped, or None where glibc's ``mallinfo2`` is missing."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return HeapUsage(in_use=info.uordblks, free=info.fordblks + info.fsmblks, mmapped=info.hblkhd)


def available() -> bool:
    return _MALLOC_TRIM is not None


def trim() -> bool:
    """Return the heap's free pages to the operating system; True if glibc released any."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))
