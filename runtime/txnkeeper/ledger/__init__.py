"""Layer 1: the managed ledger, a named log of checksummed entries on a directory (the pod's PV).

Public API per docs/contracts.md section 1; everything else in this package is internal.
"""

from .config import ManagedLedgerConfig
from .cursor import ManagedCursor
from .errors import (
    CorruptEntryError,
    CorruptMetadataError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    LedgerLockedError,
    LedgerWriteError,
    MissingCursorError,
    NoSuchEntryError,
)
from .factory import ManagedLedgerFactory
from .fileio import FileIO
from .managed_ledger import ManagedLedger
from .position import Entry, Position

__all__ = [
    "CorruptEntryError",
    "CorruptMetadataError",
    "Entry",
    "FileIO",
    "LedgerClosedError",
    "LedgerError",
    "LedgerFencedError",
    "LedgerLockedError",
    "LedgerWriteError",
    "ManagedCursor",
    "ManagedLedger",
    "ManagedLedgerConfig",
    "ManagedLedgerFactory",
    "MissingCursorError",
    "NoSuchEntryError",
    "Position",
]
