"""A real tier for verify-offload's tests: a managed ledger that offloaded segments to a filesystem
blob store, small enough that one topic yields several segments (several Spark partitions)."""

from __future__ import annotations

from pathlib import Path

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.offload import OffloadConfig
from txnkeeper.ledger.offload.offloader import OffloadPolicy

TOPIC = "persistent://public/default/audited"


async def offload_topic(root: Path, tier: Path, entries: int) -> None:
    policy = OffloadPolicy(
        OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024),
        managedLedgerOffloadDeletionLagMs=0,
        maxOffloadSegmentSizeInBytes=400,
    )
    factory = ManagedLedgerFactory(root)
    try:
        ml = await factory.open(
            TOPIC, ManagedLedgerConfig(max_entries_per_ledger=10, max_ledger_age_seconds=None, offload=policy)
        )
        for i in range(entries):
            await ml.add_entry(f"m-{i:04d}".encode() * 8)
        assert ml.offloader is not None
        await ml.offloader.offload()
    finally:
        await factory.close()
