"""The managed ledger's metadata: which ledgers exist, which one is open, and the next ledger id.

Stored as one checksummed state file (``txnkeeper.statefile``, kind ``managed-ledger-metadata``)
replaced atomically through the ledger's FileIO. The next ledger id is persisted before any ledger file
with that id is created, so ids are never reused, even after trims and crashes. A ``meta.json`` of the
previous release (plain JSON with ``"version": 1``) is read if it has exactly that shape and is
rewritten checksummed by the next metadata change (a rollover, a trim, or an open that starts a
new ledger).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError

from .errors import CorruptMetadataError
from .fileio import FileIO

METADATA_FILE = "meta.json"
METADATA_KIND = "managed-ledger-metadata"
METADATA_VERSION = 1  # of the body below
_LEGACY_VERSION = 1  # the previous release's plain-JSON file said "version": 1
_BODY_KEYS = {"name", "nextLedgerId", "ledgers"}
_LEDGER_KEYS = {"ledgerId", "entries", "size", "fileBytes", "createdAt", "closed"}


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
        body = {
            "name": self.name,
            "nextLedgerId": self.next_ledger_id,
            "ledgers": [i.to_json() for i in self.ledgers],
        }
        return statefile.encode(METADATA_KIND, METADATA_VERSION, body)

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> ManagedLedgerMetadata:
        """Check and parse a metadata file; anything damaged or inconsistent is CorruptMetadataError."""
        try:
            doc = statefile.decode(
                raw, path, METADATA_KIND, frozenset({METADATA_VERSION}), legacy=_legacy_body
            )
            meta = _from_body(doc.body)
        except StateShapeError as exc:
            raise CorruptMetadataError(path, f"not valid managed-ledger metadata: {exc}") from exc
        except StateFileError as exc:
            raise CorruptMetadataError(path, exc.problem, exc.remedy) from exc
        ids = [i.ledger_id for i in meta.ledgers]
        if ids != sorted(set(ids)) or any(i >= meta.next_ledger_id for i in ids):
            raise CorruptMetadataError(
                path, f"ledger ids {ids} are not ascending and below nextLedgerId {meta.next_ledger_id}"
            )
        if any(not i.closed for i in meta.ledgers[:-1]):
            raise CorruptMetadataError(path, "a ledger other than the last one is still marked open")
        return meta


def _legacy_body(raw: bytes) -> dict[str, Any]:
    """The previous release's meta.json: exactly {"version": 1} plus today's body fields."""
    doc = statefile.obj(statefile.parse_json(raw), "metadata", _BODY_KEYS | {"version"})
    if doc["version"] != _LEGACY_VERSION or isinstance(doc["version"], bool):
        raise StateShapeError(f"unknown metadata version {doc['version']!r}")
    body = {k: v for k, v in doc.items() if k != "version"}
    _from_body(body)  # every field checked here, so the refusal says it is no old file either
    return body


def _from_body(body: Any) -> ManagedLedgerMetadata:
    doc = statefile.obj(body, "metadata", _BODY_KEYS)
    ledgers = []
    for n, item in enumerate(statefile.array(doc["ledgers"], "ledgers")):
        what = f"ledgers[{n}]"
        info = statefile.obj(item, what, _LEDGER_KEYS)
        ledgers.append(
            LedgerInfo(
                ledger_id=statefile.integer(info["ledgerId"], f"{what}.ledgerId", 1),
                entries=statefile.integer(info["entries"], f"{what}.entries", 0),
                size=statefile.integer(info["size"], f"{what}.size", 0),
                file_bytes=statefile.integer(info["fileBytes"], f"{what}.fileBytes", 0),
                created_at=statefile.number(info["createdAt"], f"{what}.createdAt"),
                closed=statefile.boolean(info["closed"], f"{what}.closed"),
            )
        )
    return ManagedLedgerMetadata(
        name=statefile.string(doc["name"], "name"),
        next_ledger_id=statefile.integer(doc["nextLedgerId"], "nextLedgerId", 1),
        ledgers=ledgers,
    )


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
