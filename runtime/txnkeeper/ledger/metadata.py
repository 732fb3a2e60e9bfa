"""The managed ledger's metadata: which ledgers exist, which one is open, and the next ledger id.

Stored as one checksummed state file (``txnkeeper.statefile``, kind ``managed-ledger-metadata``)
replaced atomically through the ledger's FileIO. The next ledger id is persisted before any ledger file
with that id is created, so ids are never reused, even after trims and crashes. A ``meta.json`` of the
previous release (plain JSON with ``"version": 1``) is read if it has exactly that shape and is
rewritten checksummed by the next metadata change (a rollover, a trim, or an open that starts a
new ledger).

Version 2 adds offload state (PIP-76): the offload segments and, per ledger, whether its local file was
replaced by the tier. It is written only once offload has recorded something, so a managed ledger that
never offloads keeps writing version 1 and an older release can still open it.
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
from .names import decode_name, encode_name, is_bounded_form
from .position import Position

METADATA_FILE = "meta.json"
METADATA_KIND = "managed-ledger-metadata"
METADATA_VERSION = 1  # of the body below, without offload state
METADATA_VERSION_OFFLOAD = 2  # the body plus offloadSegments and per-ledger "offloaded"
SEGMENT_STATES = ("Assigned", "Offloaded", "Failed")
_LEGACY_VERSION = 1  # the previous release's plain-JSON file said "version": 1
_BODY_KEYS = {"name", "nextLedgerId", "ledgers"}
_LEDGER_KEYS = {"ledgerId", "entries", "size", "fileBytes", "createdAt", "closed"}
_SEGMENT_KEYS = {"uuid", "status", "assignedAt", "offloadedAt", "begin", "end", "driverMetadata"}


@dataclass
class LedgerInfo:
    """One ledger as the metadata records it; counts are authoritative once ``closed``."""

    ledger_id: int
    entries: int = 0
    size: int = 0  # payload bytes (Pulsar's ledger size)
    file_bytes: int = 0
    created_at: float = 0.0  # unix time
    closed: bool = False
    # The local file was deleted after Offloaded segments covered every entry: reads use the tier.
    offloaded: bool = False

    def to_json(self, version: int = METADATA_VERSION) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ledgerId": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "fileBytes": self.file_bytes,
            "createdAt": self.created_at,
            "closed": self.closed,
        }
        if version >= METADATA_VERSION_OFFLOAD:
            doc["offloaded"] = self.offloaded
        return doc


@dataclass
class OffloadSegment:
    """One PIP-76 offload segment: immutable once assigned except for its status and end.

    ``begin`` is fixed at assignment; ``end`` (the last entry it holds) and ``offloaded_at`` are set
    when it becomes Offloaded. A Failed segment has no objects worth keeping and is retried (from the
    same ``begin``, under a new uuid) before any new segment opens.
    """

    uuid: str
    status: str
    assigned_at: float
    begin: Position
    end: Position | None = None
    offloaded_at: float | None = None
    driver_metadata: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "status": self.status,
            "assignedAt": self.assigned_at,
            "offloadedAt": self.offloaded_at,
            "begin": str(self.begin),
            "end": str(self.end) if self.end is not None else None,
            "driverMetadata": dict(self.driver_metadata),
        }

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        return (
            self.status == "Offloaded"
            and self.end is not None
            and (self.begin.ledger_id, self.begin.entry_id) <= (ledger_id, entry_id)
            and (ledger_id, entry_id) <= (self.end.ledger_id, self.end.entry_id)
        )


@dataclass
class ManagedLedgerMetadata:
    name: str
    next_ledger_id: int = 1
    ledgers: list[LedgerInfo] = field(default_factory=list)
    segments: list[OffloadSegment] = field(default_factory=list)

    def copy(self) -> ManagedLedgerMetadata:
        return ManagedLedgerMetadata(
            self.name,
            self.next_ledger_id,
            [replace(i) for i in self.ledgers],
            [replace(s, driver_metadata=dict(s.driver_metadata)) for s in self.segments],
        )

    @property
    def version(self) -> int:
        if self.segments or any(i.offloaded for i in self.ledgers):
            return METADATA_VERSION_OFFLOAD
        return METADATA_VERSION

    def find(self, ledger_id: int) -> LedgerInfo | None:
        for info in self.ledgers:
            if info.ledger_id == ledger_id:
                return info
        return None

    def encode(self) -> bytes:
        version = self.version
        body: dict[str, Any] = {
            "name": self.name,
            "nextLedgerId": self.next_ledger_id,
            "ledgers": [i.to_json(version) for i in self.ledgers],
        }
        if version >= METADATA_VERSION_OFFLOAD:
            body["offloadSegments"] = [s.to_json() for s in self.segments]
        return statefile.encode(METADATA_KIND, version, body)

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> ManagedLedgerMetadata:
        """Check and parse a metadata file; anything damaged or inconsistent is CorruptMetadataError."""
        try:
            doc = statefile.decode(
                raw,
                path,
                METADATA_KIND,
                frozenset({METADATA_VERSION, METADATA_VERSION_OFFLOAD}),
                legacy=_legacy_body,
            )
            meta = _from_body(doc.body, doc.version)
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


def directory_ledger_name(directory: Path) -> str | None:
    """The managed ledger a directory under a factory root holds (None: none). Blocking.

    A plainly encoded directory name decodes; one in the bounded form of a long name
    (``names.is_bounded_form``) holds the ledger its metadata names, if that name leads back to it
    (a directory whose metadata cannot be read is not listed: opening it reports the damage)."""
    meta_path = directory / METADATA_FILE
    name = decode_name(directory.name)
    if name is not None or not is_bounded_form(directory.name):
        return name if name is not None and meta_path.is_file() else None
    try:
        stored = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path).name
    except (StateFileError, OSError):
        return None
    return stored if encode_name(stored) == directory.name else None


def _legacy_body(raw: bytes) -> dict[str, Any]:
    """The previous release's meta.json: exactly {"version": 1} plus today's body fields."""
    return statefile.versioned_legacy_body(raw, "metadata", _BODY_KEYS, _LEGACY_VERSION, _from_body)


def _position(value: Any, what: str) -> Position:
    text = statefile.string(value, what)
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise StateShapeError(f"{what}: {exc}") from exc


def _segment(item: Any, what: str) -> OffloadSegment:
    doc = statefile.obj(item, what, _SEGMENT_KEYS)
    status = statefile.string(doc["status"], f"{what}.status")
    if status not in SEGMENT_STATES:
        raise StateShapeError(f"{what}.status {status!r} is not one of {', '.join(SEGMENT_STATES)}")
    driver = statefile.obj(doc["driverMetadata"], f"{what}.driverMetadata", None)
    segment = OffloadSegment(
        uuid=statefile.string(doc["uuid"], f"{what}.uuid"),
        status=status,
        assigned_at=statefile.number(doc["assignedAt"], f"{what}.assignedAt"),
        begin=_position(doc["begin"], f"{what}.begin"),
        end=None if doc["end"] is None else _position(doc["end"], f"{what}.end"),
        offloaded_at=(
            None
            if doc["offloadedAt"] is None
            else statefile.number(doc["offloadedAt"], f"{what}.offloadedAt")
        ),
        driver_metadata={
            str(k): statefile.string(v, f"{what}.driverMetadata.{k}") for k, v in driver.items()
        },
    )
    if status == "Offloaded" and (segment.end is None or segment.offloaded_at is None):
        raise StateShapeError(f"{what} is Offloaded but has no end position or offloadedAt")
    return segment


def _from_body(body: Any, version: int = METADATA_VERSION) -> ManagedLedgerMetadata:
    offload = version >= METADATA_VERSION_OFFLOAD
    doc = statefile.obj(body, "metadata", _BODY_KEYS | ({"offloadSegments"} if offload else set()))
    ledgers = []
    for n, item in enumerate(statefile.array(doc["ledgers"], "ledgers")):
        what = f"ledgers[{n}]"
        info = statefile.obj(item, what, _LEDGER_KEYS | ({"offloaded"} if offload else set()))
        ledgers.append(
            LedgerInfo(
                ledger_id=statefile.integer(info["ledgerId"], f"{what}.ledgerId", 1),
                entries=statefile.integer(info["entries"], f"{what}.entries", 0),
                size=statefile.integer(info["size"], f"{what}.size", 0),
                file_bytes=statefile.integer(info["fileBytes"], f"{what}.fileBytes", 0),
                created_at=statefile.number(info["createdAt"], f"{what}.createdAt"),
                closed=statefile.boolean(info["closed"], f"{what}.closed"),
                offloaded=offload and statefile.boolean(info["offloaded"], f"{what}.offloaded"),
            )
        )
    segments = []
    if offload:
        for n, item in enumerate(statefile.array(doc["offloadSegments"], "offloadSegments")):
            segments.append(_segment(item, f"offloadSegments[{n}]"))
    return ManagedLedgerMetadata(
        name=statefile.string(doc["name"], "name"),
        next_ledger_id=statefile.integer(doc["nextLedgerId"], "nextLedgerId", 1),
        ledgers=ledgers,
        segments=segments,
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
