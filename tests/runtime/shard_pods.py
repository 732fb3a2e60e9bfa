"""Two real store pods (and a coordinator) sharing one resource's placement, for tests that move a
shard between them: with or without an offload tier the pods share (a directory, or a MinIO bucket)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pulsar_wire import free_port
from runtime_pods import TOKEN, ServePod, http
from runtime_waits import wait_until

from txnkeeper.admin.move import STEP_TIMEOUT_S, MoveError, move_shard
from txnkeeper.client import Client
from txnkeeper.contract.placement import shard_of
from txnkeeper.ledger.names import encode_name

SHARDS = 2
MOVED = 0  # on pod 0 (shard s on pod s mod 2), moves to pod 1
SUB = "sub"
PAYLOAD = 48 * 1024
FILL = 30  # 1.4 MiB: over the 1 MiB at which the source rolls the open ledger over for a pre-copy
FIRST_LEDGER = "00000000000000000001"  # the file name of a topic's first ledger


FILLED = [b"%04d" % i for i in range(FILL)]


def topic_in_moved_shard(stem: str) -> str:
    for i in range(1000):
        name = f"persistent://t/ns/{stem}-{i}"
        if shard_of(name, SHARDS) == MOVED:
            return name
    raise AssertionError("no name hashes into the shard")


def two_stores(
    pods: Callable[..., ServePod], offload: dict[str, Any] | None = None
) -> tuple[ServePod, ServePod, ServePod]:
    """A coordinator and store pods 0 and 1 of one resource; with ``offload``, both offload to the
    tier it names (the pods of a resource share their tier)."""
    ports = [free_port(), free_port()]
    urls = ",".join(f"pulsar://127.0.0.1:{p}" for p in ports)
    tiered: dict[str, Any] = {"release": "3.0.0", "config": {"offload": offload}} if offload else {}
    tc = pods("tc-0", "coordinator")
    source, target = (
        pods(
            f"pas-{i}",
            "store",
            **tiered,
            extra=[
                *("--listen", f"127.0.0.1:{ports[i]}", "--replicas", "2", "--shards", str(SHARDS)),
                *("--pulsar-urls", urls),
            ],
        )
        for i in range(2)
    )
    return tc, source, target


def filesystem_tier(tier: Path, lag_ms: int = 0) -> dict[str, Any]:
    """Offload settings for a tier in ``tier``: everything closed goes, its local file ``lag_ms`` later."""
    tier.mkdir()
    return {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": 0,
        "managedLedgerOffloadDeletionLagMs": lag_ms,
    }


def verb(pod: ServePod, name: str, body: dict[str, Any]) -> tuple[int, Any]:
    # A pre-copy answers when its copy is done (closing the tier's streaming segment first): allowed
    # as long as the move driver allows a step, not the helper's 10 s, which a busy machine exceeds.
    url = f"{pod.admin_url()}/admin/v1/shards/{MOVED}/{name}"
    return http("POST", url, body, token=TOKEN, timeout=STEP_TIMEOUT_S)


def ledger_files(pod: ServePod, topic: str) -> list[Path]:
    return sorted((pod.data_dir / "ledgers" / encode_name(topic) / "ledgers").glob("*.ledger"))


def has_first_ledger(pod: ServePod, topic: str) -> bool:
    return any(p.name.startswith(FIRST_LEDGER) for p in ledger_files(pod, topic))


async def fill(tc: ServePod, source: ServePod, topic: str) -> None:
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        producer = await client.create_producer(topic)
        await asyncio.gather(*(producer.send(b"%04d" % i + b"f" * PAYLOAD) for i in range(FILL)))


async def offloaded_and_deleted(source: ServePod, topic: str, move: str, target: ServePod) -> None:
    """The pre-copy closes the streaming segment; the rolled-over ledger's local file then goes."""
    status, copied = verb(target, "precopy", {"move": move, "source": source.admin_url()})
    assert status == 200, copied

    async def gone() -> bool:
        return not has_first_ledger(source, topic)

    await wait_until(gone, 60, "the first ledger offloaded and its local file deleted")


async def read_all(tc: ServePod, store: ServePod, topic: str) -> list[bytes]:
    """Every filled message's number, as a new subscription on ``store`` receives them."""
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(topic, SUB)
        return sorted([(await consumer.receive(timeout=20)).data[:4] for _ in range(FILL)])


async def moves_as_metadata(tc: ServePod, source: ServePod, target: ServePod, topic: str, move: str) -> None:
    """A filled shard whose closed ledger is only in the shared tier moves as metadata and the open
    ledger, and the new owner reads every message from the tier."""
    await fill(tc, source, topic)
    await offloaded_and_deleted(source, topic, move, target)
    report = await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move=move)
    assert report.bytes < PAYLOAD * 4, f"metadata and the open ledger only: {report.to_json()}"
    assert not has_first_ledger(target, topic)
    assert await read_all(tc, target, topic) == FILLED, "read from the tier on the new owner"


async def refused_for_missing_objects(
    tc: ServePod,
    source: ServePod,
    target: ServePod,
    topic: str,
    move: str,
    *,
    lose: Callable[[], int],
    at_least: int,
) -> MoveError:
    """A filled shard's tier loses its objects (``lose`` deletes them and says how many) before the
    move: the receive refuses, nothing is installed, the source keeps serving. Returns the refusal."""
    await fill(tc, source, topic)
    await offloaded_and_deleted(source, topic, move, target)
    assert lose() >= at_least, "the tier's objects of the offloaded ledger"
    with pytest.raises(MoveError) as refused:
        await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move=move)
    assert refused.value.step == "receive" and "lacks" in str(refused.value), refused.value
    assert not (target.data_dir / "ledgers" / encode_name(topic)).exists(), "nothing installed"
    _, listing = http("GET", f"{source.admin_url()}/admin/v1/shards")
    row = next(r for r in listing["shards"] if r["shard"] == MOVED)
    assert row["owner"] == 0 and row["state"] == "serving", row
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        await (await client.create_producer(topic)).send(b"after")  # the source serves it again
    return refused.value
