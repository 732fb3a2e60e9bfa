"""Undo offload before a downgrade to a release without ``offload-segments`` (3.x -> 2.x).

A 2.x pod reads only metadata version 1 and only local ledger files, so before one is started on a
volume every tier-only ledger (``offloaded``: its local file was deleted) must be copied back from the
blob store and the metadata rewritten without segments. This module does that for one closed managed
ledger directory, and takes the inventory (metadata versions, tier-only ledgers, segment states) that
the pod's admin API reports, the operator's downgrade gate waits on, and a 2.x pod checks at start.

Crash safety: ledger files are written (fsync'd) first, the metadata last. A crash before the metadata
is rewritten leaves ``offloaded`` ledgers whose local files exist: the next open removes them as
leftovers (contracts §9) and the restore simply runs again. Once the version-1 metadata is durable the
segments' objects are no longer referenced and are deleted; a crash or a store error then leaves
orphan objects (the ``verify-offload`` job reports them), never a ledger without its entries.
Everything read from the tier is CRC- and structure-checked by ``SegmentReader`` before it is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from txnkeeper import statefile

from ..entry_format import FILE_HEADER, record_header
from ..errors import CorruptMetadataError
from ..fileio import DEFAULT_IO, FileIO
from ..ledger_file import LedgerFile
from ..lock import acquire_directory_lock, release_directory_lock
from ..metadata import METADATA_FILE, METADATA_VERSION, ManagedLedgerMetadata, OffloadSegment
from ..names import decode_name, is_bounded_form
from ..recovery import LEDGERS_DIR
from .blobstore import BlobStore
from .config import OffloadConfig
from .errors import BlobNotFound, BlobStoreError, OffloadConfigError, OffloadRangeError
from .offloader import open_blob_store
from .reader import IndexCache, SegmentReader
from .writer import index_key

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerInventory:
    """What one managed ledger's metadata says about offload."""

    name: str
    directory: Path
    metadata_version: int
    tier_only_ledgers: tuple[int, ...]
    segments: dict[str, int]  # status -> count
    # (uuid, status) of every segment, what the verify-offload audit checks the tier against.
    segment_list: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every managed ledger under a factory root (a pod's ``DIR/ledgers``)."""

    ledgers: tuple[LedgerInventory, ...]
    # Directories whose metadata could not be read, with the reason (never counted as clean).
    unreadable: tuple[tuple[Path, str], ...] = ()

    @property
    def tier_only_ledgers(self) -> int:
        return sum(len(item.tier_only_ledgers) for item in self.ledgers)

    @property
    def max_metadata_version(self) -> int:
        return max((item.metadata_version for item in self.ledgers), default=METADATA_VERSION)

    @property
    def needs_offload(self) -> tuple[LedgerInventory, ...]:
        """Managed ledgers a release without ``offload-segments`` cannot open."""
        return tuple(item for item in self.ledgers if item.metadata_version > METADATA_VERSION)

    def segment_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for item in self.ledgers:
            for status, count in item.segments.items():
                total[status] = total.get(status, 0) + count
        return total

    def to_json(self) -> dict[str, Any]:
        """The pod-level offload summary (docs/contracts.md §5 ``GET /admin/v1/offload/summary``)."""
        versions: dict[str, int] = {}
        for item in self.ledgers:
            key = str(item.metadata_version)
            versions[key] = versions.get(key, 0) + 1
        return {
            "managedLedgers": len(self.ledgers),
            "metadataVersions": versions,
            "maxMetadataVersion": self.max_metadata_version,
            "tierOnlyLedgers": self.tier_only_ledgers,
            "segments": self.segment_counts(),
            "unreadable": [{"directory": str(path), "error": why} for path, why in self.unreadable],
            "stores": [
                {
                    "name": item.name,
                    "metadataVersion": item.metadata_version,
                    "tierOnlyLedgers": list(item.tier_only_ledgers),
                    "segments": dict(item.segments),
                    "segmentList": [{"uuid": uuid, "status": status} for uuid, status in item.segment_list],
                }
                for item in self.ledgers
                if item.metadata_version > METADATA_VERSION
            ],
        }


def read_metadata(directory: Path) -> ManagedLedgerMetadata:
    """The metadata of a managed-ledger directory, checked (CorruptMetadataError names the file).

    Safe while the ledger is open elsewhere: the file is only ever replaced by an atomic rename."""
    path = directory / METADATA_FILE
    return ManagedLedgerMetadata.decode(path.read_bytes(), path)


def _inventory_one(name: str, directory: Path, meta: ManagedLedgerMetadata) -> LedgerInventory:
    segments: dict[str, int] = {}
    for segment in meta.segments:
        segments[segment.status] = segments.get(segment.status, 0) + 1
    return LedgerInventory(
        name=name,
        directory=directory,
        metadata_version=meta.version,
        tier_only_ledgers=tuple(i.ledger_id for i in meta.ledgers if i.offloaded),
        segments=segments,
        segment_list=tuple((s.uuid, s.status) for s in meta.segments),
    )


def inventory(root: Path) -> Inventory:
    """Scan every managed ledger under ``root`` (blocking: run it on an executor in a server)."""
    items: list[LedgerInventory] = []
    bad: list[tuple[Path, str]] = []
    if not root.is_dir():
        return Inventory(())
    for child in sorted(root.iterdir()):
        name = decode_name(child.name)
        # A long name's directory (bounded form) is named by a hash: its metadata says whose it is.
        if (name is None and not is_bounded_form(child.name)) or not (child / METADATA_FILE).is_file():
            continue
        try:
            meta = read_metadata(child)
            items.append(_inventory_one(meta.name if name is None else name, child, meta))
        except (CorruptMetadataError, OSError) as exc:
            bad.append((child, str(exc)))
    return Inventory(tuple(items), tuple(bad))


@dataclass(slots=True)
class RestoreResult:
    """What one restore did: ledgers copied back, objects deleted, objects left behind (with why)."""

    name: str
    restored_ledgers: list[int] = field(default_factory=list)
    restored_entries: int = 0
    deleted_segments: list[str] = field(default_factory=list)
    leftover_objects: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "restoredLedgers": list(self.restored_ledgers),
            "restoredEntries": self.restored_entries,
            "deletedSegments": list(self.deleted_segments),
            "leftoverObjects": list(self.leftover_objects),
        }


