"""The client's single-key transactions, send_atomic and idempotent producers against real store pods."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cutproxy import CutProxy, CutRule
from runtime_pods import ServePod

from txnkeeper.client import (
    Client,
    Consumer,
    MessageId,
    UnsupportedFeatureError,
    WriterFencedError,
)

pytestmark = pytest.mark.timeout(120)

TOPIC = "persistent://t/ns/srk"
SRK = ["--srk-enabled", "true", "--release", "3.0.0"]  # single-key transactions need a 3.x release


async def drain(consumer: Consumer, count: int) -> list[tuple[bytes, str, MessageId]]:
    out = []
    for _ in range(count):
        message = await consumer.receive(timeout=30)
        await consumer.acknowledge(message)
        out.append((message.data, message.key, message.message_id))
    return out


async def test_a_committed_transaction_is_read_whole_in_order_with_its_ids_and_key(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=SRK)
    async with Client(coordinators=[], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader")
        writer = await client.create_single_key_writer(TOPIC, "order-17", txn_timeout_ms=10_000)
        aborted = writer.begin_transaction()
        aborted.write(b"never")
        aborted.abort()
        async with writer.begin_transaction() as txn:
            for i in range(5):
                txn.write(b"event-%d" % i)
        ids = txn.message_ids
        first = ids[0]
        assert ids == [MessageId(first.ledger_id, first.entry_id + i) for i in range(5)]
        assert writer.last_event_number == 4  # events 0..4
        assert await drain(consumer, 5) == [(b"event-%d" % i, "order-17", ids[i]) for i in range(5)]
        # Atomic sends go the same way; plain sends after them show nothing else was written.
        producer = await client.create_producer(TOPIC)
        atomic = await producer.send_atomic([b"a", b"b"], key="k2")
        plain = await producer.send(b"plain")
        assert await drain(consumer, 3) == [
            (b"a", "k2", atomic[0]),
            (b"b", "k2", atomic[1]),
            (b"plain", "", plain),
        ]


async def test_a_full_transaction_acks_block_messages(pods: Callable[..., ServePod]) -> None:
    tc = pods("tc-0", "coordinator")
    store = pods("pas-0", "store", extra=SRK)
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "work")
        writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
        async with writer.begin_transaction() as txn:
            txn.write(b"job-1")
            txn.write(b"job-2")
        full = await client.new_transaction(timeout_ms=10_000)
        for _ in range(2):
            message = await consumer.receive(timeout=30)
            await consumer.acknowledge(message, txn=full)
        await full.commit()
        await consumer.close()
        again = await client.subscribe(TOPIC, "work")
        producer = await client.create_producer(TOPIC)
        await producer.send(b"marker")
        assert (await again.receive(timeout=30)).data == b"marker"  # the acked block is not redelivered


async def test_writer_numbering_survives_a_store_restart(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store", extra=SRK)
    async with Client(coordinators=[], stores=[store.listen]) as client:
        writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
        async with writer.begin_transaction() as txn:
            txn.write(b"1")
            txn.write(b"2")
        store.restart()
        # The same writer goes on (it resynchronises); a new client continuing the writer id too.
        async with writer.begin_transaction() as txn:
            txn.write(b"3")
        assert writer.last_event_number == 2
    async with Client(coordinators=[], stores=[store.listen]) as client:
        resumed = await client.create_single_key_writer(TOPIC, "k", 10_000, writer_id=writer.writer_id)
        assert resumed.last_event_number == 2


async def test_a_newer_writer_with_the_same_id_fences_the_older(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store", extra=SRK)
    async with (
        Client(coordinators=[], stores=[store.listen]) as first,
        Client(coordinators=[], stores=[store.listen]) as second,
    ):
        older = await first.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
        newer = await second.create_single_key_writer(TOPIC, "k", 10_000, writer_id=older.writer_id)
        async with newer.begin_transaction() as txn:
            txn.write(b"new")
        txn = older.begin_transaction()
        txn.write(b"old")
        with pytest.raises(WriterFencedError):
            await txn.commit()


async def test_a_store_without_the_feature_is_unsupported(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store")  # single-key transactions not enabled (the default)
    async with Client(coordinators=[], stores=[store.listen]) as client:
        with pytest.raises(UnsupportedFeatureError, match="single-routing-key transactions are disabled"):
            await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
        with pytest.raises(UnsupportedFeatureError, match="last sequence id"):
            await client.create_producer(TOPIC, producer_name="p")


async def test_a_named_producer_resent_after_a_lost_receipt_appears_once(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=SRK)
    proxy = CutProxy(store.listen)
    address = await proxy.start()
    try:
        async with Client(coordinators=[], stores=[address]) as client:
            producer = await client.create_producer(TOPIC, producer_name="app-1")
            await producer.send(b"m1")
            proxy.arm(CutRule(upstream_bytes=1, drop_answers=True))
            conn = await client.connections.get(address)
            conn.abort()  # the next send goes on a new connection whose receipts are lost
            m2 = await producer.send(b"m2")
            assert proxy.cuts == 1 and producer.last_sequence_id == 1  # m1 was 0
            consumer = await client.subscribe(TOPIC, "reader")
            seen = await drain(consumer, 2)
            assert [data for data, _, _ in seen] == [b"m1", b"m2"] and seen[1][2] == m2
            with pytest.raises(TimeoutError):
                await consumer.receive(timeout=2)
        # The same name after a restart of the application continues its sequence ids.
        async with Client(coordinators=[], stores=[store.listen]) as client:
            again = await client.create_producer(TOPIC, producer_name="app-1")
            assert again.last_sequence_id == 1
    finally:
        await proxy.close()
