"""Give the C heap's free memory back to the operating system (glibc's ``malloc_trim``).

Why: CPython allocates every object over 512 bytes (a message payload, an encoded frame, a transport's
write buffer) with the C library's malloc. When a connection that held tens of MiB of such objects is
cut, they are freed, but glibc keeps the freed pages inside its heaps: the process's resident set
stays where it peaked. ``malloc_trim(0)`` hands the free pages back (it releases whole free pages in
the middle of its heaps too, not only the top). Measured on a store pod after cutting 32 consumers
that never read (docs/contracts.md §6): see there.

Only glibc has it; elsewhere (musl, macOS) ``trim`` does nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _load() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library the interpreter itself runs on
    except OSError:
        return None
    function = getattr(libc, "malloc_trim", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_MALLOC_TRIM = _load()


def available() -> bool:
    return _MALLOC_TRIM is not None


def trim() -> bool:
    """Return the heap's free pages to the operating system; True if glibc released any."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))