class RestoreError(Exception):
    """A tier-only ledger could not be restored; the directory is unchanged (still version 2)."""


async def _read_from_tier(
    store: BlobStore, cache: IndexCache, meta: ManagedLedgerMetadata, ledger_id: int, count: int
) -> list[bytes]:
    name = meta.name
    out: list[bytes] = []
    entry = 0
    while entry < count:
        segment: OffloadSegment | None = next((s for s in meta.segments if s.holds(ledger_id, entry)), None)
        if segment is None or segment.end is None:
            raise OffloadRangeError(
                f"entry {ledger_id}:{entry} of managed ledger {name!r} is in no Offloaded segment and its "
                "local file is gone; restore the ledger directory from a backup"
            )
        last = count - 1 if segment.end.ledger_id != ledger_id else min(count - 1, segment.end.entry_id)
        entries = await SegmentReader(store, segment.uuid, cache=cache).read_entries(ledger_id, entry, last)
        out.extend(e.data for e in entries)
        entry = last + 1
    return out


def _write_ledger_file(io: FileIO, directory: Path, ledger_id: int, entries: list[bytes]) -> int:
    """Write a complete, fsync'd ledger file; returns its length. Blocking."""
    ledger = LedgerFile(io, directory, ledger_id)
    ledger.create()
    try:
        buffers: list[bytes] = []
        for entry_id, data in enumerate(entries):
            buffers.append(record_header(entry_id, data))
            buffers.append(data)
        ledger.write_and_sync(buffers, FILE_HEADER.size, sync=True)
    finally:
        ledger.close_for_writes()
    return FILE_HEADER.size + sum(len(b) for b in buffers)


