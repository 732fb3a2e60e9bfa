"""The files that make up one shard of a store pod's topics, as a move copies them (docs/contracts.md §12):
where each topic keeps its state on disk, the manifest of a fenced shard (path, size, CRC32C per file)
and the checked copy of one file from the source pod.

Why its own module: what belongs to a topic on disk is spread over the ledger directory (its managed
ledger with cursors, offload state and watermark), its subscriptions' pending-ack logs (managed ledgers
of their own, named after topic and subscription) and the transaction-buffer snapshot beside the
subscription registry. Listing it in one place keeps the fence (which lists), the file verb (which
serves only what was listed) and the release (which deletes) agreeing on the same set.

Blocking file calls only: callers run them in a thread.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from txnkeeper.ledger.errors import CorruptMetadataError
from txnkeeper.ledger.lock import LOCK_FILE
from txnkeeper.ledger.metadata import METADATA_FILE, ManagedLedgerMetadata
from txnkeeper.ledger.names import encode_name
from txnkeeper.pendingack import pending_ack_log_name
from txnkeeper.topic.service import SNAPSHOT_DIR
from txnkeeper.topic.snapshot import snapshot_path

LEDGERS = "ledgers"
STORE = "store"
PENDING_ACK_SUFFIX = "__transaction_pending_ack"
# The shard's rows of the pod-wide files (subscription registry, offload and topic policies), written
# at the fence and merged by the target: one JSON file per move (§12).
ROWS_FILE = "shard-rows.json"
OUTGOING = "moves-out"
INCOMING = "moves-in"
CHUNK = 1 << 20


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the data directory, '/'-separated
    size: int
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "crc32c": self.crc32c}


def move_dir_name(move: str) -> str:
    """A move id as one path component (ids are any printable text)."""
    return encode_name(move, "move id")


def rows_path(move: str) -> str:
    return f"{OUTGOING}/{move_dir_name(move)}/{ROWS_FILE}"


def topic_units(topic: str, subscriptions: Iterable[str]) -> list[str]:
    """The top-level paths (relative to the data directory) that hold ``topic``'s state: its ledger
    directory, each subscription's pending-ack log directory, its transaction-buffer snapshot."""
    units = [f"{LEDGERS}/{encode_name(topic)}"]
    units += [f"{LEDGERS}/{encode_name(pending_ack_log_name(topic, s))}" for s in subscriptions]
    units.append(f"{STORE}/{SNAPSHOT_DIR}/{snapshot_path(Path(), topic).name}")
    return units


def list_files(data_dir: Path, units: Iterable[str]) -> list[str]:
    """Every regular file under ``units`` (directories are walked; a missing unit holds nothing),
    without the ledger lock files (a process-local flock, created again by whoever opens it)."""
    found: list[str] = []
    for unit in units:
        path = data_dir / unit
        if path.is_file():
            found.append(unit)
            continue
        if not path.is_dir():
            continue
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name == LOCK_FILE or name.endswith(".tmp"):
                    continue
                found.append(Path(root, name).relative_to(data_dir).as_posix())
    return found


def checksum_file(path: Path) -> tuple[int, int]:
    """(size, CRC32C) of a file, read in chunks."""
    crc = 0
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            crc = crc32c(chunk, crc)
            size += len(chunk)
    return size, crc


def safe_relative(path: str) -> bool:
    """A manifest path the target may write: relative, inside the data directory, no '..'."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return parts[0] in (LEDGERS, STORE, OUTGOING) and len(parts) >= 2


def ledger_metadata(root: Path, units: Iterable[str]) -> Iterator[tuple[str, ManagedLedgerMetadata]]:
    """Each managed-ledger directory among ``units`` (under ``root``) with its metadata; a directory
    whose metadata is missing or cannot be read is skipped: what copies or installs it carries it
    whole, and opening it reports the damage, as after a restart (blocking)."""
    for unit in units:
        if not unit.startswith(LEDGERS + "/"):
            continue
        meta_path = root / unit / METADATA_FILE
        try:
            yield unit, ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
        except (OSError, CorruptMetadataError):
            continue


def unit_of(path: str) -> str:
    """The top-level unit a manifest path is installed with (ledger directory or snapshot file)."""
    parts = path.split("/")
    if parts[0] == LEDGERS:
        return "/".join(parts[:2])
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under ``path`` (the staged copy, before it is installed)."""
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(Path(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def remove(path: Path) -> None:
    """Delete a file or directory tree; nothing there is fine (a repeated release or discard)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
