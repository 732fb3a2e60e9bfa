"""Offload wired into the managed ledger: segments in the metadata, read-through, deletion rules.

Real ledgers on disk and a real filesystem blob store; conditions are awaited with deadlines.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.offload import BlobStoreUnavailable, OffloadConfig, OffloadCorruptionError
from txnkeeper.ledger.offload.offloader import OffloadPolicy
from txnkeeper.ledger.recovery import LEDGERS_DIR

from .conftest import wait_for

NAME = "persistent://public/default/offloaded"


def policy(tier: Path, **kw: object) -> OffloadPolicy:
    config = OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024)
    settings: dict[str, object] = {"managedLedgerOffloadDeletionLagMs": 0}
    settings.update(kw)
    return OffloadPolicy(config, **settings)  # type: ignore[arg-type]


def ml_config(offload: OffloadPolicy | None) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=10, max_ledger_age_seconds=None, offload=offload)


def ledger_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / encode_name(NAME) / LEDGERS_DIR).iterdir())


def meta_version(root: Path) -> int:
    return int((root / encode_name(NAME) / "meta.json").read_bytes().split(b" ", 3)[2])


async def produce(ml: ManagedLedger, count: int, start: int = 0) -> list[Position]:
    return [await ml.add_entry(f"m-{i}".encode()) for i in range(start, start + count)]


async def read_all(ml: ManagedLedger) -> list[bytes]:
    entries = await ml.read_entries(Position(ml.ledger_ids()[0], 0), 1000)
    return [e.data for e in entries]


async def test_disabled_by_default_keeps_metadata_version_1(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    factory = opened(tmp_path)
    ml = await factory.open(NAME, ml_config(None))
    await produce(ml, 25)
    assert ml.offloader is None
    await factory.close()
    assert meta_version(tmp_path) == 1


async def test_manual_offload_deletes_local_files_and_reads_come_from_the_tier(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier)))
    await produce(ml, 25)
    assert ml.offloader is not None
    done = await ml.offloader.offload()
    assert [s.status for s in done] == ["Offloaded"]
    # streaming mode (the default): a manual offload takes every durable entry, the open ledger's too
    assert done[0].begin == Position(1, 0) and done[0].end == Position(3, 4)
    assert ledger_files(root) == ["ledger-0000000000000003.log"] or len(ledger_files(root)) == 1
    assert await read_all(ml) == [f"m-{i}".encode() for i in range(25)]
    assert await ml.read_entry(Position(1, 3)) == b"m-3"
    stats = ml.internal_stats()
    assert [s["offloaded"] for s in stats["ledgers"]] == [True, True, False]
    assert ml.offloader.status()["status"] == "SUCCESS"
    await factory.close()
    assert meta_version(root) == 2

    # Reopened, the segments are still recorded and the data still reads through.
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier)))
    assert [s.uuid for s in ml.offloader.segments()] == [done[0].uuid]  # type: ignore[union-attr]
    assert await read_all(ml) == [f"m-{i}".encode() for i in range(25)]
    await factory.close()


async def test_segments_are_cut_by_size_and_span_ledgers(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    factory = opened(tmp_path / "data")
    # 7 entries of 3-4 bytes per segment: segments end mid-ledger and cross ledger boundaries
    ml = await factory.open(NAME, ml_config(policy(tier, maxOffloadSegmentSizeInBytes=24)))
    await produce(ml, 31)
    assert ml.offloader is not None
    done = await ml.offloader.offload()
    assert len(done) >= 4
    for prev, nxt in itertools.pairwise(done):
        assert prev.end is not None
        assert (prev.end.ledger_id, prev.end.entry_id + 1) == (nxt.begin.ledger_id, nxt.begin.entry_id) or (
            prev.end.entry_id == 9 and nxt.begin == Position(prev.end.ledger_id + 1, 0)
        )
    assert any(s.end is not None and s.begin.ledger_id != s.end.ledger_id for s in done)
    assert done[-1].end == Position(4, 0)  # the open ledger's one entry too
    assert await read_all(ml) == [f"m-{i}".encode() for i in range(31)]
    await factory.close()


async def test_a_flipped_byte_in_a_block_is_a_clear_error_not_data(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(policy(tier)))
    await produce(ml, 15)
    assert ml.offloader is not None
    (segment,) = await ml.offloader.offload()
    data = tier / segment.uuid
    raw = bytearray(data.read_bytes())
    raw[128 + 12 + 1] ^= 0x01  # inside the first entry of the first block
    data.write_bytes(bytes(raw))
    with pytest.raises(OffloadCorruptionError) as err:
        await ml.read_entry(Position(1, 0))
    assert segment.uuid in str(err.value) and "part 1" in str(err.value)
    await factory.close()


async def test_an_unreadable_read_shows_in_the_status_until_a_read_of_it_succeeds(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    """Issue 25 item 9: a refused tier read left no trace (status SUCCESS, lastError ""). It is
    recorded until a read of those entries succeeds, which the offloader tries itself every retry
    interval, so a repaired tier clears without a reader; reads of other entries do not clear it."""
    tier = tmp_path / "tier"
    tier.mkdir()
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(policy(tier, offloadRetryIntervalSeconds=1.0)))
    await produce(ml, 15)
    assert ml.offloader is not None
    (segment,) = await ml.offloader.offload()
    data = tier / segment.uuid
    original = data.read_bytes()
    raw = bytearray(original)
    raw[128 + 12 + 1] ^= 0x01  # inside the first entry of the first block (ledger 1)
    data.write_bytes(bytes(raw))
    assert ml.offloader.status()["status"] == "SUCCESS"
    with pytest.raises(OffloadCorruptionError):
        await ml.read_entries(Position(1, 0), 10)
    assert await ml.read_entry(Position(2, 0)) == b"m-10"  # another block of the segment: readable
    status = ml.offloader.status()
    assert status["status"] == "ERROR" and status["tierReadErrors"] == 1, status
    assert status["lastError"].startswith(f"tier data unreadable: entries 1:0..1:9 (segment {segment.uuid}")
    assert "block CRC-32 is" in status["lastError"]
    (row,) = status["unreadableSegments"]
    assert (row["segment"], row["object"], row["entries"], row["kind"], row["failedReads"]) == (
        segment.uuid,
        segment.uuid,
        "1:0..1:9",
        "corrupt",
        1,
    )
    data.write_bytes(original)  # restored from a backup; no reader comes back
    await wait_for(lambda: ml.offloader is not None and not ml.offloader.unreadable, "the re-read clears it")
    assert ml.offloader.status()["status"] == "SUCCESS" and ml.offloader.status()["lastError"] == ""
    await factory.close()


async def test_objects_are_deleted_only_once_every_ledger_of_the_segment_is_trimmed(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(policy(tier, maxOffloadSegmentSizeInBytes=18)))
    await produce(ml, 25)
    cursor = await ml.open_cursor("sub")
    assert ml.offloader is not None
    segments = await ml.offloader.offload()
    spanning = next(
        s for s in segments if s.end is not None and s.begin.ledger_id == 1 and s.end.ledger_id == 2
    )
    await cursor.mark_delete(Position(1, 9))
    assert await ml.trim() == [1]
    await ml.offloader.offload()  # a pass: trimmed segments are handled before new work
    left = {s.uuid for s in ml.offloader.segments()}
    assert spanning.uuid in left and (tier / spanning.uuid).exists()
    only_first = [s for s in segments if s.end is not None and s.end.ledger_id == 1]
    assert only_first and all(s.uuid not in left and not (tier / s.uuid).exists() for s in only_first)
    assert await read_all(ml) == [f"m-{i}".encode() for i in range(10, 25)]
    await factory.close()


@pytest.mark.parametrize("down_seconds", [2.0])
async def test_store_down_never_fails_producing_and_the_failed_segment_is_retried(
    tmp_path: Path, down_seconds: float, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"  # missing: the filesystem driver reports BlobStoreUnavailable
    factory = opened(tmp_path / "data")
    pol = policy(
        tier, managedLedgerOffloadThresholdInBytes=0, offloadRetryIntervalSeconds=0.2, offloadMode="ledger"
    )
    ml = await factory.open(NAME, ml_config(pol))
    offloader = ml.offloader
    assert offloader is not None
    acked = await produce(ml, 15)
    with pytest.raises(BlobStoreUnavailable):
        await offloader.offload()
    assert [s.status for s in offloader.segments()] == ["Failed"]
    failed = offloader.segments()[0].uuid
    deadline = time.monotonic() + down_seconds
    n = 15
    while time.monotonic() < deadline:  # producing goes on while the store is down
        acked += await produce(ml, 1, n)
        n += 1
        await asyncio.sleep(0.05)
    tier.mkdir()
    await wait_for(lambda: any(s.status == "Offloaded" for s in offloader.segments()), "the background retry")
    assert failed not in {s.uuid for s in offloader.segments()}
    assert offloader.segments()[0].begin == Position(1, 0)
    assert [e.position for e in await ml.read_entries(Position(1, 0), 10_000)] == acked
    await factory.close()
