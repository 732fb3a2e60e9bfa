"""Begin + register in one request (NewTxn naming partitions and subscriptions), through real pods.

The coordinator logs the ADD records with NEW and answers with the tickets AddToTxn would have given,
so the client sends and acks without an AddToTxn; the tests check that the coordinator really knows
those partitions and subscriptions (its commit and abort reach them), that nothing else changed for
what was not named, and that a bad name is refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from runtime_pods import ServePod

from txnkeeper.client import Client, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api

pytestmark = pytest.mark.timeout(120)

IN = "persistent://t/ns/begin-in"
OUT = "persistent://t/ns/begin-out"


def record_requests(client: Client) -> list[str]:
    """The body names of every request the client sends from now on (observed, then sent as usual)."""
    sent: list[str] = []
    request: Callable[[str, api.Command], Awaitable[api.Command]] = client.connections.request

    def recording(address: str, command: api.Command) -> Awaitable[api.Command]:
        sent.append(str(command.WhichOneof("body")))
        return request(address, command)

    client.connections.request = recording  # type: ignore[method-assign]
    return sent


async def test_named_at_begin_needs_no_add_and_commit_reaches_them(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "work")
        reader = await client.subscribe(OUT, "reader")
        await (await client.create_producer(IN)).send(b"job")
        out = await client.create_producer(OUT)
        message = await consumer.receive(timeout=10)
        sent = record_requests(client)
        txn = await client.new_transaction(timeout_ms=30_000, topics=[OUT], subscriptions=[(IN, "work")])
        await out.send(b"done", txn=txn)
        await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        assert "add_to_txn" not in sent, sent
        assert sent.count("new_txn") == 1
        assert await client.transaction_status(txn) == "COMMITTED"
        # The commit reached the partition (the output is visible) and the subscription (the
        # transactional ack became durable: the input is not redelivered to a new consumer).
        assert (await reader.receive(timeout=10)).data == b"done"
        await consumer.close()
        again = await client.subscribe(IN, "work")
        await (await client.create_producer(IN)).send(b"next")
        assert (await again.receive(timeout=10)).data == b"next"


async def test_abort_reaches_what_was_named_and_unnamed_topics_register_as_usual(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    other = "persistent://t/ns/begin-other"
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "abort")
        reader = await client.subscribe(OUT, "reader")
        other_reader = await client.subscribe(other, "reader")
        await (await client.create_producer(IN)).send(b"job")
        out = await client.create_producer(OUT)
        side = await client.create_producer(other)
        message = await consumer.receive(timeout=10)
        sent = record_requests(client)
        txn = await client.new_transaction(timeout_ms=30_000, topics=[OUT], subscriptions=[(IN, "abort")])
        await out.send(b"never", txn=txn)
        await side.send(b"never either", txn=txn)  # not named: registered with AddToTxn
        await consumer.acknowledge(message, txn=txn)
        await txn.abort()
        assert sent.count("add_to_txn") == 1, sent
        # The abort reached the named subscription: its ack was dropped, the input comes again.
        again = await consumer.receive(timeout=10)
        assert again.message_id == message.message_id
        # ... and both partitions: what they read next is the first non-transactional message.
        await out.send(b"after")
        await side.send(b"after")
        assert (await reader.receive(timeout=10)).data == b"after"
        assert (await other_reader.receive(timeout=10)).data == b"after"


async def test_a_bad_name_at_begin_is_refused_and_nothing_begins(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        with pytest.raises(ServiceError, match=r"subscription name '' must be 1\.\.512 printable characters"):
            await client.new_transaction(subscriptions=[(IN, "")])
        command = api.Command()
        command.new_txn.timeout_ms = 10_000
        command.new_txn.topics.append(OUT)  # no store_address
        with pytest.raises(ServiceError, match="needs store_address"):
            await client.connections.request(tc.listen, command)
        ok = await client.new_transaction(topics=[OUT])
        await ok.commit()
