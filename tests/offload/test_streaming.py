"""PIP-76 streaming of the open ledger, segment close by size/time/manual, `ledger` mode and switching.

Real managed ledgers on disk and a real filesystem blob store. Segment ages come from an injected clock
(advanced by the test, never slept on); background progress is awaited with deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offload import (
    BlobStore,
    FileSystemBlobStore,
    OffloadConfig,
    OffloadConfigError,
    OffloadCorruptionError,
)
from txnkeeper.ledger.offload.offloader import Offloader, OffloadPolicy

from .conftest import Clock, wait_for

NAME = "persistent://public/default/streamed"


def policy(tier: Path, clock: Clock, **kw: object) -> OffloadPolicy:
    config = OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024)
    settings: dict[str, object] = {
        "managedLedgerOffloadDeletionLagMs": 0,
        "managedLedgerOffloadThresholdInBytes": 0,
        "offloadRetryIntervalSeconds": 0.1,
        "clock": clock,
    }
    settings.update(kw)
    return OffloadPolicy(config, **settings)  # type: ignore[arg-type]


def ml_config(offload: OffloadPolicy | None) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=10, max_ledger_age_seconds=None, offload=offload)


async def produce(ml: ManagedLedger, count: int, start: int = 0) -> list[Position]:
    return [await ml.add_entry(f"m-{i}".encode()) for i in range(start, start + count)]


def offloaded(off: Offloader) -> list[tuple[Position, Position | None]]:
    return [(s.begin, s.end) for s in off.segments() if s.status == "Offloaded"]


def tier_of(tmp_path: Path) -> Path:
    tier = tmp_path / "tier"
    tier.mkdir(exist_ok=True)
    return tier


async def test_the_open_ledger_is_streamed_and_segments_close_by_size(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    clock = Clock()
    factory = opened(tmp_path / "data")
    # 7 entries of 3-4 bytes per segment: segments close by size while the ledger is still open
    ml = await factory.open(
        NAME, ml_config(policy(tier_of(tmp_path), clock, maxOffloadSegmentSizeInBytes=24))
    )
    off = ml.offloader
    assert off is not None
    acked = await produce(ml, 8)  # all in ledger 1, which stays open (10 entries per ledger)
    await wait_for(lambda: bool(offloaded(off)), "a segment closed by size")
    assert ml.current_ledger_id() == 1
    first_begin, first_end = offloaded(off)[0]
    assert first_begin == Position(1, 0) and first_end is not None and first_end.ledger_id == 1
    assert first_end == Position(1, 7)  # 8 entries of 3 bytes: cut mid-ledger, in the open ledger
    # Entries of the open ledger in Offloaded segments read back from the tier exactly.
    segment = next(s for s in off.segments() if s.status == "Offloaded")
    assert await off.read(1, 0, first_end.entry_id + 1) == [
        f"m-{i}".encode() for i in range(first_end.entry_id + 1)
    ]
    # Producing goes on into later ledgers; every acked entry ends up in exactly one segment.
    acked += await produce(ml, 22, 8)
    await wait_for(
        lambda: off.streamed_until() == acked[-1] or offloaded(off)[-1][1] == acked[-1], "the stream"
    )
    done = await off.offload()  # manual: closes the current segment at the durable end
    assert offloaded(off)[-1][1] == acked[-1]
    assert all(s.status == "Offloaded" for s in done)
    held = [Position(lid, e) for begin, end in offloaded(off) for lid, e in _positions(ml, begin, end)]
    assert held == acked  # no gap, no duplicate across segments
    assert segment.uuid in {s.uuid for s in off.segments()}
    # closed ledgers fully held are deleted locally (lag 0) and still read, from the tier
    await wait_for(lambda: 1 not in ml._files, "ledger 1's local file deleted")
    entries = await ml.read_entries(Position(1, 0), 100)
    assert [e.data for e in entries] == [f"m-{i}".encode() for i in range(30)]
    assert off.status()["status"] == "SUCCESS" and off.lag_bytes() == 0


def _positions(ml: ManagedLedger, begin: Position, end: Position | None) -> list[tuple[int, int]]:
    assert end is not None
    out = []
    for lid in range(begin.ledger_id, end.ledger_id + 1):
        first = begin.entry_id if lid == begin.ledger_id else 0
        last = end.entry_id if lid == end.ledger_id else 9
        out += [(lid, e) for e in range(first, last + 1)]
    return out


async def test_segments_close_by_time_not_before_the_min_rollover_time(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    clock = Clock()
    factory = opened(tmp_path / "data")
    pol = policy(
        tier_of(tmp_path),
        clock,
        maxOffloadSegmentSizeInBytes=10,
        minOffloadSegmentRolloverTimeInSeconds=60,
        maxOffloadSegmentRolloverTimeInSeconds=600,
    )
    ml = await factory.open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = await produce(ml, 5)  # 15 bytes: over the size, but the segment is younger than 60 s
    await wait_for(lambda: off.streamed_until() == acked[-1], "the entries streamed")
    off.notify()
    await asyncio.sleep(0)
    assert offloaded(off) == [] and off.segment_counts()["Assigned"] == 1
    clock.now += 61  # old enough: the next entry closes it by size
    acked += await produce(ml, 1, 5)
    await wait_for(lambda: offloaded(off) == [(Position(1, 0), acked[-1])], "close by size after min time")
    # A quiet stream closes by time alone once maxOffloadSegmentRolloverTimeInSeconds passed.
    await set_policy(ml, replace(pol, maxOffloadSegmentSizeInBytes=1 << 30))
    acked += await produce(ml, 2, 6)
    await wait_for(lambda: off.streamed_until() == acked[-1], "the next segment streamed")
    assert len(offloaded(off)) == 1
    clock.now += 601
    off.notify()
    await wait_for(lambda: len(offloaded(off)) == 2, "close by time")
    assert offloaded(off)[1] == (Position(1, 6), acked[-1])


async def set_policy(ml: ManagedLedger, pol: OffloadPolicy) -> None:
    ml.set_offload_policy(pol)
    await asyncio.sleep(0)


async def test_switching_to_ledger_mode_closes_the_current_segment_and_then_one_segment_per_ledger(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    clock = Clock()
    factory = opened(tmp_path / "data")
    pol = policy(tier_of(tmp_path), clock, managedLedgerOffloadDeletionLagMs=3600_000)
    ml = await factory.open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = await produce(ml, 4)
    await wait_for(lambda: off.streamed_until() == acked[-1], "the entries streamed")
    await set_policy(ml, replace(pol, offloadMode="ledger"))
    await wait_for(
        lambda: offloaded(off) == [(Position(1, 0), Position(1, 3))], "the streaming segment closed"
    )
    acked += await produce(ml, 26, 4)  # ledgers 1 and 2 close, ledger 3 is open
    await wait_for(lambda: len(offloaded(off)) == 3, "one segment per closed ledger")
    assert offloaded(off)[1:] == [(Position(1, 4), Position(1, 9)), (Position(2, 0), Position(2, 9))]
    assert off.streamed_until() is None
    # and back to streaming: the open ledger is streamed from where ledger mode stopped
    await set_policy(ml, pol)
    await wait_for(lambda: off.streamed_until() == acked[-1], "streaming again")
    await off.offload()
    assert offloaded(off)[-1] == (Position(3, 0), acked[-1])


async def test_historical_closed_ledgers_are_streamed_when_offload_is_enabled(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(None))
    acked = await produce(ml, 25)
    await factory.close()
    clock = Clock()
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier_of(tmp_path), clock)))
    off = ml.offloader
    assert off is not None
    await wait_for(lambda: off.streamed_until() == acked[-1], "the old ledgers streamed")
    (segment,) = await off.offload()
    assert (segment.begin, segment.end) == (Position(1, 0), acked[-1])


async def test_enabling_offload_live_on_a_managed_ledger_without_it(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(None))
    acked = await produce(ml, 3)
    ml.set_offload_policy(policy(tier_of(tmp_path), Clock(), managedLedgerOffloadThresholdInBytes=-1))
    assert ml.offloader is not None
    (segment,) = await ml.offloader.offload()
    assert segment.end == acked[-1]
    other = OffloadConfig(fileSystemURI=str(tmp_path / "elsewhere"))
    with pytest.raises(OffloadConfigError, match="cannot change on a live managed ledger"):
        ml.set_offload_policy(OffloadPolicy(other))


async def test_store_down_while_streaming_never_fails_producing_and_the_failed_segment_is_retried(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    clock = Clock()
    tier = tier_of(tmp_path)
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(policy(tier, clock, maxOffloadSegmentSizeInBytes=1 << 30)))
    off = ml.offloader
    assert off is not None
    acked = await produce(ml, 3)
    await wait_for(lambda: off.streamed_until() == acked[-1], "the entries streamed")
    begin = off.segments()[0].begin
    hidden = tmp_path / "tier-unmounted"
    tier.rename(hidden)  # the volume goes away under an open segment
    acked += await produce(ml, 12, 3)
    clock.now += 601  # the close by time fails: the store is gone
    off.notify()
    await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the segment recorded Failed")
    failed = next(s.uuid for s in off.segments() if s.status == "Failed")
    assert off.status()["status"] == "ERROR" and off.stats.offload_error >= 1
    for n in range(15, 40):  # producing never fails while the store is down
        acked.append(await ml.add_entry(f"m-{n}".encode()))
    hidden.rename(tier)
    await wait_for(lambda: off.streamed_until() == acked[-1], "the retried segment streamed")
    assert failed not in {s.uuid for s in off.segments()}
    retried = next(s for s in off.segments() if s.status == "Assigned")
    assert retried.begin == begin  # the Failed segment is retried from its begin, not skipped
    await off.offload()
    assert offloaded(off) == [(begin, acked[-1])]
    entries = await ml.read_entries(Position(1, 0), 1000)
    assert [e.position for e in entries] == acked


@pytest.fixture(params=["filesystem", "s3"])
def driver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[OffloadConfig, Callable[[str], bytes], Any]:
    """(config, get object, put object) of each driver; s3 on the session's real MinIO."""
    if request.param == "filesystem":
        tier = tier_of(tmp_path)
        config = OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024)
        return config, lambda key: (tier / key).read_bytes(), lambda key, data: (tier / key).write_bytes(data)
    from .conftest import make_bucket, s3_client

    server = request.getfixturevalue("minio")
    bucket = make_bucket(server)
    config = OffloadConfig(
        managedLedgerOffloadDriver="S3",
        managedLedgerOffloadBucket=bucket,
        managedLedgerOffloadServiceEndpoint=server.endpoint,
        managedLedgerOffloadRegion="us-east-1",
        managedLedgerOffloadMaxBlockSizeInBytes=1024,
    )
    client = s3_client(server)
    request.addfinalizer(client.close)
    return (
        config,
        lambda key: client.get_object(Bucket=bucket, Key=key)["Body"].read(),
        lambda key, data: client.put_object(Bucket=bucket, Key=key, Body=data),
    )


