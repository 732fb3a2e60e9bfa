"""Message TTL (Pulsar's messageTTLInSeconds) on a real store pod (issue 25 item 14).

Unacknowledged messages older than the TTL are acknowledged automatically for every subscription:
one with a consumer that received them without acknowledging, and one nobody reads. Younger messages
are not touched, and an expired message a consumer still holds is never redelivered (its late ack is
accepted). Before this change the ``message-ttl`` verb was a 404 and nothing ever expired.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from policy_pods import fill, mark_delete, set_policy, store_config, wait_for, wait_for_checks
from runtime_pods import ServePod

from txnkeeper.client import Client

pytestmark = pytest.mark.timeout(180)


async def test_message_ttl_acknowledges_old_messages_on_every_subscription(
    pods: Callable[..., ServePod],
) -> None:
    topic = "persistent://t/ns/ttl"
    store = pods("pas-0", "store", config=store_config())
    async with Client(coordinators=[], stores=[store.listen]) as client:
        reading = await client.subscribe(topic, "reading")
        await (await client.subscribe(topic, "idle")).close()
        old = await fill(client, topic, 20, 100, prefix="old")
        held = [await reading.receive(timeout=30) for _ in range(5)]  # received, not acknowledged
        last = (old[-1].ledger_id, old[-1].entry_id)

        set_policy(store, "message-ttl", topic, {"messageTTLInSeconds": 1})
        await wait_for(
            lambda: all(mark_delete(store, topic, s) >= last for s in ("reading", "idle")),
            60,
            "every old message acknowledged by the TTL on both subscriptions",
        )
        await reading.acknowledge(held[0])  # a late ack of an expired message is accepted

        set_policy(store, "message-ttl", topic, {"messageTTLInSeconds": 3600})
        await fill(client, topic, 3, 100, prefix="young")
        await wait_for_checks(store, topic, 3)
        assert mark_delete(store, topic, "idle") == last, "a message younger than the TTL expired"
        await reading.close()  # its unacknowledged (expired) messages are not redelivered

        for subscription in ("reading", "idle"):
            consumer = await client.subscribe(topic, subscription)
            got = [(await consumer.receive(timeout=30)).data[:7] for _ in range(3)]
            assert got == [b"young-0", b"young-1", b"young-2"], subscription
            await consumer.close()
