"""Single-routing-key blocks (PDP-44) and idempotent producers against a real store process over real
sockets, with the raw-protocol writer of srk_wire (the client library's writer is tested separately)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Callable

import pytest
from runtime_pods import ServePod, http
from srk_wire import SrkWire

from txnkeeper.client import Client
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import encode_events
from txnkeeper.protocol.frames import DEFAULT_MAX_FRAME_SIZE

pytestmark = pytest.mark.timeout(180)

TOPIC = "persistent://t/ns/srk"
SRK = ["--srk-enabled", "true"]
RELEASE = "3.0.0"  # the first release line with the single-key-transactions feature


def store(pods: Callable[..., ServePod], *extra: str, **kwargs: object) -> ServePod:
    return pods("pas-0", "store", extra=[*SRK, *extra], **{"release": RELEASE, **kwargs})


Delivered = list[tuple[bytes, str, tuple[int, int]]]


async def drain(client: Client, topic: str, sentinel: bytes, subscription: str = "sub") -> Delivered:
    """Everything the subscription delivers up to ``sentinel`` (produced last, plainly), in order."""
    consumer = await client.subscribe(topic, subscription)
    producer = await client.create_producer(topic)
    await producer.send(sentinel)
    got: Delivered = []
    while True:
        message = await consumer.receive(timeout=30)
        if message.data == sentinel:
            return got
        got.append((message.data, message.key, (message.message_id.ledger_id, message.message_id.entry_id)))


def code_of(exc: BaseException) -> int:
    assert isinstance(exc, ServiceError), exc
    return exc.code


async def test_block_appears_whole_with_contiguous_ids_and_retransmission_once(
    pods: Callable[..., ServePod],
) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup(TOPIC, "w1") == -1
    events = [f"e{i}".encode() * (i + 1) for i in range(50)]
    first = await wire.append("w1", 0, events, key="rk", chunk_size=100)
    assert (first.event_number, first.previous_event_number, first.duplicate) == (49, -1, False)
    second = await wire.append("w1", 50, [b"x", b"y"], key="rk")
    assert (second.event_number, second.previous_event_number) == (51, 49)
    # A retransmission of the last block (its DataAppended was "lost"): same answer, nothing written.
    again = await wire.append("w1", 50, [b"x", b"y"], key="rk")
    assert again.duplicate and again.event_number == 51
    assert (again.first_message_id.ledger_id, again.first_message_id.entry_id) == (
        second.first_message_id.ledger_id,
        second.first_message_id.entry_id,
    )
    # An older block: a duplicate whose first MessageId is no longer remembered.
    older = await wire.append("w1", 0, events, key="rk", chunk_size=100)
    assert older.duplicate and not older.HasField("first_message_id")
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [*events, b"x", b"y"]
    assert {key for _, key, _ in got} == {"rk"}
    ids = [mid for _, _, mid in got[:50]]
    start = (first.first_message_id.ledger_id, first.first_message_id.entry_id)
    assert ids == [(start[0], start[1] + i) for i in range(50)]
    wire.close()


async def test_aborted_and_unended_blocks_write_nothing(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup(TOPIC, "w") == -1
    block = encode_events([b"never-1", b"never-2"])
    wire.send_chunks("w", block.data, 5)
    await wire.abort("w")
    # The aborted block's numbers are free again: the same numbers apply to a new block.
    applied = await wire.append("w", 0, [b"kept"])
    assert applied.previous_event_number == -1 and not applied.duplicate
    # A block whose connection goes away before AppendBlockEnd is dropped too.
    other = await SrkWire.open(pod.listen)
    assert await other.setup(TOPIC, "v") == -1
    other.send_chunks("v", encode_events([b"lost"]).data, 3)
    other.close()
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"kept"]
    wire.close()


async def test_gap_overlap_lost_state_and_bad_blocks_are_refused(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup(TOPIC, "w") == -1
    with pytest.raises(ServiceError) as lost:
        await wire.append("w", 5, [b"a"])
    assert code_of(lost.value) == api.WRITER_STATE_LOST and "no state for writer 'w'" in str(lost.value)
    await wire.append("w", 0, [b"a", b"b"])
    with pytest.raises(ServiceError) as gap:
        await wire.append("w", 3, [b"c"])
    assert code_of(gap.value) == api.EVENT_NUMBER_GAP and "must start at 2" in str(gap.value)
    with pytest.raises(ServiceError) as overlap:
        await wire.append("w", 1, [b"b", b"c"])
    assert code_of(overlap.value) == api.BAD_REQUEST and "overlaps" in str(overlap.value)
    block = encode_events([b"c"])
    wire.send_chunks("w", block.data, 100)
    with pytest.raises(ServiceError) as crc:
        await wire.end("w", 2, 1, block.total_bytes, crc=block.crc ^ 1)
    assert code_of(crc.value) == api.BAD_BLOCK and "crc32" in str(crc.value)
    wire.send_chunks("w", block.data, 100)
    with pytest.raises(ServiceError) as count:
        await wire.end("w", 2, 2, block.total_bytes, crc=block.crc)
    assert code_of(count.value) == api.BAD_BLOCK and "event_count 2" in str(count.value)
    with pytest.raises(ServiceError) as no_setup:
        await wire.append("unknown", 0, [b"z"])
    assert code_of(no_setup.value) == api.BAD_REQUEST and "SetupAppend" in str(no_setup.value)
    # Nothing refused was written: the writer continues at 2.
    assert (await wire.append("w", 2, [b"c"])).previous_event_number == 1
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"a", b"b", b"c"]
    wire.close()


async def test_newest_setup_fences_older_session(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    old = await SrkWire.open(pod.listen)
    new = await SrkWire.open(pod.listen)
    assert await old.setup(TOPIC, "w") == -1
    await old.append("w", 0, [b"from-old"])
    old.send_chunks("w", encode_events([b"in-flight-old"]).data, 4)  # open block when fenced
    assert await new.setup(TOPIC, "w") == 0
    with pytest.raises(ServiceError) as fenced:
        await old.append("w", 1, [b"zombie"])
    assert code_of(fenced.value) == api.WRITER_FENCED
    await new.append("w", 1, [b"from-new"])
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"from-old", b"from-new"]
    old.close()
    new.close()


async def test_writer_state_survives_sigkill_restart(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    await wire.setup(TOPIC, "w")
    await wire.append("w", 0, [b"a", b"b", b"c"])
    last = await wire.append("w", 3, [b"d"])
    assert await wire.setup_producer(TOPIC, "producer-1") == -1
    receipt = await wire.produce(TOPIC, b"p0", "producer-1", 7)
    wire.close()
    pod.restart()  # SIGKILL, then start again on the same data
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup(TOPIC, "w") == 3
    again = await wire.append("w", 3, [b"d"])
    assert again.duplicate and again.first_message_id.entry_id == last.first_message_id.entry_id
    assert await wire.setup_producer(TOPIC, "producer-1", resume=True) == 7
    dup = await wire.produce(TOPIC, b"p0", "producer-1", 7)
    assert dup.duplicate and dup.message_id.entry_id == receipt.message_id.entry_id
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"a", b"b", b"c", b"d", b"p0"]
    wire.close()


async def test_idempotent_producer_retries_appear_once(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    await wire.setup_producer(TOPIC, "prod")
    await wire.setup_producer(TOPIC, "other", "instance-2")
    receipts = [await wire.produce(TOPIC, f"m{i}".encode(), "prod", i) for i in (0, 1, 5)]
    assert not any(r.duplicate for r in receipts)
    retry = await wire.produce(TOPIC, b"m5", "prod", 5)
    assert retry.duplicate and retry.message_id.entry_id == receipts[2].message_id.entry_id
    old = await wire.produce(TOPIC, b"m1", "prod", 1)
    assert old.duplicate and not old.HasField("message_id")
    other = await wire.produce(TOPIC, b"n0", "other", 0)  # producers are independent
    assert not other.duplicate
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"m0", b"m1", b"m5", b"n0"]
    status, body = http("GET", f"{pod.admin_url()}/admin/v1/topics/writers?topic={TOPIC}")
    assert status == 200
    assert {w["writerId"]: w["lastEventNumber"] for w in body["writers"]} == {"prod": 5, "other": 0}
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "txnkeeper.cli",
        "admin",
        "--url",
        pod.admin_url(),
        "topics",
        "writers",
        TOPIC,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0
    assert json.loads(out)["writers"][0] == body["writers"][0]
    status, missing = http("GET", f"{pod.admin_url()}/admin/v1/topics/writers?topic=persistent://t/ns/none")
    assert status == 404 and "not served by this pod" in missing["error"]
    metrics = http("GET", f"{pod.admin_url()}/metrics")[1]
    assert re.search(r'txnkeeper_srk_duplicate_sends_total\{topic="persistent://t/ns/srk"\} 2\.0', metrics)
    wire.close()


async def test_limits_and_disabled_feature_are_clear_errors(pods: Callable[..., ServePod]) -> None:
    pod = pods("pas-0", "store")  # the feature is off by default
    wire = await SrkWire.open(pod.listen)
    with pytest.raises(ServiceError) as off:
        await wire.setup(TOPIC, "w")
    assert code_of(off.value) == api.UNSUPPORTED_FEATURE and "--srk-enabled" in str(off.value)
    wire.close()
    pod.stop()
    limited = pods(
        "pas-1",
        "store",
        release=RELEASE,
        config={"singleKeyTransactions": {"enabled": True, "maxBlockBytes": 1000, "maxWritersPerTopic": 2}},
    )
    wire = await SrkWire.open(limited.listen)
    assert await wire.setup(TOPIC, "a") == -1
    assert await wire.setup(TOPIC, "b") == -1
    assert await wire.setup(TOPIC, "c") == -1  # sessions hold no writer slot: writing takes one
    await wire.append("b", 0, [b"b"])
    block = encode_events([b"x" * 1200])  # 1204 bytes: the third 400-byte chunk crosses the limit
    chunks = wire.send_chunks("a", block.data[:1200], 400)
    with pytest.raises(ServiceError) as refused_chunk:
        await asyncio.wait_for(chunks[2], 30)
    assert code_of(refused_chunk.value) == api.BLOCK_TOO_LARGE and "maxBlockBytes 1000" in str(
        refused_chunk.value
    )
    for chunk in chunks[:2]:
        chunk.cancel()  # accepted chunks are never answered
    # The writer is still usable after the refusal.
    assert (await wire.append("a", 0, [b"small"])).event_number == 0
    with pytest.raises(ServiceError) as many:  # a third writer's first block
        await wire.append("c", 0, [b"c"])
    assert code_of(many.value) == api.TOO_MANY_WRITERS and "maxWritersPerTopic 2" in str(many.value)
    metrics = http("GET", f"{limited.admin_url()}/metrics")[1]
    assert re.search(r'txnkeeper_srk_commits_total\{topic="persistent://t/ns/srk"\} 2\.0', metrics)
    assert re.search(r'txnkeeper_srk_writers\{topic="persistent://t/ns/srk"\} 2\.0', metrics)
    wire.close()


# Run as a child process: writes a block's events without its marker to the killed pod's ledger and
# SIGKILLs itself, which is what a store crash between a block's entries and its marker leaves.
_HALF_BLOCK = """
import asyncio, os, signal, sys
from pathlib import Path
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.topic.records import encode_data
from txnkeeper.topic.writers import BLOCK_TXN_MOST
from txnkeeper.txnid import TxnID

