"""A real store pod whose topic lives in a filesystem tier only, for tests that damage the tier.

``offloaded_topic`` starts a coordinator and a store pod (``txnkeeper serve``, release 3.0.0) with a
filesystem tier, produces messages, offloads them with the admin verb, restarts the store (which closes
the ledger) and offloads again, so the closed ledger's local file is deleted and every message is read
back through the tier. Blocks are 4 KiB, a few messages each, so a segment has many blocks to damage.
A graceful restart leaves a transaction buffer snapshot covering every message, so opening the topic
reads nothing from the tier (only consumers do); a SIGKILL leaves none, so opening it replays the
whole ledger from the tier.
"""

from __future__ import annotations

import asyncio
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

__all__ = ["BLOCK_BYTES", "TOPIC", "ServePod", "TieredTopic", "http", "offloaded_topic"]

TOPIC = "persistent://public/default/tiered"
BLOCK_BYTES = 4096
PAYLOAD_BYTES = 1000  # three messages per 4 KiB block


@dataclass
class TieredTopic:
    tc: ServePod
    store: ServePod
    tier: Path
    topic: str
    messages: list[bytes]

    def segment_files(self) -> tuple[Path, Path]:
        """The one segment's data and index objects in the tier directory."""
        (index,) = sorted(self.tier.glob("*-index"))
        data = index.with_name(index.name.removesuffix("-index"))
        assert data.exists(), sorted(self.tier.iterdir())
        return data, index

    def admin(self, method: str, verb: str, body: object = None) -> tuple[int, Any]:
        query = "?" + urllib.parse.urlencode({"topic": self.topic})
        token = TOKEN if method != "GET" else None
        return http(method, f"{self.store.admin_url()}/admin/v1/topics/{verb}{query}", body, token)


def offload_settings(tier: Path, **extra: object) -> dict[str, object]:
    return {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": -1,  # manual only: the test drives every offload
        "managedLedgerOffloadDeletionLagMs": 0,
        "managedLedgerOffloadMaxBlockSizeInBytes": BLOCK_BYTES,
        "managedLedgerOffloadMinBlockSizeInBytes": BLOCK_BYTES,
        **extra,
    }


def message(i: int) -> bytes:
    return f"m-{i:05d}-".encode().ljust(PAYLOAD_BYTES, b"x")


async def _produce(tc: ServePod, store: ServePod, topic: str, messages: list[bytes]) -> None:
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(topic)
        for data in messages:
            await producer.send(data)


def offloaded_topic(
    workdir: Path,
    started: list[ServePod],
    count: int = 60,
    *,
    graceful: bool = True,
) -> TieredTopic:
    """``count`` messages of ``TOPIC`` held by the tier only (module docstring)."""
    tier = workdir / "tier"
    tier.mkdir()
    tc = ServePod(workdir, "tc-0", "coordinator")
    started.append(tc)
    tc.start()
    store = ServePod(
        workdir,
        "pas-0",
        "store",
        release="3.0.0",
        config={"offload": offload_settings(tier)},
    )
    started.append(store)
    store.start()
    messages = [message(i) for i in range(count)]
    asyncio.run(_produce(tc, store, TOPIC, messages))
    topic = TieredTopic(tc, store, tier, TOPIC, messages)
    status, doc = topic.admin("POST", "offload", {})
    assert status == 200 and [s["status"] for s in doc["offloaded"]] == ["Offloaded"], doc
    # Closes the ledger: the next pass may delete its local file.
    if graceful:
        store.stop()
        store.start()
    else:
        store.restart()
    status, doc = topic.admin("POST", "offload", {})
    assert status == 200, doc
    status, doc = topic.admin("GET", "internal-stats")
    assert status == 200 and doc["managedLedgerInternalStats"]["ledgers"][0]["offloaded"] is True, doc
    return topic
