"""Single ownership of a managed ledger directory: an exclusive, non-blocking flock on its LOCK file.

flock locks belong to the open file description, so a second process (or a second factory in this
process) is refused, and the kernel drops the lock when the owner dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .errors import LedgerLockedError

LOCK_FILE = "LOCK"


def acquire_directory_lock(directory: Path) -> int:
    """Return the fd holding the lock, or raise LedgerLockedError naming the directory."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LedgerLockedError(directory) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_directory_lock(fd: int) -> None:
    os.close(fd)  # closing the only descriptor releases the flock