async def main() -> None:
    factory = ManagedLedgerFactory(Path(sys.argv[1]))
    ledger = await factory.open(sys.argv[2])
    for payload in (b"half-1", b"half-2"):
        await ledger.add_entry(encode_data(payload, "k", TxnID(BLOCK_TXN_MOST, 1), 0))
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def test_block_without_marker_is_aborted_before_ready(pods: Callable[..., ServePod]) -> None:
    pod = store(pods)
    wire = await SrkWire.open(pod.listen)
    await wire.setup(TOPIC, "w")
    await wire.append("w", 0, [b"a", b"b"])
    wire.close()
    pod.kill()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HALF_BLOCK, str(pod.data_dir / "ledgers"), TOPIC
    )
    assert await asyncio.wait_for(child.wait(), 60) == -signal.SIGKILL
    pod.start()  # returns once /ready answers 200
    # Counted by recovery, before anything touched the topic after the restart.
    metrics = http("GET", f"{pod.admin_url()}/metrics")[1]
    assert re.search(r'txnkeeper_srk_orphan_aborts_total\{topic="persistent://t/ns/srk"\} 1\.0', metrics)
    wire = await SrkWire.open(pod.listen)
    assert await wire.setup(TOPIC, "w") == 1
    assert (await wire.append("w", 2, [b"c"])).previous_event_number == 1
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        got = await drain(client, TOPIC, b"end")
    assert [data for data, _, _ in got] == [b"a", b"b", b"c"]
    wire.close()


