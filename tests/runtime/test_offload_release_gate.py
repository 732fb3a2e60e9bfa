"""A pod whose volume holds offloaded ledgers (metadata version 2) needs a release with the
``offload-segments`` feature: a 2.x pod refuses to start naming the directory; a 3.x pod starts and
reports the volume's offload state at GET /admin/v1/offload/summary (what the operator's downgrade gate
reads). Real ``txnkeeper serve`` processes on a volume a real managed ledger offloaded to a directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime_pods import TOKEN, ServePod, http

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
        # No open managed ledger offloads by itself (this pod's config has no offload section).
        assert summary["automaticOffload"] is False and summary["restoreRequested"] is False
        assert [s["name"] for s in summary["stores"]] == [TOPIC]
    finally:
        new.stop()


def test_restore_is_requested_carried_out_at_the_next_start_and_then_2x_starts(tmp_path: Path) -> None:
    (tmp_path / "tier").mkdir()
    pod = ServePod(tmp_path, "pas-0", "store", release="3.0.0")
    asyncio.run(_offload_into(pod.data_dir / "ledgers", tmp_path / "tier"))
    url = "{}/admin/v1/offload/restore"
    settings = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tmp_path / "tier")}
    try:
        pod.start()
        restore = url.format(pod.admin_url())
        status, _ = http("POST", restore, {"offload": settings})
        assert status == 401  # mutating: needs the admin token
        status, doc = http("POST", restore, {"offload": {"fileSystemURI": "/x"}}, token=TOKEN)
        assert status == 400 and "managedLedgerOffloadDriver" in doc["error"]
        status, doc = http("POST", restore, {"settings": settings}, token=TOKEN)
        assert status == 400 and "unknown key(s): ['settings']" in doc["error"]
        status, doc = http("POST", restore, {"offload": settings}, token=TOKEN)
        assert status == 202 and doc == {"pod": "pas-0", "restoreRequested": True, "restartRequired": True}
        _, summary = http("GET", f"{pod.admin_url()}/admin/v1/offload/summary")
        assert summary["restoreRequested"] is True and summary["tierOnlyLedgers"] == 2

        pod.restart()  # SIGKILL, then start: the restore runs before any ledger opens
        _, summary = http("GET", f"{pod.admin_url()}/admin/v1/offload/summary")
        assert summary["restoreRequested"] is False
        assert summary["tierOnlyLedgers"] == 0 and summary["maxMetadataVersion"] == 1
        assert [p for p in (tmp_path / "tier").rglob("*") if p.is_file()] == []
    finally:
        pod.stop()

    old = ServePod(tmp_path, "pas-0", "store", release="2.0.0")
    try:
        old.start()
        status, doc = http(
            "POST", f"{old.admin_url()}/admin/v1/offload/restore", {"offload": settings}, TOKEN
        )
        assert status == 409 and "release 2.0.0 has no offload" in doc["error"]
    finally:
        old.stop()


def test_a_restore_must_name_the_pods_own_tier_by_an_absolute_path(tmp_path: Path) -> None:
    """Issue 25 item 13: a restore with fileSystemURI "../../../etc" was accepted (202); the next start
    restored nothing there and dropped the segment records, orphaning the real tier's objects."""
    tier = tmp_path / "tier"
    tier.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    own = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)}
    pod = ServePod(tmp_path, "pas-0", "store", release="3.0.0", config={"offload": own})
    asyncio.run(_offload_into(pod.data_dir / "ledgers", tier))
    try:
        pod.start()
        restore = f"{pod.admin_url()}/admin/v1/offload/restore"
        for uri, refusal in (
            ("../../../etc", "fileSystemURI='../../../etc' must be an absolute directory path"),
            (str(other), f"names the tier filesystem {other}, but this pod's tier is filesystem {tier}"),
        ):
            status, doc = http("POST", restore, {"offload": {**own, "fileSystemURI": uri}}, TOKEN)
            assert status == 400 and refusal in doc["error"], doc
        s3 = {"managedLedgerOffloadDriver": "S3", "managedLedgerOffloadBucket": "b"}
        status, doc = http("POST", restore, {"offload": s3}, TOKEN)
        assert status == 400 and "names the tier s3 bucket 'b'" in doc["error"], doc
        _, summary = http("GET", f"{pod.admin_url()}/admin/v1/offload/summary")
        assert summary["restoreRequested"] is False and summary["maxMetadataVersion"] == 2
        status, doc = http("POST", restore, {"offload": {**own, "fileSystemURI": f"{tier}/"}}, TOKEN)
        assert status == 202, doc  # the same directory, spelled with a trailing slash
    finally:
        pod.stop()
