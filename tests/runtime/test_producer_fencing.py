"""Named (idempotent) producers are exclusive per name, against real store pods over real sockets.

The newest producer of a name fences the older ones (the rule of a writer's SetupAppend): the older one's
sends fail with ``ProducerFencedError`` and it never takes the name back, while a producer whose own
connection was cut resumes the name and re-sends its unanswered sends once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import pytest
from cutproxy import CutProxy, CutRule
from runtime_pods import ServePod, http

from txnkeeper.client import Client, MessageId, ProducerFencedError, WriterFencedError
from txnkeeper.errors import BadRequestError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import encode_frame
from txnkeeper.server.blocks import BlockAppender, WriterSession
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.service import TopicService
from txnkeeper.topic.writers import WriterFencedError as StoreWriterFencedError
from txnkeeper.topic.writers import WriterTable

pytestmark = pytest.mark.timeout(180)

TOPIC = "persistent://t/ns/fencing"
SRK = ["--srk-enabled", "true", "--release", "3.0.0"]  # named producers need single-key support
END = b"end-of-test"
IN_FLIGHT = 8  # sends the older producer keeps pipelined


async def read_until_end(client: Client) -> list[tuple[bytes, MessageId]]:
    """Every message of TOPIC up to the END marker a plain producer writes after all other sends."""
    consumer = await client.subscribe(TOPIC, "audit")
    marker = await client.create_producer(TOPIC)
    await marker.send(END)
    seen: list[tuple[bytes, MessageId]] = []
    while True:
        message = await consumer.receive(timeout=60)
        await consumer.acknowledge(message)
        if message.data == END:
            return seen
        seen.append((message.data, message.message_id))


def setup_frame_bytes(producer_name: str) -> int:
    """The size of a named producer's resuming SetupAppend, the first frame on a new connection."""
    command = api.Command(request_id=1)
    setup = command.setup_append
    setup.topic, setup.writer_id, setup.producer_session, setup.resume = TOPIC, producer_name, "0" * 32, True
    return len(encode_frame(command))


async def test_a_newer_producer_of_a_name_fences_the_older_and_no_acknowledged_send_is_lost(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=SRK)
    async with (
        Client(coordinators=[], stores=[store.listen]) as first,
        Client(coordinators=[], stores=[store.listen]) as second,
    ):
        older = await first.create_producer(TOPIC, producer_name="app")
        sent: dict[bytes, asyncio.Future[MessageId]] = {}
        opening = asyncio.Event()  # the older producer is sending: open the newer one now

        async def keep_sending() -> None:
            """Sends of the older producer, pipelined, until the store refuses one."""
            window: list[asyncio.Future[MessageId]] = []
            for i in range(100_000):
                payload = b"old-%d" % i
                try:
                    future = older.send(payload)
                except ProducerFencedError:
                    return  # an earlier send was refused: later ones fail at the call
                sent[payload] = future
                window.append(future)
                if len(window) >= IN_FLIGHT:
                    await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
                    window = [f for f in window if not f.done()]
                    if any(f.done() and f.exception() is not None for f in sent.values()):
                        return
                if i == 20:
                    opening.set()
            raise AssertionError("the older producer was never fenced")

        sending = asyncio.ensure_future(keep_sending())
        await asyncio.wait_for(opening.wait(), 60)
        newer = await second.create_producer(TOPIC, producer_name="app")  # while the older sends
        newer_ids = [await newer.send(b"new-%d" % i) for i in range(10)]
        await asyncio.wait_for(sending, 60)
        await asyncio.wait([f for f in sent.values()], timeout=60)

        acknowledged = {p: f.result() for p, f in sent.items() if f.done() and f.exception() is None}
        refused = [p for p, f in sent.items() if f.done() and f.exception() is not None]
        assert all(f.done() for f in sent.values())
        assert refused, "the older producer's sends after the newer one opened must be refused"
        for payload in refused:
            with pytest.raises(ProducerFencedError, match="fenced by a newer producer"):
                sent[payload].result()
        assert isinstance(sent[refused[0]].exception(), WriterFencedError)  # the code's family
        with pytest.raises(ProducerFencedError):
            older.send(b"after-fenced")
        # The newer producer continued after every send of the older one that was written.
        assert newer.last_sequence_id == len(acknowledged) + 10 - 1

        seen = await read_until_end(second)
        expected = {**acknowledged, **{b"new-%d" % i: newer_ids[i] for i in range(10)}}
        assert sorted(p for p, _ in seen) == sorted(expected)  # each acknowledged send once, no other
        assert all(expected[p] == mid for p, mid in seen)


