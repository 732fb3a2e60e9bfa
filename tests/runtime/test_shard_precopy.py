"""Pre-copy of a shard's closed files before its fence (docs/contracts.md §12, "Pre-copy"), between two
real store pods: the source keeps taking writes while the target copies, the pause copies only what
changed since, every acknowledged message is read exactly once from the new owner, a closed file that
changed after its pre-copy is caught by its checksum and pulled again, and a target killed after a
pre-copy serves nothing of it and loses the staged files to a discard.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_pods import TOKEN, ServePod, http
from runtime_waits import wait_until
from shard_pods import (
    FILL,
    FILLED,
    MOVED,
    PAYLOAD,
    SUB,
    filesystem_tier,
    fill,
    has_first_ledger,
    ledger_files,
    moves_as_metadata,
    read_all,
    refused_for_missing_objects,
    topic_in_moved_shard,
    two_stores,
    verb,
)

from txnkeeper.admin.move import move_shard
from txnkeeper.client import Client
from txnkeeper.errors import ServiceError
from txnkeeper.ledger.names import encode_name

pytestmark = pytest.mark.timeout(180)


async def test_precopy_while_writes_go_on_then_every_acknowledged_message_is_read_once(
    pods: Callable[..., ServePod],
) -> None:
    tc, source, target = two_stores(pods)
    topic = topic_in_moved_shard("pre")
    await fill(tc, source, topic)
    # The verbs' own refusals: the owner does not pre-copy, a non-owner has no closed files to list.
    status, refused = verb(source, "precopy", {"move": "m1", "source": target.admin_url()})
    assert status == 409 and "already owns" in refused["error"], refused
    status, refused = verb(target, "closed", {"move": "m1"})
    assert status == 409 and "not this pod" in refused["error"], refused
    status, refused = verb(
        target, "precopy", {"move": "m1", "source": source.admin_url(), "maxBytesPerSecond": 0}
    )
    assert status == 400 and "maxBytesPerSecond" in refused["error"], refused

    acked: list[bytes] = []
    stop = asyncio.Event()
    async with Client(coordinators=[tc.listen], stores=[source.listen, target.listen]) as client:
        producer = await client.create_producer(topic)

        async def write() -> None:
            n = 0
            while not stop.is_set():
                body = b"w%05d" % n
                try:
                    await producer.send(body)
                except ServiceError:  # refused while fenced: sent again (the client retried it already)
                    await asyncio.sleep(0.01)
                    continue
                acked.append(body)
                n += 1

        writer = asyncio.create_task(write())
        try:
            await wait_until(lambda: _async_true(len(acked) >= 5), 30, "writes before the pre-copy")
            status, copied = await asyncio.to_thread(
                verb, target, "precopy", {"move": "m1", "source": source.admin_url()}
            )
            assert status == 200, copied
            assert copied["files"] >= 1 and copied["bytes"] >= FILL * PAYLOAD, copied
            during = len(acked)
            # Nothing of it is served or installed on the target; the source took writes meanwhile
            # and still does (no fence).
            assert not (target.data_dir / "ledgers" / encode_name(topic)).exists()
            await wait_until(lambda: _async_true(len(acked) >= during + 5), 30, "writes after the pre-copy")
            status, again = await asyncio.to_thread(
                verb, target, "precopy", {"move": "m1", "source": source.admin_url()}
            )
            assert status == 200 and again["stagedBytes"] >= FILL * PAYLOAD, again

            report = await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move="m1")
            assert report.steps == ["precopy", "fence", "receive", "placement", "release"]
            # The pause pulled only what changed since the pre-copy (the open ledger, cursors, rows).
            assert report.pulled_bytes < report.bytes - FILL * PAYLOAD, report.to_json()
            settled = len(acked)
            await wait_until(lambda: _async_true(len(acked) >= settled + 5), 30, "writes on the new owner")
        finally:
            stop.set()
            await writer
    assert not (source.data_dir / "ledgers" / encode_name(topic)).exists()
    assert not list((target.data_dir / "moves-in").glob("*")), "the staged copies went with the move"

    async with Client(coordinators=[tc.listen], stores=[target.listen]) as client:
        consumer = await client.subscribe(topic, SUB)
        seen: list[bytes] = []
        expected = FILL + len(acked)
        while len(seen) < expected:
            message = await consumer.receive(timeout=20)
            seen.append(message.data)
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            extra = await consumer.receive(timeout=1)
            seen.append(extra.data)
    written = [b for b in seen if b.startswith(b"w")]
    assert written == acked, "every acknowledged write once, in order, nothing else"
    assert sorted(b[:4] for b in seen if not b.startswith(b"w")) == [b"%04d" % i for i in range(FILL)]


async def _async_true(value: bool) -> bool:
    return value


async def test_a_closed_file_changed_after_its_precopy_is_pulled_again_by_its_checksum(
    pods: Callable[..., ServePod],
) -> None:
    tc, source, target = two_stores(pods)
    topic = topic_in_moved_shard("changed")
    await fill(tc, source, topic)
    status, copied = verb(target, "precopy", {"move": "m2", "source": source.admin_url()})
    assert status == 200 and copied["files"] >= 1, copied
    closed = ledger_files(source, topic)[0]
    rel = closed.relative_to(source.data_dir).as_posix()
    # What must not happen to a closed ledger, done on purpose: one byte of it changes (same size).
    raw = bytearray(closed.read_bytes())
    raw[-1] ^= 0xFF
    closed.write_bytes(bytes(raw))
    status, manifest = verb(source, "fence", {"move": "m2"})
    assert status == 200, manifest
    status, receipt = verb(target, "receive", {"move": "m2", "source": source.admin_url()})
    assert status == 200, receipt
    assert receipt["changedSincePrecopy"] == [rel], receipt
    assert receipt["precopied"] == copied["files"] - 1, receipt
    assert (target.data_dir / rel).read_bytes() == bytes(raw), "the source's current file, not the staged one"
    # Rolled back: the received copy goes, the source serves again.
    assert verb(target, "discard", {"move": "m2"})[0] == 200
    assert verb(source, "unfence", {"move": "m2"})[0] == 200
    assert not (target.data_dir / rel).exists()


async def test_a_target_killed_after_a_precopy_serves_nothing_and_a_discard_removes_it(
    pods: Callable[..., ServePod],
) -> None:
    tc, source, target = two_stores(pods)
    topic = topic_in_moved_shard("killed")
    await fill(tc, source, topic)
    status, copied = verb(target, "precopy", {"move": "m3", "source": source.admin_url()})
    assert status == 200 and copied["files"] >= 1, copied
    target.kill(signal.SIGKILL)
    target.start()
    staged = target.data_dir / "moves-in"
    assert list(staged.glob("*")), "the staged copies survive the restart (a repeated pre-copy reuses them)"
    status, listing = http("GET", f"{target.admin_url()}/admin/v1/shards")
    assert status == 200 and MOVED not in {r["shard"] for r in listing["shards"]}
    status, again = verb(target, "precopy", {"move": "m3", "source": source.admin_url()})
    assert status == 200 and again["files"] == 0 and again["stagedFiles"] == copied["files"], again
    # A file the source did not list for this move is not served without a fence.
    status, _ = http(
        "GET",
        f"{source.admin_url()}/admin/v1/shards/{MOVED}/files?move=m3&path=ledgers/x/meta.json",
        token=TOKEN,
    )
    assert status == 409
    for _ in range(2):  # idempotent
        status, discarded = verb(target, "discard", {"move": "m3"})
        assert status == 200, discarded
    assert not list(staged.glob("*"))
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        consumer = await client.subscribe(topic, SUB)
        assert (await consumer.receive(timeout=10)).data.startswith(b"0")


async def test_an_offloaded_shard_moves_as_metadata_and_is_read_from_the_shared_tier(
    pods: Callable[..., ServePod], tmp_path: Path
) -> None:
    tc, source, target = two_stores(pods, filesystem_tier(tmp_path / "tier"))
    await moves_as_metadata(tc, source, target, topic_in_moved_shard("tiered"), "m4")


async def test_a_tier_object_missing_on_the_target_fails_the_move_and_the_source_keeps_the_shard(
    pods: Callable[..., ServePod], tmp_path: Path
) -> None:
    tc, source, target = two_stores(pods, filesystem_tier(tmp_path / "tier"))

    def lose() -> int:
        objects = [p for p in (tmp_path / "tier").rglob("*") if p.is_file()]
        for path in objects:
            path.unlink()
        return len(objects)

    await refused_for_missing_objects(
        tc, source, target, topic_in_moved_shard("lost"), "m5", lose=lose, at_least=1
    )


async def test_a_ledger_offloaded_but_still_local_is_not_copied_to_a_pod_sharing_the_tier(
    pods: Callable[..., ServePod], tmp_path: Path
) -> None:
    """Deletion lag not passed: the source still has the file, its segments are complete in the tier;
    the target checks its tier holds them, marks the ledger offloaded and reads it from there."""
    tc, source, target = two_stores(pods, filesystem_tier(tmp_path / "tier", lag_ms=3_600_000))
    topic = topic_in_moved_shard("lagged")
    await fill(tc, source, topic)
    status, copied = verb(target, "precopy", {"move": "m6", "source": source.admin_url()})
    assert status == 200, copied
    assert copied["bytes"] < FILL * PAYLOAD, f"the offloaded ledger is not pre-copied: {copied}"
    assert has_first_ledger(source, topic)
    report = await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move="m6")
    assert report.pulled_bytes < PAYLOAD * 4 and report.bytes > FILL * PAYLOAD, report.to_json()
    assert not has_first_ledger(target, topic)
    assert await read_all(tc, target, topic) == FILLED, "read from the tier on the new owner"
