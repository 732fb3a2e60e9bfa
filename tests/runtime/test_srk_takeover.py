"""A single-key writer taken over while its blocks are still pending (issue 25 item 1), against a real
store process over real sockets.

Writer A pipelines blocks; writer B opens a session with the same writer id (a restarted application
instance) and writes. B's SetupAppend must count exactly what of A was applied, every block of A not
applied by then must be refused (A is fenced), and every block of B must be applied, at the ids its
answers name: nothing of B answered "duplicate" and dropped, nothing of A applied behind B's back.

And the other way round (found by the cluster soak's concurrent takeovers): A, cut off while its
blocks (or a named producer's sends) were unanswered, reconnects after B wrote, also after a store
restart made the store forget which instance holds the id. A must be told it is fenced, never be
answered with B's events as if they were its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from cutproxy import CutProxy
from runtime_pods import ServePod
from runtime_waits import wait_until
from srk_wire import SrkWire

from txnkeeper.client import Client, MessageId, ProducerFencedError, SingleKeyWriter, WriterFencedError
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


# --- a fenced instance reconnecting (the concurrent takeovers of the cluster soak) -----------------


async def test_a_retransmission_with_another_sessions_numbers_is_refused_never_answered_with_its_ids(
    pods: Callable[..., ServePod],
) -> None:
    """Raw protocol: A's blocks 1.. never reached the store; B took the id over and wrote events 1..3;
    A comes back (a new SetupAppend, as a reconnecting writer does) and sends its own blocks with those
    numbers. Only a retransmission of the very block the store holds is a duplicate; a block with the
    numbers of B's last block but other events, or ending where B's last block ends, is refused
    WRITER_FENCED and nothing of it is answered as applied."""
    pod = pods("pas-0", "store", extra=SRK, release=RELEASE)
    topic = f"{TOPIC}-resent"
    a, b = await SrkWire.open(pod.listen), await SrkWire.open(pod.listen)
    try:
        assert await a.setup(topic, "w") == -1
        a0 = await a.append("w", 0, [b"a0"])
        assert await b.setup(topic, "w") == 0
        b1 = await b.append("w", 1, [b"b1"])
        b2 = await b.append("w", 2, [b"b2"])
        b3 = await b.append("w", 3, [b"b3"])
        a.close()
        a = await SrkWire.open(pod.listen)
        assert await a.setup(topic, "w") == 3
        same = await a.append("w", 3, [b"b3"])  # the block the store holds: answered from it
        assert same.duplicate and same.first_message_id == b3.first_message_id
        # A's own blocks: the numbers of B's last block with other events, and a block ending where
        # B's last block ends (never one block of a single writer's history).
        for first, events in [(3, [b"a3"]), (2, [b"a2", b"a3"])]:
            with pytest.raises(ServiceError) as refused:
                await a.append("w", first, events)
            assert refused.value.code == api.WRITER_FENCED, (first, events, str(refused.value))
            assert "another" in str(refused.value), str(refused.value)
        async with Client(coordinators=[], stores=[pod.listen]) as client:
            seen = await read_all(client, topic, b"end")
        assert [(p, (m.ledger_id, m.entry_id)) for p, m in seen] == [
            (p, (ans.first_message_id.ledger_id, ans.first_message_id.entry_id))
            for p, ans in [(b"a0", a0), (b"b1", b1), (b"b2", b2), (b"b3", b3)]
        ]
    finally:
        a.close()
        b.close()


async def _until_refused(proxy: CutProxy) -> None:
    async def refused() -> bool:
        return proxy.refused > 0

    await wait_until(refused, 60, "the cut-off instance's first reconnect")


async def _cut_off(client: Client, proxy: CutProxy, address: str) -> None:
    """Lose ``client``'s connection through ``proxy`` and turn its reconnects away for now."""
    proxy.refusing = True
    (await client.connections.get(address)).abort()


