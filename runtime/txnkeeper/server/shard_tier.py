"""The target's check, before a received shard is installed, that every ledger the shard holds only
in the offload tier (PIP-76: its local file deleted after its segments were complete) can be read
from this pod's tier (docs/contracts.md §12, "Offloaded ledgers").

Why its own module: such ledgers move as metadata only; the target then reads them from the tier its
own settings name. That is right only when both pods share the tier (in Kubernetes the pods of one
resource do), so the proof is that the objects of every segment the moved metadata needs are there,
in this pod's tier, before the switch: a missing object fails the receive (nothing installed, the
move rolls back and the source keeps serving), never a read after the move.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from txnkeeper.ledger.ledger_file import ledger_file_name
from txnkeeper.ledger.metadata import METADATA_FILE, ManagedLedgerMetadata
from txnkeeper.ledger.offload import OffloadConfig, OffloadError, open_store
from txnkeeper.ledger.offload.writer import data_key, index_key
from txnkeeper.ledger.recovery import LEDGERS_DIR
from txnkeeper.server import shard_files as sf


def tier_segments(staged: Path, units: list[str]) -> dict[str, list[str]]:
    """Per ledger directory unit: the uuids of the Offloaded segments holding entries of a ledger
    whose local file is gone (blocking)."""
    out: dict[str, list[str]] = {}
    for unit, meta in sf.ledger_metadata(staged, units):
        gone = {i.ledger_id for i in meta.ledgers if i.offloaded}
        uuids = [
            s.uuid
            for s in meta.segments
            if s.status == "Offloaded"
            and s.end is not None
            and any(s.begin.ledger_id <= ledger <= s.end.ledger_id for ledger in gone)
        ]
        if uuids:
            out[unit] = uuids
    return out


async def missing_objects(config: OffloadConfig, uuids: list[str]) -> list[str]:
    """The keys of the segments' data and index objects this tier does not have (or cannot read)."""
    store = open_store(config)
    missing: list[str] = []
    try:
        for uuid in uuids:
            for key in (data_key(uuid), index_key(uuid)):
                try:
                    await store.length(key)
                except (OffloadError, OSError):
                    missing.append(key)
    finally:
        await store.close()
    return missing


def describe(shard: int, move: str, where: str, missing: list[str], topic: str | Any) -> str:
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (
        f"shard {shard}, move {move!r}: {topic} holds ledgers only in the offload tier, and this pod's"
        f" tier ({where}) lacks {shown}; nothing was installed: give this pod the same offload tier as"
        " the source (the pods of one resource share it), then retry the move"
    )


def _covered(meta: ManagedLedgerMetadata, ledger_id: int, entries: int) -> list[str] | None:
    """The uuids of the Offloaded segments that together hold every entry of a closed ledger, or None
    when some entry is in none of them."""
    done = [s for s in meta.segments if s.status == "Offloaded" and s.end is not None]
    uuids: list[str] = []
    entry = 0
    while entry < entries:
        here = next(
            (
                s
                for s in done
                if s.end is not None
                and (s.begin.ledger_id, s.begin.entry_id)
                <= (ledger_id, entry)
                <= (s.end.ledger_id, s.end.entry_id)
            ),
            None,
        )
        if here is None or here.end is None:
            return None
        uuids.append(here.uuid)
        entry = entries if here.end.ledger_id > ledger_id else here.end.entry_id + 1
    return uuids


def tier_held_files(data_dir: Path, units: list[str]) -> set[str]:
    """Closed ledgers' files still local whose every entry is in Offloaded segments (deletion lag not
    passed): a target whose tier holds those segments need not copy them (blocking)."""
    found: set[str] = set()
    for unit, meta in sf.ledger_metadata(data_dir, units):
        for info in meta.ledgers:
            if info.closed and not info.offloaded and _covered(meta, info.ledger_id, info.entries):
                found.add(f"{unit}/{LEDGERS_DIR}/{ledger_file_name(info.ledger_id)}")
    return found


def tier_uuids_of(staged: Path, paths: list[str]) -> tuple[dict[str, list[str]], dict[str, list[int]]]:
    """For tier-held files left out of a receive: per ledger directory unit, the segments the staged
    metadata says hold them and the ledger ids (blocking). A ledger the staged metadata does not show
    fully offloaded is left out of both (the caller pulls its file)."""
    wanted: dict[str, list[int]] = {}
    for rel in paths:
        wanted.setdefault(sf.unit_of(rel), []).append(int(Path(rel).stem))
    uuids: dict[str, list[str]] = {}
    ledgers: dict[str, list[int]] = {}
    for unit, meta in sf.ledger_metadata(staged, wanted):  # each unit's metadata read once
        for ledger_id in wanted[unit]:
            info = meta.find(ledger_id)
            held = _covered(meta, ledger_id, info.entries) if info is not None and info.closed else None
            if held:
                uuids.setdefault(unit, []).extend(held)
                ledgers.setdefault(unit, []).append(ledger_id)
    return uuids, ledgers


def mark_offloaded(staged: Path, unit: str, ledger_ids: list[int]) -> None:
    """Record in the staged metadata that these ledgers are read from the tier (their local files were
    not copied), as the offloader does when it deletes a local copy (blocking, fsync'd)."""
    meta_path = staged / unit / METADATA_FILE
    meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
    for info in meta.ledgers:
        if info.ledger_id in ledger_ids:
            info.offloaded = True
    tmp = meta_path.with_name(METADATA_FILE + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(meta.encode())
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(meta_path)
    sf.fsync_dir(meta_path.parent)
