"""A single-key writer taken over while its blocks are still pending (issue 25 item 1), against a real
store process over real sockets.

Writer A pipelines blocks; writer B opens a session with the same writer id (a restarted application
instance) and writes. B's SetupAppend must count exactly what of A was applied, every block of A not
applied by then must be refused (A is fenced), and every block of B must be applied, at the ids its
answers name: nothing of B answered "duplicate" and dropped, nothing of A applied behind B's back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from runtime_pods import ServePod
from srk_wire import SrkWire

from txnkeeper.client import Client, MessageId, SingleKeyWriter, WriterFencedError
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import encode_events

pytestmark = pytest.mark.timeout(300)

TOPIC = "persistent://t/ns/takeover"
SRK = ["--srk-enabled", "true"]
RELEASE = "3.0.0"
A_BLOCKS = 200  # blocks writer A keeps pipelined when B takes over
B_BLOCKS = 50
ROUNDS = 10  # takeovers tried until one lands while some of A's blocks are still pending
EVENT = 2048  # bytes per event: enough that A's blocks take a few group commits to become durable


async def read_all(client: Client, topic: str, sentinel: bytes) -> list[tuple[bytes, MessageId]]:
    """Every message of ``topic`` up to ``sentinel``, which a plain producer writes after the rest."""
    consumer = await client.subscribe(topic, "audit")
    producer = await client.create_producer(topic)
    await producer.send(sentinel)
    seen: list[tuple[bytes, MessageId]] = []
    while True:
        message = await consumer.receive(timeout=60)
        await consumer.acknowledge(message)
        if message.data == sentinel:
            return seen
        seen.append((message.data, message.message_id))


def _answer(future: asyncio.Future[api.Command]) -> api.DataAppended | ServiceError:
    exc = future.exception()
    if exc is not None:
        assert isinstance(exc, ServiceError), exc
        return exc
    return future.result().data_appended


async def _takeover_round(a: SrkWire, b: SrkWire, topic: str, writer: str) -> tuple[int, int]:
    """A pipelines A_BLOCKS one-event blocks, B sets up the same writer id at once and writes
    B_BLOCKS; checks every answer and what the topic holds. Returns (B's last_event_number, how many
    of A's blocks were refused)."""
    assert await a.setup(topic, writer) == -1
    a_payloads = [b"A%03d-" % i + b"a" * EVENT for i in range(A_BLOCKS)]
    a_ends = []
    a_chunks = []
    for i, payload in enumerate(a_payloads):
        block = encode_events([payload])
        a_chunks += a.send_chunks(writer, block.data, 64 * 1024)
        a_ends.append(a.end(writer, i, 1, block.total_bytes, crc=block.crc))
    # B opens while A's blocks are on their way (sent above, in this loop turn).
    b_last = await b.setup(topic, writer)
    await asyncio.wait(a_ends)
    a_answers = [_answer(f) for f in a_ends]
    for chunk in a_chunks:  # an accepted chunk is never answered; a refused one says what its End says
        if chunk.done():
            chunk.exception()
        else:
            chunk.cancel()
    b_answers: list[api.DataAppended] = []
    for j in range(B_BLOCKS):
        b_answers.append(await b.append(writer, b_last + 1 + j, [b"B%03d" % j]))

    applied = {i: ans for i, ans in enumerate(a_answers) if isinstance(ans, api.DataAppended)}
    refused = {i: ans for i, ans in enumerate(a_answers) if not isinstance(ans, api.DataAppended)}
    # B's answer counts exactly A's applied blocks: 0..b_last, and A's later blocks were refused.
    assert sorted(applied) == list(range(b_last + 1)), (b_last, sorted(applied)[-5:])
    assert all(not ans.duplicate for ans in applied.values())
    assert all(err.code == api.WRITER_FENCED for err in refused.values()), {
        i: (e.code, str(e)) for i, e in refused.items()
    }
    # Every block of B was applied (never answered duplicate and dropped), after A's.
    assert [ans.duplicate for ans in b_answers] == [False] * B_BLOCKS
    assert [ans.event_number for ans in b_answers] == list(range(b_last + 1, b_last + 1 + B_BLOCKS))
    async with Client(coordinators=[], stores=[a.conn.address]) as client:
        seen = await read_all(client, topic, b"end")
    expected = [(a_payloads[i], applied[i].first_message_id) for i in sorted(applied)]
    expected += [(b"B%03d" % j, ans.first_message_id) for j, ans in enumerate(b_answers)]
    assert [payload for payload, _ in seen] == [payload for payload, _ in expected]
    for (_, mid), (_, want) in zip(seen, expected, strict=True):
        assert (mid.ledger_id, mid.entry_id) == (want.ledger_id, want.entry_id)
    return b_last, len(refused)


async def test_a_takeover_counts_what_was_applied_and_applies_every_block_of_the_new_writer(
    pods: Callable[..., ServePod],
) -> None:
    pod = pods("pas-0", "store", extra=SRK, release=RELEASE)
    hits = 0
    for round_ in range(ROUNDS):
        a, b = await SrkWire.open(pod.listen), await SrkWire.open(pod.listen)
        try:
            _, refused = await _takeover_round(a, b, f"{TOPIC}-{round_}", "w")
        finally:
            a.close()
            b.close()
        hits += refused > 0
        if hits >= 2:
            break
    # The race was exercised: in some round B took over while blocks of A were still pending.
    assert hits, f"in {ROUNDS} rounds, every block of A was durable before B's SetupAppend arrived"


async def _commit_loop(
    writer: SingleKeyWriter, commits: dict[bytes, asyncio.Future[list[MessageId]]], started: asyncio.Event
) -> None:
    """One-event transactions back to back, a few commits pipelined, until the writer is fenced."""
    for i in range(10_000):
        payload = b"old-%d" % i
        try:
            txn = writer.begin_transaction()
        except WriterFencedError:
            return
        txn.write(payload)
        commits[payload] = asyncio.ensure_future(txn.commit())
        await asyncio.sleep(0)  # one loop turn: the commit ends the transaction and numbers its block
        if i == 20:
            started.set()
        if len(commits) % 4 == 0:
            await asyncio.wait([commits[payload]])
            if commits[payload].exception() is not None:
                return
    raise AssertionError("writer A was never fenced")


async def test_a_client_writer_taken_over_mid_commit_loop_never_hands_out_the_older_writers_id(
    pods: Callable[..., ServePod],
) -> None:
    """Through the client API: A commits one-event transactions back to back, B opens with A's writer
    id and commits one event. B's commit must return B's own event's id, never one of A's."""
    pod = pods("pas-0", "store", extra=SRK, release=RELEASE)
    for round_ in range(ROUNDS):
        topic = f"{TOPIC}-client-{round_}"
        async with (
            Client(coordinators=[], stores=[pod.listen]) as first,
            Client(coordinators=[], stores=[pod.listen]) as second,
        ):
            older = await first.create_single_key_writer(topic, "k", txn_timeout_ms=60_000)
            commits: dict[bytes, asyncio.Future[list[MessageId]]] = {}
            started = asyncio.Event()
            loop_task = asyncio.ensure_future(_commit_loop(older, commits, started))
            await asyncio.wait_for(started.wait(), 60)
            newer = await second.create_single_key_writer(topic, "k", 60_000, writer_id=older.writer_id)
            txn = newer.begin_transaction()
            txn.write(b"new")
            new_ids = await txn.commit()
            await asyncio.wait_for(loop_task, 60)
            await asyncio.wait(list(commits.values()), timeout=60)
            acknowledged = {p: f.result()[0] for p, f in commits.items() if f.exception() is None}
            failures = [f.exception() for f in commits.values() if f.exception() is not None]
            assert all(isinstance(exc, WriterFencedError) for exc in failures), failures
            seen = {mid: payload for payload, mid in await read_all(second, topic, b"end")}
            assert seen.get(new_ids[0]) == b"new", (new_ids, seen.get(new_ids[0]))
            assert sorted(seen.values()) == sorted([*acknowledged, b"new"])
            for payload, mid in acknowledged.items():
                assert seen[mid] == payload
