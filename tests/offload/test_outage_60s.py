"""Issue 13's acceptance, at full length: the blob store down for 60 s while producing continuously.

Why a test of its own: the streaming tests take the store away only for as long as it takes to see the
segment fail. Here it stays away a full minute (the outage itself is what is under test, so the
producer runs until 60 s of outage have elapsed, measured on the monotonic clock) while a producer keeps
appending: every append must succeed, the segment must go Failed during the outage, be retried and end
Offloaded after it, and every acknowledged entry must read back once, with its data. Filesystem driver
(the tier directory renamed away) and MinIO (its process stopped, then started again on the same port).
Marked ``soak``: bounded, so every test run includes it (it adds about 2 x 60 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offload import OffloadConfig
from txnkeeper.ledger.offload.offloader import Offloader, OffloadPolicy

from .conftest import Clock, wait_for

pytestmark = [pytest.mark.soak, pytest.mark.wallclock, pytest.mark.timeout(600)]

NAME = "persistent://public/default/outage"
OUTAGE_SECONDS = 60.0
# Appends are paced (this is the application's send rate, not a synchronisation) so a loaded machine
# still appends steadily through the whole minute without writing thousands of ledgers.
SEND_INTERVAL = 0.05
RETRY_INTERVAL = 2.0  # offloadRetryIntervalSeconds: no retry storm while the store is down


def make_policy(config: OffloadConfig, clock: Clock, **kw: object) -> OffloadPolicy:
    settings: dict[str, object] = {
        "managedLedgerOffloadThresholdInBytes": 0,
        "managedLedgerOffloadDeletionLagMs": 0,
        "maxOffloadSegmentSizeInBytes": 1 << 30,
        "offloadRetryIntervalSeconds": RETRY_INTERVAL,
        "clock": clock,
    }
    settings.update(kw)
    return OffloadPolicy(config, **settings)  # type: ignore[arg-type]


def ml_config(policy: OffloadPolicy) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=200, max_ledger_age_seconds=None, offload=policy)


async def produce_through_outage(
    ml: ManagedLedger, off: Offloader, clock: Clock, start: int
) -> tuple[list[tuple[Position, bytes]], int]:
    """Append continuously for OUTAGE_SECONDS (and until the segment was seen Failed), returning what
    was acknowledged and how many store errors the offloader met meanwhile. Any append failing fails
    the test: that is the acceptance."""
    began = time.monotonic()
    errors_before = off.stats.offload_error
    clock.now += 601  # the open segment is due to close by time: that close meets the dead store
    off.notify()
    acked: list[tuple[Position, bytes]] = []
    seen_failed = False
    n = start
    while time.monotonic() - began < OUTAGE_SECONDS or not seen_failed:
        payload = f"m-{n}".encode()
        acked.append((await ml.add_entry(payload), payload))
        n += 1
        if not seen_failed and off.segment_counts()["Failed"] == 1:
            seen_failed = True
            assert off.status()["status"] == "ERROR"
        if time.monotonic() - began > 5 * OUTAGE_SECONDS:
            raise AssertionError("the segment never went Failed while the blob store was down")
        await asyncio.sleep(SEND_INTERVAL)
    return acked, off.stats.offload_error - errors_before


async def run_outage(
    ml: ManagedLedger, clock: Clock, store_down: Callable[[], object], store_up: Callable[[], object]
) -> None:
    off = ml.offloader
    assert off is not None
    acked = [(await ml.add_entry(f"m-{i}".encode()), f"m-{i}".encode()) for i in range(3)]
    await wait_for(lambda: off.streamed_until() == acked[-1][0], "the first entries streamed", 120)
    begin = off.segments()[0].begin
    store_down()
    during, errors = await produce_through_outage(ml, off, clock, len(acked))
    acked += during
    # The offloader met the dead store (and may retry while down, every RETRY_INTERVAL at most; an
    # S3 attempt can take longer than that with its connect retries); producing was unaffected.
    assert errors >= 1
    assert len(during) > 100  # appends went on through the minute
    store_up()
    last = acked[-1][0]
    await wait_for(lambda: off.streamed_until() == last, "the retried segment streamed", 180)
    await off.offload()
    assert [(s.begin, s.end) for s in off.segments() if s.status == "Offloaded"] == [(begin, last)]
    assert off.segment_counts() == {"Assigned": 0, "Offloaded": 1, "Failed": 0}
    entries = await ml.read_entries(Position(1, 0), len(acked) + 10)
    assert [(e.position, e.data) for e in entries] == acked  # each acknowledged entry once, in order


async def test_filesystem_tier_gone_60s_while_producing(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    hidden = tmp_path / "tier-unmounted"
    clock = Clock()
    config = OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024)
    ml = await opened(tmp_path / "data").open(NAME, ml_config(make_policy(config, clock)))
    await run_outage(ml, clock, lambda: tier.rename(hidden), lambda: hidden.rename(tier))


async def test_minio_stopped_60s_while_producing(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    from .conftest import (
        MinioServer,
        launch_minio,
        launch_own_minio,
        make_bucket,
        stop_minio,
        stoppable_s3_tier,
    )

    binary, first = launch_own_minio(tmp_path / "minio")  # its own: it is stopped
    servers: list[MinioServer] = [first]
    try:
        bucket = make_bucket(servers[0])
        config, s3 = stoppable_s3_tier(bucket, servers[0].endpoint)

        def restart() -> None:
            port = int(servers[0].endpoint.rsplit(":", 1)[1])
            servers.append(launch_minio(binary, tmp_path / "minio", port))

        clock = Clock()
        policy = make_policy(config, clock, store_factory=s3)
        ml = await opened(tmp_path / "data").open(NAME, ml_config(policy))
        await run_outage(ml, clock, lambda: stop_minio(servers[0]), restart)
    finally:
        for server in servers:
            stop_minio(server)