async def test_buffered_chunks_count_against_max_pending_bytes(pods: Callable[..., ServePod]) -> None:
    limit = DEFAULT_MAX_FRAME_SIZE  # the smallest budget serve accepts
    pod = store(pods, "--max-pending-bytes", str(limit))
    wire = await SrkWire.open(pod.listen)
    await wire.setup(TOPIC, "w")
    piece = 1024 * 1024
    data = encode_events([b"z" * (limit + piece)]).data
    chunks = wire.send_chunks("w", data[: limit + piece], piece)
    await wire.abort("w")  # answered after every chunk before it; drops what arrived after a refusal
    answered = [i for i, c in enumerate(chunks) if c.done()]
    refusals = [chunks[i].exception() for i in answered]
    for chunk in chunks:
        chunk.cancel()  # accepted chunks are never answered
    # Incomplete frames count too, so the refusal may come a chunk early, never late.
    assert answered and answered[0] <= limit // piece
    assert all(code_of(e) == api.RESOURCE_LIMIT for e in refusals if e is not None)
    assert "max pending bytes" in str(refusals[0])
    metrics = http("GET", f"{pod.admin_url()}/metrics")[1]
    assert re.search(r"txnkeeper_server_pending_bytes 0\.0", metrics)  # nothing left held
    assert (await wire.append("w", 0, [b"fits"])).event_number == 0
    wire.close()
