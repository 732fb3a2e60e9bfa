"""The managed ledger's metadata: which ledgers exist, which one is open, and the next ledger id.

Stored as one JSON file replaced atomically (FileIO.write_file_atomically). The next ledger id is
persisted before any ledger file with that id is created, so ids are never reused, even after trims
and crashes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import CorruptMetadataError
from .fileio import FileIO

METADATA_FILE = "meta.json"
METADATA_VERSION = 1


@dataclass
class LedgerInfo:
    """One ledger as the metadata records it; counts are authoritative once ``closed``."""

    ledger_id: int
    entries: int = 0
    size: int = 0  # payload bytes (Pulsar's ledger size)
    file_bytes: int = 0
    created_at: float = 0.0  # unix time
    closed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "ledgerId": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "fileBytes": self.file_bytes,
            "createdAt": self.created_at,
            "closed": self.closed,
        }


@dataclass
class ManagedLedgerMetadata:
    name: str
    next_ledger_id: int = 1
    ledgers: list[LedgerInfo] = field(default_factory=list)

    def copy(self) -> ManagedLedgerMetadata:
        return ManagedLedgerMetadata(self.name, self.next_ledger_id, [replace(i) for i in self.ledgers])

    def find(self, ledger_id: int) -> LedgerInfo | None:
        for info in self.ledgers:
            if info.ledger_id == ledger_id:
                return info
        return None

    def encode(self) -> bytes:
        doc = {
            "version": METADATA_VERSION,
            "name": self.name,
            "nextLedgerId": self.next_ledger_id,
            "ledgers": [i.to_json() for i in self.ledgers],
        }
        return json.dumps(doc, indent=1).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> ManagedLedgerMetadata:
        try:
            doc = json.loads(raw)
            if doc.get("version") != METADATA_VERSION:
                raise CorruptMetadataError(path, f"unknown metadata version {doc.get('version')!r}")
            meta = cls(
                name=str(doc["name"]),
                next_ledger_id=int(doc["nextLedgerId"]),
                ledgers=[
                    LedgerInfo(
                        ledger_id=int(i["ledgerId"]),
                        entries=int(i["entries"]),
                        size=int(i["size"]),
                        file_bytes=int(i["fileBytes"]),
                        created_at=float(i["createdAt"]),
                        closed=bool(i["closed"]),
                    )
                    for i in doc["ledgers"]
                ],
            )
        except CorruptMetadataError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not valid managed-ledger metadata ({exc!r})") from exc
        ids = [i.ledger_id for i in meta.ledgers]
        if ids != sorted(set(ids)) or any(i >= meta.next_ledger_id for i in ids):
            raise CorruptMetadataError(
                path, f"ledger ids {ids} are not ascending and below nextLedgerId {meta.next_ledger_id}"
            )
        if any(not i.closed for i in meta.ledgers[:-1]):
            raise CorruptMetadataError(path, "a ledger other than the last one is still marked open")
        return meta


class MetadataStore:
    """The live metadata of one open managed ledger and the only way to change it.

    Changes are serialised: rollover (in the writer's order) and trim (from callers) both change the
    metadata, and each must start from the other's result, or a ledger would vanish from it.
    """

    def __init__(self, path: Path, meta: ManagedLedgerMetadata, io: FileIO, executor: Executor) -> None:
        self.path = path
        self.meta = meta
        self.ids = [i.ledger_id for i in meta.ledgers]  # live ledger ids, ascending
        self._io = io
        self._executor = executor
        self._lock = asyncio.Lock()

    async def update(self, change: Callable[[ManagedLedgerMetadata], None]) -> None:
        """Apply ``change`` to a copy, write it atomically, then adopt it (OSError: nothing changed)."""
        async with self._lock:
            meta = self.meta.copy()
            change(meta)
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._io.write_file_atomically, self.path, meta.encode()
            )
            self.meta = meta
            self.ids = [i.ledger_id for i in meta.ledgers]
