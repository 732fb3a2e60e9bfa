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

from pathlib import Path
from typing import Any

from txnkeeper.ledger.errors import CorruptMetadataError
from txnkeeper.ledger.metadata import METADATA_FILE, ManagedLedgerMetadata
from txnkeeper.ledger.offload import OffloadConfig, OffloadError, open_store
from txnkeeper.ledger.offload.writer import data_key, index_key
from txnkeeper.server import shard_files as sf


def tier_segments(staged: Path, units: list[str]) -> dict[str, list[str]]:
    """Per ledger directory unit: the uuids of the Offloaded segments holding entries of a ledger
    whose local file is gone (blocking)."""
    out: dict[str, list[str]] = {}
    for unit in units:
        if not unit.startswith(sf.LEDGERS + "/"):
            continue
        meta_path = staged / unit / METADATA_FILE
        if not meta_path.is_file():
            continue
        try:
            meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
        except (OSError, CorruptMetadataError):
            continue  # installed as received; opening it reports the damage, as after a restart
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