async def test_a_fenced_producer_cut_off_cannot_take_its_name_back(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=SRK)
    proxy = CutProxy(store.listen)
    address = await proxy.start()
    try:
        async with (
            Client(coordinators=[], stores=[address]) as first,
            Client(coordinators=[], stores=[store.listen]) as second,
        ):
            older = await first.create_producer(TOPIC, producer_name="app")
            m0 = await older.send(b"m0")
            (await first.connections.get(address)).abort()  # the older producer is cut off
            newer = await second.create_producer(TOPIC, producer_name="app")
            assert newer.last_sequence_id == 0
            n1 = await newer.send(b"n1")
            # Reconnecting, the older one asks to resume the name: refused, its send is not written.
            with pytest.raises(ProducerFencedError, match="taken over by another producer"):
                await older.send(b"m1")
            n2 = await newer.send(b"n2")
            seen = await read_until_end(second)
            assert seen == [(b"m0", m0), (b"n1", n1), (b"n2", n2)]
    finally:
        await proxy.close()


async def test_a_producer_whose_connection_was_cut_resumes_its_name_and_resends_once(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=SRK)
    proxy = CutProxy(store.listen)
    address = await proxy.start()
    try:
        async with Client(coordinators=[], stores=[address]) as client:
            producer = await client.create_producer(TOPIC, producer_name="app")
            m0 = await producer.send(b"m0")
            # The next connection resumes the name, then its send is written but its receipt lost.
            proxy.arm(CutRule(upstream_bytes=setup_frame_bytes("app") + 1, drop_answers=True))
            (await client.connections.get(address)).abort()
            m1 = await producer.send(b"m1")  # resent on a third connection: a duplicate there
            assert proxy.cuts == 1 and producer.last_sequence_id == 1
            status, metrics = http("GET", f"{store.admin_url()}/metrics")
            assert status == 200
            assert f'txnkeeper_srk_duplicate_sends_total{{topic="{TOPIC}"}} 1.0' in metrics
            m2 = await producer.send(b"m2")
            seen = await read_until_end(client)
            assert seen == [(b"m0", m0), (b"m1", m1), (b"m2", m2)]
            assert m1 != MessageId(-1, -1)  # the store still knew the duplicate's original id
    finally:
        await proxy.close()


class _Conn:
    """A connection as the block appender sees it (only its id matters here)."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.is_open = True

    def push(self, command: api.Command) -> None:
        raise AssertionError("nothing is pushed to a producer")

    def ready_for_push(self) -> bool:
        raise AssertionError("nothing is pushed to a producer")


def test_a_producer_session_whose_name_expired_is_renewed_unless_another_took_the_name() -> None:
    now = [1_000_000]
    table = WriterTable(TOPIC, inactivity_ms=60_000, clock_ms=lambda: now[0])
    partition = cast(Partition, SimpleNamespace(writers=table))
    enabled = SimpleNamespace(single_key=SimpleNamespace(enabled=True))
    appender = BlockAppender(lambda: cast(TopicService, enabled))
    first, second = _Conn(1), _Conn(2)
    with pytest.raises(BadRequestError, match="no SetupAppend"):
        appender.producer_session(first, TOPIC, "app")[1]
    epoch, _ = table.setup("app", owner="instance-1")
    appender._sessions[1] = {"app": WriterSession(TOPIC, partition, epoch, "instance-1", "app")}
    assert appender.producer_session(first, TOPIC, "app")[1] == epoch
    with pytest.raises(BadRequestError, match="no SetupAppend"):  # a session of another topic
        appender.producer_session(first, TOPIC + "-other", "app")
    now[0] += 61_000
    assert table.expire() == ["app"]
    renewed = appender.producer_session(first, TOPIC, "app")[1]  # nobody took the name: renewed
    table.check_epoch("app", renewed, producer=True)
    # Expired again, and this time another producer opened the name first: the idle one is fenced.
    now[0] += 61_000
    assert table.expire() == ["app"]
    newer, _ = table.setup("app", owner="instance-2")
    appender._sessions[2] = {"app": WriterSession(TOPIC, partition, newer, "instance-2", "app")}
    stale = appender.producer_session(first, TOPIC, "app")[1]
    with pytest.raises(StoreWriterFencedError, match="newer producer"):
        table.check_epoch("app", stale, producer=True)
    assert appender.producer_session(second, TOPIC, "app")[1] == newer
