"""A read-only view of a managed ledger directory, for tools that must not change what they look at.

Opening a ManagedLedger is a recovery: it takes the directory lock (creating LOCK), cuts torn tails,
records the recovered ledger as closed in meta.json, creates the next ledger and the watermark. A tool
looking at a stopped pod's volume, or at the evidence of a failure (``txnkeeper inspect``), must do
none of that. This view reads meta.json, the watermark, the cursor files and every ledger file, each
opened O_RDONLY, runs exactly the checks recovery runs (so corruption is refused the same way, never
served as data), and reports torn tails instead of cutting them. It takes no lock: looking at a
directory a live process is writing is allowed, and an append in progress may then show as a torn tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cursor import CursorState
from .errors import CorruptMetadataError, NoSuchEntryError
from .fileio import DEFAULT_IO, FileIO
from .ledger_file import LedgerFile
from .metadata import METADATA_FILE, ManagedLedgerMetadata, directory_ledger_name
from .names import encode_name
from .position import Position
from .recovery import CURSORS_DIR, check_ledgers, read_cursors
from .watermark import load_watermark


@dataclass
class ManagedLedgerView:
    name: str
    directory: Path
    meta: ManagedLedgerMetadata
    files: dict[int, LedgerFile]
    cursors: dict[str, CursorState]
    torn_tails: list[str]  # what opening the ledger for writing would cut

    def read_entry(self, position: Position) -> bytes:
        """The entry's verified bytes (CorruptEntryError if it fails its checksums). Blocking."""
        ledger = self.files.get(position.ledger_id)
        if ledger is None or not 0 <= position.entry_id < ledger.entries:
            held = ", ".join(f"{i}:0..{f.entries - 1}" for i, f in self.files.items() if f.entries) or "none"
            raise NoSuchEntryError(
                f"no entry at {position} in managed ledger {self.name!r} (entries held: {held}); it was "
                "never written, was trimmed, or lies in a torn tail"
            )
        ledger.begin_read()
        try:
            return ledger.read(position.entry_id, 1)[0]
        finally:
            ledger.end_read()
            ledger.close()


def open_read_only(root: Path, name: str, io: FileIO = DEFAULT_IO) -> ManagedLedgerView:
    """Check and index the managed ledger ``name`` under ``root`` without writing anything. Blocking.

    Raises NoSuchEntryError if it does not exist, and the same CorruptEntryError/CorruptMetadataError
    opening it for writing would raise.
    """
    directory = root / encode_name(name)
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        present = ", ".join(list_managed_ledgers(root)) or "none"
        raise NoSuchEntryError(f"no managed ledger {name!r} in {root}; present: {present}")
    meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
    if meta.name != name:
        raise CorruptMetadataError(meta_path, f"it belongs to managed ledger {meta.name!r}, not {name!r}")
    watermark = load_watermark(io, directory)
    files, torn = check_ledgers(io, directory, meta, meta_path, watermark, cut=False)
    cursors = {name: state for name, (_, state) in read_cursors(directory / CURSORS_DIR, files).items()}
    return ManagedLedgerView(name, directory, meta, files, cursors, torn)


def list_managed_ledgers(root: Path) -> list[str]:
    """Managed ledgers present under ``root``, sorted (ManagedLedgerFactory.list_names, read-only)."""
    if not root.is_dir():
        return []
    return sorted(name for child in root.iterdir() if (name := directory_ledger_name(child)))


def is_batch_index_deleted(state: CursorState, position: Position, batch_index: int) -> bool:
    """ManagedCursor.is_batch_index_deleted on a cursor's persisted state."""
    if state.is_deleted(position):
        return True
    mask = state.ack_masks.get(position)
    return mask is not None and not (mask >> batch_index) & 1
