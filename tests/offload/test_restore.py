"""Downgrade 3 -> 2: tier-only ledgers copied back and metadata rewritten as version 1.

Real ledgers on disk and a real filesystem blob store; the restored directory is then opened by a
managed ledger without offload configured (what a 2.x pod does) and must read every entry locally.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerFactory, Position
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.offload.filesystem import FileSystemBlobStore
from txnkeeper.ledger.offload.restore import (
    RestoreError,
    RestoreRequestError,
    inventory,
    request_restore,
    restore_directory,
    restore_if_requested,
    restore_requested,
    restore_root,
)

from .test_managed_offload import NAME, ml_config, policy, produce, read_all


async def offloaded_volume(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> tuple[Path, Path]:
    tier = tmp_path / "tier"
    tier.mkdir()
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier)))
    await produce(ml, 25)
    assert ml.offloader is not None
    await ml.offloader.offload()
    await factory.close()
    return root, tier


async def test_restore_brings_tier_only_ledgers_back_and_writes_version_1(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root, tier = await offloaded_volume(tmp_path, opened)
    before = inventory(root)
    assert before.max_metadata_version == 2 and before.tier_only_ledgers == 2
    assert before.to_json()["segments"] == {"Offloaded": 1}
    assert [s["name"] for s in before.to_json()["stores"]] == [NAME]

    store = FileSystemBlobStore(tier)
    results = await restore_root(root, store)
    assert [(r.restored_ledgers, r.restored_entries) for r in results] == [([1, 2], 20)]
    assert len(results[0].deleted_segments) == 1 and results[0].leftover_objects == []
    after = inventory(root)
    assert after.max_metadata_version == 1 and after.tier_only_ledgers == 0
    assert after.to_json()["stores"] == []
    assert [p for p in tier.rglob("*") if p.is_file()] == []  # the segment's objects are gone

    # A 2.x pod opens it without offload configured and reads every entry from local files.
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(None))
    assert await read_all(ml) == [f"m-{i}".encode() for i in range(25)]
    assert await ml.read_entry(Position(1, 3)) == b"m-3"
    await factory.close()
    # Restoring again is a no-op.
    again = await restore_directory(root / encode_name(NAME), store)
    assert again.restored_ledgers == [] and again.deleted_segments == []


async def test_a_damaged_tier_is_refused_and_nothing_changes(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root, tier = await offloaded_volume(tmp_path, opened)
    data = next(p for p in tier.rglob("*") if p.is_file() and not p.name.endswith("-index"))
    raw = bytearray(data.read_bytes())
    raw[200] ^= 0xFF  # inside the first block's entries
    data.write_bytes(bytes(raw))
    meta_before = (root / encode_name(NAME) / "meta.json").read_bytes()
    with pytest.raises(RestoreError, match=rf"ledger 1 of managed ledger {NAME!r}.*damaged in the tier"):
        await restore_directory(root / encode_name(NAME), FileSystemBlobStore(tier))
    assert (root / encode_name(NAME) / "meta.json").read_bytes() == meta_before
    assert inventory(root).tier_only_ledgers == 2


async def test_a_missing_object_is_refused_saying_what_to_do(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root, tier = await offloaded_volume(tmp_path, opened)
    for path in tier.rglob("*"):
        if path.is_file():
            path.unlink()
    with pytest.raises(RestoreError, match="nothing was changed"):
        await restore_directory(root / encode_name(NAME), FileSystemBlobStore(tier))
    assert inventory(root).max_metadata_version == 2


async def test_a_restore_request_survives_a_failed_restore_and_then_completes(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root, tier = await offloaded_volume(tmp_path, opened)
    data = tmp_path / "pod"
    data.mkdir()
    with pytest.raises(RestoreRequestError, match="managedLedgerOffloadDriver"):
        request_restore(data, {"fileSystemURI": str(tier)})
    assert not restore_requested(data)
    assert await restore_if_requested(data, root) is None  # nothing asked: nothing done

    # Asked with a location that is not mounted: refused, nothing changed, the request kept.
    request_restore(
        data, {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tmp_path / "gone")}
    )
    with pytest.raises(RestoreError, match="nothing was changed"):
        await restore_if_requested(data, root)
    assert restore_requested(data) and inventory(root).tier_only_ledgers == 2

    request_restore(
        data,
        {
            "managedLedgerOffloadDriver": "filesystem",
            "fileSystemURI": str(tier),
            "managedLedgerOffloadThresholdInBytes": 0,  # policy keys are ignored by a restore
        },
    )
    results = await restore_if_requested(data, root)
    assert results is not None and [r.restored_ledgers for r in results] == [[1, 2]]
    assert not restore_requested(data) and inventory(root).max_metadata_version == 1


# --- issue 25 item 13: a restore names the tier the data is in, or changes nothing ----------------------


@pytest.mark.parametrize("uri", ["../../../etc", "tier", "./tier", "/abs/with\x00nul"])
def test_a_relative_tier_path_is_refused_and_nothing_is_recorded(tmp_path: Path, uri: str) -> None:
    with pytest.raises(RestoreRequestError, match="must be an absolute directory path"):
        request_restore(tmp_path, {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": uri})
    assert not restore_requested(tmp_path)


async def test_a_restore_that_finds_none_of_the_segments_changes_nothing(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    """Before, a restore pointed at a tier without the segments "restored 0" ledgers (every ledger was
    still local), rewrote the metadata as version 1 and dropped the segment records: the real tier's
    objects were orphaned for good."""
    tier = tmp_path / "tier"
    tier.mkdir()
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier, managedLedgerOffloadDeletionLagMs=3_600_000)))
    await produce(ml, 25)
    assert ml.offloader is not None
    await ml.offloader.offload()
    await factory.close()
    assert inventory(root).tier_only_ledgers == 0 and inventory(root).max_metadata_version == 2
    meta = root / encode_name(NAME) / "meta.json"
    meta_before = meta.read_bytes()
    objects = sorted(p.name for p in tier.rglob("*") if p.is_file())
    assert objects

    data = tmp_path / "pod"
    data.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    request_restore(data, {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(elsewhere)})
    with pytest.raises(RestoreError, match="holds none of the 1 Offloaded segment") as info:
        await restore_if_requested(data, root)
    assert f"filesystem {elsewhere}" in str(info.value) and "nothing was changed" in str(info.value)
    assert meta.read_bytes() == meta_before and restore_requested(data)
    assert sorted(p.name for p in tier.rglob("*") if p.is_file()) == objects

    request_restore(data, {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)})
    results = await restore_if_requested(data, root)
    assert results is not None and [len(r.deleted_segments) for r in results] == [1]
    assert inventory(root).max_metadata_version == 1 and not restore_requested(data)
    assert [p for p in tier.rglob("*") if p.is_file()] == []