@pytest.mark.parametrize("restart", [False, True], ids=["same-store", "store-restarted"])
@pytest.mark.parametrize(
    ("older_txns", "newer_txns", "after_restart"),
    [
        # B's block has the numbers of A's (the store compares the events)
        ([[b"a0"]], [[b"b0"]], "but other events"),
        # B's last block ends where A's block ends (not one block of a single writer's history)
        ([[b"a0", b"a1"]], [[b"b0"], [b"b1"]], "is not a block this id wrote"),
        # B wrote beyond the one block A had on the wire (A's client refuses to resend)
        ([[b"a0"], [b"a1"]], [[b"b0"], [b"b1"]], "sent only through 0"),
    ],
    ids=["same-numbers", "same-last-number", "beyond-the-head"],
)
async def test_a_writer_reconnecting_after_a_takeover_is_fenced_never_answered_with_the_newer_events(
    pods: Callable[..., ServePod],
    older_txns: list[list[bytes]],
    newer_txns: list[list[bytes]],
    after_restart: str,
    restart: bool,
) -> None:
    """Through the client API: writer A's connection is lost before its commits were sent and its
    reconnects fail; B opens the same writer id and commits; (the store restarts;) A reconnects. A's
    commits must fail with WriterFencedError, never return B's message ids, and the topic holds B's
    events, once, at B's ids. The same store refuses A's reconnect (B's instance holds the id); a
    restarted one no longer knows who holds it, and A's blocks are refused for what B wrote."""
    pod = pods("pas-0", "store", extra=SRK, release=RELEASE)
    topic = f"{TOPIC}-reconnect"
    proxy = CutProxy(pod.listen)
    address = await proxy.start()
    try:
        async with Client(coordinators=[], stores=[address], operation_timeout=120) as first:
            older = await first.create_single_key_writer(topic, "k", 120_000, writer_id="w")
            await _cut_off(first, proxy, address)
            commits = []
            for events in older_txns:
                txn = older.begin_transaction()
                for event in events:
                    txn.write(event)
                commits.append(asyncio.ensure_future(txn.commit()))
                await asyncio.sleep(0)  # one loop turn: the commit numbers its block
            await _until_refused(proxy)
            async with Client(coordinators=[], stores=[pod.listen]) as second:
                newer = await second.create_single_key_writer(topic, "k", 120_000, writer_id="w")
                new_ids: list[MessageId] = []
                for events in newer_txns:
                    async with newer.begin_transaction() as new_txn:
                        for event in events:
                            new_txn.write(event)
                    new_ids += new_txn.message_ids
            if restart:  # the store forgets which instance holds the writer id
                await asyncio.to_thread(pod.restart)
            proxy.refusing = False
            outcomes = await asyncio.wait_for(asyncio.gather(*commits, return_exceptions=True), 120)
            assert all(isinstance(outcome, WriterFencedError) for outcome in outcomes), outcomes
            reason = after_restart if restart else "taken over by another producer or writer"
            assert all(reason in str(outcome) for outcome in outcomes), (reason, outcomes)
        async with Client(coordinators=[], stores=[pod.listen]) as client:
            seen = await read_all(client, topic, b"end")
        assert seen == list(zip([e for events in newer_txns for e in events], new_ids, strict=True))
    finally:
        await proxy.close()


@pytest.mark.parametrize("sends", [1, 2])
async def test_a_producer_reconnecting_after_a_takeover_and_a_store_restart_is_fenced(
    pods: Callable[..., ServePod], sends: int
) -> None:
    """Named producer A's connection is lost before its sends were sent and its reconnects fail; B
    opens the same name and sends as many; the store restarts (forgetting who holds the name); A
    resumes. A's sends must fail with ProducerFencedError, never resolve as duplicates of B's sends
    (with B's message ids, or -1:-1), and the topic holds B's sends once."""
    pod = pods("pas-0", "store", extra=SRK, release=RELEASE)
    topic = f"{TOPIC}-producer"
    proxy = CutProxy(pod.listen)
    address = await proxy.start()
    try:
        async with Client(coordinators=[], stores=[address], operation_timeout=120) as first:
            older = await first.create_producer(topic, producer_name="app")
            await _cut_off(first, proxy, address)
            pending = [older.send(b"a%d" % i) for i in range(sends)]
            await _until_refused(proxy)
            async with Client(coordinators=[], stores=[pod.listen]) as second:
                newer = await second.create_producer(topic, producer_name="app")
                new_ids = [await newer.send(b"b%d" % i) for i in range(sends)]
                await newer.close()
            await asyncio.to_thread(pod.restart)
            proxy.refusing = False
            outcomes = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 120)
            assert all(isinstance(outcome, ProducerFencedError) for outcome in outcomes), outcomes
            assert all("but other events" in str(outcome) for outcome in outcomes), outcomes
        async with Client(coordinators=[], stores=[pod.listen]) as client:
            seen = await read_all(client, topic, b"end")
        assert seen == [(b"b%d" % i, new_ids[i]) for i in range(sends)]
    finally:
        await proxy.close()