def store_factory(config: OffloadConfig) -> BlobStore:
    if not config.is_s3:
        return FileSystemBlobStore(config.fileSystemURI)
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    from .conftest import ACCESS_KEY, SECRET_KEY

    return S3BlobStore(
        config.managedLedgerOffloadBucket,
        endpoint=config.managedLedgerOffloadServiceEndpoint,
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )


async def test_streamed_segments_on_both_drivers_read_back_and_a_flipped_byte_is_refused(
    tmp_path: Path,
    opened: Callable[[Path], ManagedLedgerFactory],
    driver: tuple[OffloadConfig, Callable[[str], bytes], Any],
) -> None:
    config, get, put = driver
    clock = Clock()
    pol = OffloadPolicy(
        config,
        managedLedgerOffloadThresholdInBytes=0,
        managedLedgerOffloadDeletionLagMs=0,
        maxOffloadSegmentSizeInBytes=200,
        offloadRetryIntervalSeconds=0.1,
        clock=clock,
        store_factory=store_factory,
    )
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(f"payload-{i:04d}".encode()) for i in range(25)]
    await wait_for(lambda: off.streamed_until() == acked[-1] or bool(offloaded(off)), "streaming")
    await off.offload()
    assert offloaded(off)[0][0] == Position(1, 0) and offloaded(off)[-1][1] == acked[-1]
    assert await off.read(1, 0, 10) == [f"payload-{i:04d}".encode() for i in range(10)]
    assert await off.read(3, 0, 5) == [f"payload-{i:04d}".encode() for i in range(20, 25)]  # the open ledger
    segment = next(s for s in off.segments() if s.status == "Offloaded")
    raw = bytearray(get(segment.uuid))
    raw[128 + 12 + 2] ^= 0x01  # inside the first entry of the first block
    put(segment.uuid, bytes(raw))
    await factory.close()  # blocks already read were checked and are cached: reopen to read afresh
    factory = opened(tmp_path / "data")
    ml = await factory.open(NAME, ml_config(pol))
    assert ml.offloader is not None
    with pytest.raises(OffloadCorruptionError) as err:
        await ml.read_entry(Position(1, 0))  # ledger 1's local file is gone: read from the tier
    assert segment.uuid in str(err.value) and "part 1" in str(err.value) and "offset" in str(err.value)
    assert ml.offloader.stats.read_offload_error == 1