async def restore_directory(directory: Path, store: BlobStore, *, io: FileIO = DEFAULT_IO) -> RestoreResult:
    """Copy every tier-only ledger of the closed managed ledger in ``directory`` back to local files,
    rewrite its metadata as version 1 (no segments, nothing offloaded), then delete the segments'
    objects. Idempotent; holds the directory lock throughout (LedgerLockedError while it is open).

    A ledger the tier cannot produce (missing object, CRC mismatch, range not offloaded) raises
    RestoreError naming the managed ledger and ledger and leaves the metadata as it was."""
    loop = asyncio.get_running_loop()
    lock = acquire_directory_lock(directory)
    try:
        meta = read_metadata(directory)
        name = meta.name
        result = RestoreResult(name)
        if meta.version == METADATA_VERSION:
            return result
        cache = IndexCache()
        sizes: dict[int, int] = {}
        for info in meta.ledgers:
            if not info.offloaded:
                continue
            try:
                entries = await _read_from_tier(store, cache, meta, info.ledger_id, info.entries)
            except (BlobStoreError, OffloadRangeError) as exc:
                raise RestoreError(
                    f"cannot restore ledger {info.ledger_id} of managed ledger {name!r} ({directory}) from "
                    f"the tier: {exc}; nothing was changed; fix the blob store (or restore from a backup) "
                    "and retry"
                ) from exc
            except Exception as exc:  # OffloadCorruptionError and friends: refuse, name the ledger
                raise RestoreError(
                    f"ledger {info.ledger_id} of managed ledger {name!r} ({directory}) is damaged in the "
                    f"tier: {exc}; nothing was changed; restore the ledger directory from a backup"
                ) from exc
            sizes[info.ledger_id] = await loop.run_in_executor(
                None, _write_ledger_file, io, directory / LEDGERS_DIR, info.ledger_id, entries
            )
            result.restored_ledgers.append(info.ledger_id)
            result.restored_entries += len(entries)
        segments = list(meta.segments)
        rewritten = meta.copy()
        rewritten.segments = []
        for info in rewritten.ledgers:
            if info.offloaded:
                info.offloaded = False
                info.file_bytes = sizes[info.ledger_id]
        assert rewritten.version == METADATA_VERSION
        await loop.run_in_executor(
            None, io.write_file_atomically, directory / METADATA_FILE, rewritten.encode()
        )
        log.info(
            "managed ledger %s: restored %d tier-only ledger(s) locally, metadata now version %d",
            name,
            len(result.restored_ledgers),
            METADATA_VERSION,
        )
        for segment in segments:
            leftover = await _delete_segment_objects(store, segment.uuid)
            if leftover:
                result.leftover_objects.extend(leftover)
            else:
                result.deleted_segments.append(segment.uuid)
        return result
    finally:
        release_directory_lock(lock)


async def _delete_segment_objects(store: BlobStore, uuid: str) -> list[str]:
    """Index first, then data (a data object without an index is never read); returns what stayed."""
    leftover = []
    for key in (index_key(uuid), uuid):
        try:
            await store.delete(key)
        except BlobStoreError as exc:
            log.warning("offload restore: object %s left behind (an orphan now): %s", key, exc)
            leftover.append(key)
    return leftover


async def restore_root(
    root: Path, store: BlobStore, *, io: FileIO = DEFAULT_IO, where: str = "the given tier"
) -> list[RestoreResult]:
    """``restore_directory`` for every managed ledger under ``root`` still at metadata version 2,
    once ``_check_tier_holds`` found the segments in ``store`` (``where`` names it in errors)."""
    needing = inventory(root).needs_offload
    await _check_tier_holds(needing, store, where)
    results = []
    for item in needing:
        results.append(await restore_directory(item.directory, store, io=io))
    return results


async def _check_tier_holds(items: tuple[LedgerInventory, ...], store: BlobStore, where: str) -> None:
    """Refuse (RestoreError, nothing changed) a tier that holds none of the volume's Offloaded
    segments whose ledgers are still live: it is not the tier the data was offloaded to, and a
    restore there would rewrite every metadata as version 1 and drop the segment records (while
    every ledger is still local nothing else would notice), orphaning the real tier's objects. A
    tier holding some of them is the right one with objects lost: those are logged, and ledgers
    that need them fail the restore as before (the others are still local)."""
    probes: list[tuple[str, OffloadSegment]] = []
    for item in items:
        meta = read_metadata(item.directory)
        live = [info.ledger_id for info in meta.ledgers]
        for segment in meta.segments:
            end = segment.end
            if segment.status != "Offloaded" or end is None:
                continue
            if any(segment.begin.ledger_id <= ledger_id <= end.ledger_id for ledger_id in live):
                probes.append((meta.name, segment))
    if not probes:
        return
    missing: list[tuple[str, OffloadSegment]] = []
    for name, segment in probes:
        try:
            await store.length(index_key(segment.uuid))
        except BlobNotFound:
            missing.append((name, segment))
        except BlobStoreError as exc:
            raise RestoreError(
                f"cannot read the tier {where}: {exc}; nothing was changed; fix the blob store and retry"
            ) from exc
    if len(missing) == len(probes):
        name, first = missing[0]
        raise RestoreError(
            f"the tier {where} holds none of the {len(probes)} Offloaded segment(s) of this volume (first: "
            f"segment {first.uuid} of managed ledger {name!r}, object {index_key(first.uuid)} is missing): "
            "it is not the tier this data was offloaded to; nothing was changed; request the restore "
            "again with the location of the pod's offload settings"
        )
    for name, segment in missing:
        log.warning(
            "offload restore: segment %s of managed ledger %s is not in the tier %s (its index object is "
            "missing); the ledgers it holds are restored only if they are still local",
            segment.uuid,
            name,
            where,
        )


