"""``verify-offload`` compares what the topic data source reads from the tier with what the pod serves for
the same positions: equal on a sound tier; a tier object rewritten with other bytes (checksums made to
match, so no CRC check can see it) is a ``mismatch`` naming pod, topic, segment and position.

A real store pod (release 3.0.0, filesystem tier, local files kept after offload and read first), real
Spark (local[2]).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client
from txnkeeper.ledger.offload import index as index_format
from txnkeeper.ledger.offload.block import block_crc
from txnkeeper.ledger.offload.index import LedgerIndex
from txnkeeper.ledger.offload.ledgerinfo import CRC_PROPERTY_PREFIX, crc_property
from txnkeeper.verifier import PodEndpoint
from txnkeeper.verifier.offload_audit import audit

pytestmark = pytest.mark.spark

TOPIC = "persistent://public/default/audit-compare"


def _settings(tier: Path) -> dict[str, Any]:
    return {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": -1,
        "managedLedgerOffloadDeletionLagMs": 3_600_000,  # the pod keeps its local files
        "managedLedgerDataReadPriority": "bookkeeper-first",  # and serves from them
        "managedLedgerOffloadMaxBlockSizeInBytes": 4096,
        "managedLedgerOffloadMinBlockSizeInBytes": 4096,
    }


@pytest.fixture
def offloaded(tmp_path: Path) -> Iterator[tuple[ServePod, Path]]:
    tier = tmp_path / "tier"
    tier.mkdir()
    tc = ServePod(tmp_path, "tc-0", "coordinator").start()
    store = ServePod(tmp_path, "pas-0", "store", release="3.0.0", config={"offload": _settings(tier)}).start()
    try:

        async def produce() -> None:
            async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
                producer = await client.create_producer(TOPIC)
                for i in range(30):
                    await producer.send(f"order-{i:04d}".encode().ljust(300, b"."))

        asyncio.run(produce())
        status, doc = http("POST", f"{store.admin_url()}/admin/v1/topics/offload?topic={TOPIC}", {}, TOKEN)
        assert status == 200 and [s["status"] for s in doc["offloaded"]] == ["Offloaded"], doc
        yield store, tier
    finally:
        store.stop()
        tc.stop()


def _rewrite(tier: Path, old: bytes, new: bytes) -> str:
    """Replace ``old`` by ``new`` (same length) in the one segment's data object and record the block's
    new CRC in its index, as a bad copy that recomputed its checksums would; returns the uuid."""
    (index_path,) = sorted(tier.glob("*-index"))
    uuid = index_path.name.removesuffix("-index")
    data_path = tier / uuid
    raw = bytearray(data_path.read_bytes())
    at = raw.index(old)
    raw[at : at + len(new)] = new
    idx = index_format.decode(index_path.read_bytes())
    block = max((b for b in idx.blocks() if b.offset <= at), key=lambda b: b.offset)
    crc = block_crc(raw[block.offset : block.offset + idx.block_length(block)])
    key = f"{CRC_PROPERTY_PREFIX}{block.part_id}"
    ledgers = []
    for led in idx.ledgers:
        if led.info.ledger_id != block.ledger_id:
            ledgers.append(led)
            continue
        props = (*(p for p in led.info.properties if p[0] != key), crc_property(block.part_id, crc))
        ledgers.append(LedgerIndex(replace(led.info, properties=props), led.entries))
    index_path.write_bytes(index_format.encode(idx.data_object_length, ledgers))
    data_path.write_bytes(bytes(raw))
    return uuid


def test_tier_and_pod_compared_entry_by_entry(spark: Any, offloaded: tuple[ServePod, Path]) -> None:
    store, tier = offloaded
    endpoints = [PodEndpoint(pod="pas-0", url=store.admin_url())]
    sound = audit(endpoints, _settings(tier), spark=spark, sample_blocks=100)
    assert sound["ok"] is True, json.dumps(sound, indent=2)
    assert (sound["segmentsCompared"], sound["entriesCompared"], sound["comparisonsSkipped"]) == (1, 30, [])

    uuid = _rewrite(tier, b"order-0017", b"order-9917")
    report = audit(endpoints, _settings(tier), spark=spark, sample_blocks=100)
    assert report["ok"] is False
    (finding,) = report["findings"]
    assert (finding["kind"], finding["pod"], finding["store"], finding["uuid"]) == (
        "mismatch",
        "pas-0",
        TOPIC,
        uuid,
    )
    assert ":17 of " + TOPIC in finding["detail"], finding
    # The entries before the rewritten one were compared equal, and the comparison stopped at it.
    assert report["entriesCompared"] == 18
