"""A pod whose volume holds offloaded ledgers (metadata version 2) needs a release with the
``offload-segments`` feature: a 2.x pod refuses to start naming the directory; a 3.x pod starts and
reports the volume's offload state at GET /admin/v1/offload/summary (what the operator's downgrade gate
reads). Real ``txnkeeper serve`` processes on a volume a real managed ledger offloaded to a directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime_pods import ServePod, http

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.offload import OffloadConfig
from txnkeeper.ledger.offload.offloader import OffloadPolicy

TOPIC = "persistent://public/default/offloaded"


async def _offload_into(ledgers: Path, tier: Path) -> None:
    policy = OffloadPolicy(
        OffloadConfig(fileSystemURI=str(tier), managedLedgerOffloadMaxBlockSizeInBytes=1024),
        managedLedgerOffloadDeletionLagMs=0,
    )
    factory = ManagedLedgerFactory(ledgers)
    try:
        config = ManagedLedgerConfig(max_entries_per_ledger=10, max_ledger_age_seconds=None, offload=policy)
        ml = await factory.open(TOPIC, config)
        for i in range(25):
            await ml.add_entry(f"m-{i}".encode())
        assert ml.offloader is not None
        await ml.offloader.offload()
    finally:
        await factory.close()


def test_a_2x_pod_refuses_offloaded_data_and_a_3x_pod_reports_it(tmp_path: Path) -> None:
    old = ServePod(tmp_path, "pas-0", "store", release="2.0.0")
    (tmp_path / "tier").mkdir()
    asyncio.run(_offload_into(old.data_dir / "ledgers", tmp_path / "tier"))

    old.start(wait=False)
    assert old.process is not None
    assert old.process.wait(60) == 1
    log = old.log()
    assert "needs the 'offload-segments' feature" in log and "release 2.0.0 lacks" in log
    assert str(old.data_dir / "ledgers") in log and TOPIC in log

    new = ServePod(tmp_path, "pas-0", "store", release="3.0.0")
    try:
        new.start()
        status, summary = http("GET", f"{new.admin_url()}/admin/v1/offload/summary")
        assert status == 200
        assert summary["release"] == "3.0.0" and summary["formatLevel"] == 3
        assert summary["maxMetadataVersion"] == 2 and summary["tierOnlyLedgers"] == 2
        assert summary["segments"] == {"Offloaded": 1}
        assert [s["name"] for s in summary["stores"]] == [TOPIC]
    finally:
        new.stop()
