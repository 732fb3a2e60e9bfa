"""Backlog quotas (Pulsar's limitSize / limitTime and their three policies) on a real store pod
(issue 25 item 14).

- ``producer_request_hold``: a send to a topic over its quota is held (not written, not answered)
  until the backlog drains, then written in order.
- ``producer_exception``: such a send fails with ``BacklogQuotaExceededError`` naming the limit, and
  nothing is written.
- ``consumer_backlog_eviction``: the store moves the slowest subscription's cursor forward until its
  backlog is within the quota; the subscription then reads the newest messages, in order, and a
  subscription that keeps up loses nothing.

Before this change the ``backlog-quota`` verb was a 404 and no backlog was ever limited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from policy_pods import fill, get_policy, mark_delete, metric, set_policy, store_config, wait_for
from runtime_pods import ServePod

from txnkeeper.client import BacklogQuotaExceededError, Client

pytestmark = pytest.mark.timeout(180)

LIMIT = 20_000  # bytes
MESSAGE = 1_000


def _exceeded(store: ServePod, topic: str) -> bool:
    return bool(get_policy(store, "backlog-quota", topic)["backlog"]["exceeded"])


async def _over_quota(store: ServePod, client: Client, topic: str, quota: dict[str, Any]) -> None:
    """A subscription nobody reads, the quota, and a backlog of 30 KB over it."""
    await (await client.subscribe(topic, "slow")).close()
    set_policy(store, "backlog-quota", topic, quota)
    await fill(client, topic, 30, MESSAGE)
    await wait_for(lambda: _exceeded(store, topic), 60, "the quota seen exceeded")


async def test_hold_blocks_producers_until_the_backlog_drains(pods: Callable[..., ServePod]) -> None:
    topic = "persistent://t/ns/quota-hold"
    store = pods("pas-0", "store", config=store_config())
    async with Client(coordinators=[], stores=[store.listen]) as client:
        quota = {"limitSize": LIMIT, "limitTime": -1, "policy": "producer_request_hold"}
        await _over_quota(store, client, topic, quota)
        producer = await client.create_producer(topic)
        held = producer.send(b"held")
        await wait_for(
            lambda: metric(store, "txnkeeper_topic_backlog_quota_held_sends", topic) == 1, 30, "the send held"
        )
        assert not held.done()
        consumer = await client.subscribe(topic, "slow")
        for _ in range(30):
            await consumer.acknowledge(await consumer.receive(timeout=30))
        written = await asyncio.wait_for(held, 60)
        message = await consumer.receive(timeout=30)
        assert (message.data, message.message_id) == (b"held", written)
        assert metric(store, "txnkeeper_topic_backlog_quota_held_sends", topic) == 0


@pytest.mark.parametrize(
    ("quota", "says"),
    [
        ({"limitSize": LIMIT, "limitTime": -1}, f"over the limit of {LIMIT} bytes"),
        ({"limitSize": -1, "limitTime": 1}, "older than the limit of 1 s"),
    ],
    ids=["size", "time"],
)
async def test_exception_fails_sends_with_a_clear_error(
    pods: Callable[..., ServePod], quota: dict[str, Any], says: str
) -> None:
    topic = "persistent://t/ns/quota-exception"
    store = pods("pas-0", "store", config=store_config())
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await _over_quota(store, client, topic, {**quota, "policy": "producer_exception"})
        producer = await client.create_producer(topic)
        with pytest.raises(BacklogQuotaExceededError) as refused:
            await producer.send(b"refused")
        text = str(refused.value)
        assert f"backlog quota of {topic} is exceeded" in text and says in text, text
        assert "subscription 'slow'" in text and "nothing was written" in text, text
        assert metric(store, "txnkeeper_topic_backlog_quota_refused_sends_total", topic) >= 1
        consumer = await client.subscribe(topic, "slow")
        got = [(await consumer.receive(timeout=30)).data for _ in range(30)]
        assert all(not data.startswith(b"refused") for data in got)
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout=1)


async def test_eviction_moves_the_slowest_cursor(pods: Callable[..., ServePod]) -> None:
    topic = "persistent://t/ns/quota-eviction"
    store = pods("pas-0", "store", config=store_config())
    async with Client(coordinators=[], stores=[store.listen]) as client:
        fast = await client.subscribe(topic, "fast")
        await (await client.subscribe(topic, "slow")).close()
        set_policy(
            store,
            "backlog-quota",
            topic,
            {"limitSize": LIMIT, "limitTime": -1, "policy": "consumer_backlog_eviction"},
        )
        ids = await fill(client, topic, 60, MESSAGE)
        fast_got = []
        for _ in range(60):
            message = await fast.receive(timeout=30)
            await fast.acknowledge(message)
            fast_got.append(message.message_id)
        assert fast_got == ids
        await wait_for(
            lambda: (
                metric(store, "txnkeeper_topic_cursor_skips_total", topic, reason="backlog_eviction") >= 1
            ),
            60,
            "the slow cursor moved by eviction",
        )
        await wait_for(lambda: not _exceeded(store, topic), 60, "the backlog within the quota")
        moved_to = mark_delete(store, topic, "slow")
        assert moved_to >= (ids[0].ledger_id, ids[0].entry_id)
        slow = await client.subscribe(topic, "slow")
        first = await slow.receive(timeout=30)
        start = ids.index(first.message_id)
        assert start > 0 and (ids[start - 1].ledger_id, ids[start - 1].entry_id) <= moved_to
        rest = [first.message_id] + [(await slow.receive(timeout=30)).message_id for _ in ids[start + 1 :]]
        assert rest == ids[start:]
        assert len(rest) * MESSAGE <= LIMIT