async def test_minio_stopped_while_streaming_never_fails_producing_and_the_segment_is_retried(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    from .conftest import (
        launch_minio,
        launch_own_minio,
        make_bucket,
        stop_minio,
        stoppable_s3_tier,
    )

    binary, server = launch_own_minio(tmp_path / "minio")  # its own MinIO: this test stops it
    try:
        bucket = make_bucket(server)
        config, s3 = stoppable_s3_tier(bucket, server.endpoint)

        clock = Clock()
        pol = OffloadPolicy(
            config,
            managedLedgerOffloadThresholdInBytes=0,
            managedLedgerOffloadDeletionLagMs=0,
            maxOffloadSegmentSizeInBytes=1 << 30,
            offloadRetryIntervalSeconds=0.2,
            clock=clock,
            store_factory=s3,
        )
        factory = opened(tmp_path / "data")
        ml = await factory.open(NAME, ml_config(pol))
        off = ml.offloader
        assert off is not None
        acked = await produce(ml, 3)
        await wait_for(lambda: off.streamed_until() == acked[-1], "the entries streamed")
        begin = off.segments()[0].begin
        stop_minio(server)
        acked += await produce(ml, 12, 3)  # producing never fails while the store is down
        clock.now += 601  # the close by time fails: MinIO is gone
        off.notify()
        await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the segment recorded Failed", 120)
        acked += await produce(ml, 10, 15)
        server = launch_minio(binary, tmp_path / "minio", int(server.endpoint.rsplit(":", 1)[1]))
        await wait_for(lambda: off.streamed_until() == acked[-1], "the retried segment streamed", 120)
        await off.offload()
        assert offloaded(off) == [(begin, acked[-1])]  # retried from the Failed segment's begin
        assert off.segment_counts() == {"Assigned": 0, "Offloaded": 1, "Failed": 0}
        assert [e.position for e in await ml.read_entries(Position(1, 0), 1000)] == acked
    finally:
        stop_minio(server)


async def test_a_clean_close_finishes_the_streaming_segment(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier_of(tmp_path), Clock())))
    off = ml.offloader
    assert off is not None
    acked = await produce(ml, 4)
    await wait_for(lambda: off.streamed_until() == acked[-1], "the entries streamed")
    uuid = off.segments()[0].uuid
    await factory.close()
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(policy(tier_of(tmp_path), Clock())))
    assert ml.offloader is not None
    # Offloaded at close, so the first pass after open finds no orphan to delete and retry.
    assert [(s.uuid, s.status, s.end) for s in ml.offloader.segments()] == [(uuid, "Offloaded", acked[-1])]
    assert await ml.offloader.read(1, 0, 4) == [f"m-{i}".encode() for i in range(4)]
