"""Retention (Pulsar's retentionTimeInMinutes / retentionSizeInMB) on real store pods (issue 25 item 14).

A ledger every subscription is done with is kept while it is inside retention and trimmed once it is
outside; a topic without subscriptions is trimmed under retention like one whose subscriptions all
acknowledged everything (Pulsar's rule), and the transaction outcomes it kept go with its ledgers; a
ledger holding an open transaction's messages is never trimmed. Ledgers are rolled over by restarting
the store (opening a managed ledger closes its last ledger, as Pulsar's does).

Before this change a store had no retention: the ``topicPolicies`` section of the config file was
refused (``serve`` exited 2: "unknown top-level key(s) ['topicPolicies']") and the policy verbs were
404s, so every test here failed when its pod started.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from policy_pods import (
    checks,
    fill,
    get_policy,
    ledger_ids,
    metric,
    set_policy,
    store_config,
    wait_for,
    wait_for_checks,
)
from runtime_pods import ServePod

from txnkeeper.client import Client

pytestmark = pytest.mark.timeout(300)

MESSAGE = 10_000
PER_LEDGER = 80  # ~0.8 MB of payload per ledger


async def _consume_all(store: ServePod, topic: str, subscription: str, count: int) -> list[bytes]:
    async with Client(coordinators=[], stores=[store.listen]) as client:
        consumer = await client.subscribe(topic, subscription)
        received = []
        for _ in range(count):
            message = await consumer.receive(timeout=30)
            await consumer.acknowledge(message)
            received.append(message.data)
        return received


async def _subscribe(store: ServePod, topic: str, subscription: str) -> None:
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await (await client.subscribe(topic, subscription)).close()


async def test_retention_size_keeps_consumed_ledgers_up_to_the_limit(
    pods: Callable[..., ServePod],
) -> None:
    """retentionSizeInMB=1, time -1: consumed ledgers are trimmed oldest first while the topic keeps at
    least 1 MiB without them (Pulsar's size rule counts the whole topic); the rest stay."""
    topic = "persistent://t/ns/retention-size"
    store = pods(
        "pas-0",
        "store",
        config=store_config(retention={"retentionTimeInMinutes": -1, "retentionSizeInMB": 1}),
    )
    await _subscribe(store, topic, "s")
    for round_ in range(3):
        async with Client(coordinators=[], stores=[store.listen]) as client:
            await fill(client, topic, PER_LEDGER, MESSAGE, prefix=f"r{round_}")
        store.restart()  # closes the ledger just written
    first, second, third, current = ledger_ids(store, topic)
    assert get_policy(store, "retention", topic)["effective"] == {
        "retentionTimeInMinutes": -1,
        "retentionSizeInMB": 1,
    }
    await _consume_all(store, topic, "s", 3 * PER_LEDGER)
    # 3 x ~0.8 MB: without the first the topic still holds ~1.6 MB >= 1 MiB (trimmed); without the
    # second too it would hold ~0.8 MB < 1 MiB (kept, and so is everything after it).
    await wait_for(
        lambda: ledger_ids(store, topic) == [second, third, current], 60, "the first ledger trimmed"
    )
    await wait_for_checks(store, topic, 3)
    assert ledger_ids(store, topic) == [second, third, current]
    assert metric(store, "txnkeeper_topic_trimmed_ledgers_total", topic) == 1
    assert first not in ledger_ids(store, topic)


@pytest.mark.wallclock
async def test_retention_time_keeps_consumed_ledgers_until_they_are_older(
    pods: Callable[..., ServePod],
) -> None:
    """retentionTimeInMinutes=1, size -1: a consumed, closed ledger stays for a minute after it was
    closed, then goes."""
    topic = "persistent://t/ns/retention-time"
    store = pods(
        "pas-0",
        "store",
        config=store_config(retention={"retentionTimeInMinutes": 1, "retentionSizeInMB": -1}),
    )
    await _subscribe(store, topic, "s")
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await fill(client, topic, 10, 100)
    await _consume_all(store, topic, "s", 10)
    closed_before = time.monotonic()
    store.restart()  # closes the consumed ledger now
    consumed, current = ledger_ids(store, topic)
    await wait_for_checks(store, topic, 3)
    if time.monotonic() - closed_before < 55:  # (on a machine so slow that a minute passed: vacuous)
        assert ledger_ids(store, topic) == [consumed, current], "trimmed while inside retention"
    await wait_for(lambda: ledger_ids(store, topic) == [current], 150, "the ledger trimmed after a minute")
    assert time.monotonic() - closed_before >= 60


async def test_a_topic_without_subscriptions_is_trimmed_and_forgets_its_txn_outcomes(
    pods: Callable[..., ServePod],
) -> None:
    """Retention 0/0 (Pulsar's default): a topic nobody subscribed to keeps nothing outside the open
    ledger; the kept-outcome gauge of its transactions goes to zero (the aborted ones go with the
    trimmed ledger, the committed ones once no ticket of theirs can still be valid)."""
    topic = "persistent://t/ns/no-subscription"
    tc = pods("tc-0", "coordinator")
    store = pods(
        "pas-0", "store", config=store_config(retention={"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    )
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"plain")
        for commit in (True, False, True):
            txn = await client.new_transaction(timeout_ms=2_000)
            await producer.send(b"in-txn", txn=txn)
            await (txn.commit() if commit else txn.abort())
    assert metric(store, "txnkeeper_topic_kept_txn_outcomes", topic) == 3
    store.restart()  # closes the ledger: now it is outside retention 0
    await wait_for(lambda: len(ledger_ids(store, topic)) == 1, 60, "the closed ledger trimmed")
    (current,) = ledger_ids(store, topic)
    await wait_for(
        lambda: metric(store, "txnkeeper_topic_kept_txn_outcomes", topic) == 0, 90, "no outcome kept"
    )
    assert metric(store, "txnkeeper_topic_ongoing_transactions", topic) == 0
    assert ledger_ids(store, topic) == [current]


async def test_an_open_transactions_ledger_survives_trimming(pods: Callable[..., ServePod]) -> None:
    """Retention 0/0 and no subscription would trim every closed ledger; the one holding an open
    transaction's message stays (however many checks run), and once the transaction commits its
    message is read by a subscription created then."""
    topic = "persistent://t/ns/open-txn"
    tc = pods("tc-0", "coordinator")
    store = pods(
        "pas-0", "store", config=store_config(retention={"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    )
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(topic)
        await producer.send(b"before")
        txn = await client.new_transaction(timeout_ms=180_000)
        await producer.send(b"open-txn-message", txn=txn)
        await producer.send(b"after")
        store.restart()  # the txn's ledger is closed (and its first position comes from the snapshot)
        holding, current = ledger_ids(store, topic)
        await wait_for_checks(store, topic, 5)
        assert ledger_ids(store, topic) == [holding, current]
        assert metric(store, "txnkeeper_topic_ongoing_transactions", topic) == 1
        # Keep everything from now on, so that the reader below cannot race the trim after the commit.
        set_policy(store, "retention", topic, {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        await wait_for_checks(store, topic, 1)
        await txn.commit()
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(topic, "late")
        got = [(await consumer.receive(timeout=30)).data for _ in range(3)]
    assert got == [b"before", b"open-txn-message", b"after"]
    assert checks(store, topic) > 0


async def test_without_retention_settings_a_topic_without_subscriptions_keeps_its_data(
    pods: Callable[..., ServePod],
) -> None:
    """No retention anywhere (no config section, no topic setting): as before, a topic nobody
    subscribed to keeps its messages for a future subscription (txnkeeper does not delete unread
    data unless told to)."""
    topic = "persistent://t/ns/unconfigured"
    store = pods("pas-0", "store", config=store_config())
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await fill(client, topic, 5, 10)
    store.restart()
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await fill(client, topic, 1, 10, prefix="after")  # the topic is open (and checked) again
    ids = ledger_ids(store, topic)
    await wait_for_checks(store, topic, 3)
    assert ledger_ids(store, topic) == ids and len(ids) == 2
    assert get_policy(store, "retention", topic)["effective"] == {}
    async with Client(coordinators=[], stores=[store.listen]) as client:
        consumer = await client.subscribe(topic, "later")
        assert (await consumer.receive(timeout=30)).data.startswith(b"m-0")
