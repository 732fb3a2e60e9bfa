"""Consumers that subscribe with huge permits and never read cannot grow a store pod without bound
(issue 25 item 3), and give back what they held once they are cut.

Real ``txnkeeper serve`` store pods, real sockets: each lazy consumer is a raw connection with a small
receive buffer that sends one Subscribe (100,000 permits, its own subscription) on a 60 MB topic and
never reads. Before the fix 16 of them took a store from ~100 MB to ~1.1 GB of RSS, which stayed after
the server cut them (every message pushed was kept for redelivery, payload and all).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
from runtime_pods import ServePod, pod_gauge
from runtime_waits import wait_until

from txnkeeper.client import Client, MessageId
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import encode_frame
from txnkeeper.protocol.rpc import split_address

pytestmark = pytest.mark.timeout(300)
TOPIC = "persistent://t/ns/lazy"
MESSAGES = 6_000
PAYLOAD_BYTES = 10_000  # 60 MB in all
LAZY = 32
# What a store pod may grow by while 32 lazy consumers hold the default budgets (contracts §6): each
# connection stops being pushed to at 1 MiB unsent, all of them together at the 64 MiB process-wide
# budget, plus the allocator's slack. Unbounded it was ~2 GB.
RSS_BUDGET = 160 * 1024 * 1024
# Once every lazy consumer is cut, the pod is back within this of where it was before they came.
RSS_GIVEN_BACK = 48 * 1024 * 1024


def _payload(index: int) -> bytes:
    return index.to_bytes(4, "big") + b"x" * (PAYLOAD_BYTES - 4)


def _cut_connections(pod: ServePod) -> float:
    closed = "txnkeeper_server_closed_connections_total"
    return sum(pod_gauge(pod, closed, f'reason="{why}"') for why in ("write_timeout", "max_unsent_bytes"))


async def _fill_topic(pod: ServePod) -> dict[MessageId, int]:
    """Write the topic; where each message went (sends are pipelined, so not in index order)."""
    written: dict[MessageId, int] = {}
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        producer = await client.create_producer(TOPIC)
        for start in range(0, MESSAGES, 500):
            batch = range(start, start + 500)
            ids = await asyncio.gather(*(producer.send(_payload(i)) for i in batch))
            written.update(zip(ids, batch, strict=True))
    return written


def _lazy_consumer(address: str, subscription: str) -> socket.socket:
    """A connection that subscribes with the most permits a store grants and never reads."""
    host, port = split_address(address)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    subscribe = api.Subscribe(topic=TOPIC, subscription=subscription, consumer_id=1, permits=100_000)
    sock.sendall(encode_frame(api.Command(request_id=1, subscribe=subscribe)))
    return sock


async def _read_everything(pod: ServePod, subscription: str, written: dict[MessageId, int]) -> None:
    """A consumer that reads gets every message of the subscription once, in order and with its own
    payload: nothing that was pushed to a cut connection is lost."""
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        consumer = await client.subscribe(TOPIC, subscription)
        for message_id in sorted(written):
            message = await consumer.receive(timeout=30)
            assert message.message_id == message_id, (message.message_id, message_id)
            assert message.data == _payload(written[message_id]), message_id
            await consumer.acknowledge(message)


async def test_consumers_that_never_read_cannot_grow_the_store(pods: Callable[..., ServePod]) -> None:
    # A short write timeout so that the lazy connections are cut within the test (default 120 s).
    store = pods("pas-0", "store", extra=["--write-timeout", "5"])
    written = await _fill_topic(store)
    baseline = store.rss_bytes()
    lazy = [_lazy_consumer(store.listen, f"lazy-{i}") for i in range(LAZY)]
    peak = baseline

    async def cut_or_over_budget() -> bool:
        nonlocal peak
        peak = max(peak, store.rss_bytes())
        return peak - baseline > RSS_BUDGET or _cut_connections(store) >= LAZY

    await wait_until(cut_or_over_budget, 120, f"the server to cut the {LAZY} consumers that do not read")
    grown = peak - baseline
    assert grown <= RSS_BUDGET, f"RSS grew by {grown / 2**20:.0f} MiB under {LAZY} consumers that never read"

    async def given_back() -> bool:
        return store.rss_bytes() - baseline <= RSS_GIVEN_BACK

    try:
        await wait_until(given_back, 30, "the store to give back what the cut connections held")
    except TimeoutError:
        held = (store.rss_bytes() - baseline) / 2**20
        raise AssertionError(f"{held:.0f} MiB still held after every lazy consumer was cut") from None
    for sock in lazy:
        sock.close()
    await _read_everything(store, "lazy-0", written)


async def test_a_process_wide_budget_pauses_pushes_but_not_for_consumers_that_read(
    pods: Callable[..., ServePod],
) -> None:
    budget = 8 * 1024 * 1024
    store = pods("pas-0", "store", extra=["--max-total-unsent-bytes", str(budget)])
    written = await _fill_topic(store)
    lazy = [_lazy_consumer(store.listen, f"lazy-{i}") for i in range(LAZY)]
    highest = 0.0

    async def budget_held() -> bool:
        nonlocal highest
        unsent = pod_gauge(store, "txnkeeper_server_unsent_bytes")
        highest = max(highest, unsent)
        return pod_gauge(store, "txnkeeper_server_push_paused_connections") >= LAZY

    await wait_until(budget_held, 60, "every lazy consumer's pushes to be paused")
    # Over the budget a connection may still be pushed to while it holds under 64 KiB (so a consumer
    # that reads is never paused by others): the budget plus that floor per connection, plus a frame.
    assert highest <= budget + LAZY * 64 * 1024 + 64 * 1024, highest
    # The lazy consumers hold the budget, and a consumer that reads still gets everything.
    await _read_everything(store, "reader", written)
    assert pod_gauge(store, "txnkeeper_server_unsent_bytes") <= budget + LAZY * 64 * 1024 + 64 * 1024
    for sock in lazy:
        sock.close()