# ---- the restore request: asked for through the admin API, carried out at the pod's next start ---------

REQUEST_FILE = "offload-restore.json"
REQUEST_KIND = "offload-restore-request"
REQUEST_VERSION = 1


class RestoreRequestError(ValueError):
    """A restore request that cannot be honoured (bad settings); says what to send instead."""


def _store_config(properties: Mapping[str, Any]) -> OffloadConfig:
    """The blob-store part of an ``offload`` section (policy keys such as the threshold are ignored:
    a restore only reads and deletes objects)."""
    known = {f.name for f in fields(OffloadConfig)}
    picked = {k: str(v) for k, v in properties.items() if k in known}
    if "managedLedgerOffloadDriver" not in picked:
        raise RestoreRequestError(
            "the offload section names no managedLedgerOffloadDriver; send the settings the data was "
            "offloaded with (driver, bucket/region/endpoint or fileSystemURI)"
        )
    try:
        return OffloadConfig.from_properties(picked)
    except OffloadConfigError as exc:
        raise RestoreRequestError(f"bad offload settings: {exc}") from exc


def request_restore(
    data_dir: Path, properties: Mapping[str, Any], configured: Sequence[OffloadConfig] = ()
) -> None:
    """Durably record that the next start of the pod on ``data_dir`` must restore every tier-only
    ledger from the blob store ``properties`` (Pulsar key names) describe. Checked before writing:
    when the pod's settings name tiers (``configured``), the request must name one of them."""
    config = _store_config(properties)
    if configured and config.location() not in {c.location() for c in configured}:
        tiers = sorted({c.describe_location() for c in configured})
        raise RestoreRequestError(
            f"the restore names the tier {config.describe_location()}, but this pod's tier is "
            f"{' or '.join(tiers)}: a restore reads the ledgers back from it and then deletes the "
            "segments' objects, so it must name the tier the data was offloaded to"
        )
    statefile.write(data_dir / REQUEST_FILE, REQUEST_KIND, REQUEST_VERSION, {"offload": dict(properties)})


def restore_requested(data_dir: Path) -> bool:
    return (data_dir / REQUEST_FILE).is_file()


async def restore_if_requested(
    data_dir: Path, ledgers_root: Path, *, store_factory: Callable[[OffloadConfig], BlobStore] | None = None
) -> list[RestoreResult] | None:
    """At start, before any ledger opens: carry out a recorded restore request (then remove it).
    None when there was none. Raises RestoreError/RestoreRequestError/StateFileError naming the
    problem; the request stays, so the next start tries again."""
    path = data_dir / REQUEST_FILE
    doc = statefile.read(
        path,
        REQUEST_KIND,
        frozenset({REQUEST_VERSION}),
        remedy="delete it and ask for the restore again (POST /admin/v1/offload/restore)",
    )
    if doc is None:
        return None
    body = doc.body
    if not isinstance(body, dict) or not isinstance(body.get("offload"), dict):
        raise RestoreRequestError(f"{path} holds no offload section; delete it and request the restore again")
    config = _store_config(body["offload"])
    store = store_factory(config) if store_factory is not None else open_blob_store(config)
    try:
        results = await restore_root(ledgers_root, store, where=config.describe_location())
    finally:
        await store.close()
    left = inventory(ledgers_root)
    if left.needs_offload:
        raise RestoreError(
            f"after the restore {len(left.needs_offload)} managed ledger(s) still have metadata version 2 "
            f"(first: {left.needs_offload[0].directory}); the request in {path} is kept"
        )
    path.unlink()
    statefile.DEFAULT_OPS.sync_dir(data_dir)
    log.info("offload restore request carried out: %d managed ledger(s) restored", len(results))
    return results
