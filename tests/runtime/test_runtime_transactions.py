"""Transaction semantics through real processes: conflicting acks, timeout aborts, fenced zombies."""

from __future__ import annotations

import pytest
from runtime_pods import ServePod, coordinator_connection
from runtime_waits import wait_until

from txnkeeper.client import (
    Client,
    InvalidTxnStatusError,
    ServiceError,
    TransactionFailedError,
    TxnConflictError,
)
from txnkeeper.pb import txnkeeper_api_pb2 as api

pytestmark = pytest.mark.timeout(120)

IN = "persistent://t/ns/in"
OUT = "persistent://t/ns/out"


async def test_conflicting_ack_fails_and_its_transaction_aborts(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        first = await client.subscribe(IN, "shared")
        second = await client.subscribe(IN, "shared")
        producer = await client.create_producer(IN)
        await producer.send(b"m1")
        message = await first.receive(timeout=10)
        winner = await client.new_transaction()
        loser = await client.new_transaction()
        await first.acknowledge(message, txn=winner)
        with pytest.raises(TxnConflictError):
            await second.acknowledge(message.message_id, txn=loser)
        with pytest.raises(TxnConflictError):
            await second.acknowledge(message.message_id)  # a plain ack may not take it either
        with pytest.raises(TransactionFailedError):
            await loser.commit()
        assert await client.transaction_status(loser) == "ABORTED"
        await winner.commit()
        assert await client.transaction_status(winner) == "COMMITTED"
        # The committed ack holds: only the next message is delivered, m1 never again.
        await second.close()
        await producer.send(b"m2")
        assert (await first.receive(timeout=10)).data == b"m2"


async def test_timeout_aborts_drops_output_and_redelivers_input(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "work")
        reader = await client.subscribe(OUT, "reader")
        await (await client.create_producer(IN)).send(b"job")
        out = await client.create_producer(OUT)
        txn = await client.new_transaction(timeout_ms=2000)
        message = await consumer.receive(timeout=10)
        await out.send(b"never", txn=txn)
        await consumer.acknowledge(message, txn=txn)

        async def aborted() -> bool:
            return await client.transaction_status(txn) == "ABORTED"

        await wait_until(aborted, 15, "the coordinator to abort the timed-out transaction")
        again = await consumer.receive(timeout=10)
        assert again.message_id == message.message_id and again.redelivery_count >= 1
        with pytest.raises((InvalidTxnStatusError, ServiceError)):
            await txn.commit()
        await out.send(b"after")
        assert (await reader.receive(timeout=10)).data == b"after"


async def test_zombie_cannot_produce_into_an_ended_transaction(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        out = await client.create_producer(OUT)
        txn = await client.new_transaction()
        await out.send(b"kept", txn=txn)
        await txn.commit()
        # The transaction is over: the coordinator refuses to add anything and the store refuses writes.
        txn.state = "OPEN"  # a zombie that missed the end
        with pytest.raises(ServiceError):
            await out.send(b"late", txn=txn)


async def test_cumulative_txn_ack_survives_a_store_kill(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "cumulative")
        producer = await client.create_producer(IN)
        for i in range(5):
            await producer.send(f"m{i}".encode())
        received = [await consumer.receive(timeout=10) for _ in range(5)]
        assert [m.data for m in received] == [f"m{i}".encode() for i in range(5)]
        txn = await client.new_transaction()
        await consumer.acknowledge_cumulative(received[2], txn=txn)
        await consumer.acknowledge(received[4])  # a plain individual ack
        await txn.commit()
    store.kill()
    store.start()
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "cumulative")
        assert (await consumer.receive(timeout=15)).data == b"m3"
        # m4's individual ack survived too: the next delivery is a marker sent now, not m4 again
        # (a marker instead of "nothing within a short wait", which a loaded machine could fake)
        await (await client.create_producer(IN)).send(b"END")
        assert (await consumer.receive(timeout=15)).data == b"END"


async def test_a_send_its_caller_cancelled_makes_commit_abort(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        reader = await client.subscribe(OUT, "cancelled")
        out = await client.create_producer(OUT)
        txn = await client.new_transaction()
        sent = out.send(b"maybe", txn=txn)  # sent at the call
        sent.cancel()  # the application gave up: it cannot know whether the send took effect
        with pytest.raises(TransactionFailedError):
            await txn.commit()
        assert await client.transaction_status(txn) == "ABORTED"
        await out.send(b"after")
        assert (await reader.receive(timeout=10)).data == b"after"


async def test_end_on_store_is_idempotent_and_the_per_partition_ends_still_work(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "ends")
        reader = await client.subscribe(OUT, "ends-reader")
        await (await client.create_producer(IN)).send(b"in")
        out = await client.create_producer(OUT)
        txn = await client.new_transaction()
        message = await consumer.receive(timeout=10)
        await out.send(b"out", txn=txn)
        await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        assert (await reader.receive(timeout=10)).data == b"out"
        # The coordinator ended it with one EndTxnOnStore; a repeat (a coordinator retry) and the older
        # per-partition and per-subscription ends are all answered Success, and change nothing.
        txn_pb = api.TxnId(most=txn.txn_id.most, least=txn.txn_id.least)
        as_coordinator = await coordinator_connection(store)
        for command in (
            api.Command(
                end_txn_on_store=api.EndTxnOnStore(
                    txn_id=txn_pb,
                    action=api.COMMIT,
                    topics=[OUT],
                    subscriptions=[api.SubscriptionRef(topic=IN, subscription="ends")],
                )
            ),
            api.Command(
                end_txn_on_partition=api.EndTxnOnPartition(topic=OUT, txn_id=txn_pb, action=api.COMMIT)
            ),
            api.Command(
                end_txn_on_subscription=api.EndTxnOnSubscription(
                    topic=IN, subscription="ends", txn_id=txn_pb, action=api.COMMIT
                )
            ),
        ):
            response = await as_coordinator.request(command, 10)
            assert response.WhichOneof("body") == "success"
        with pytest.raises(InvalidTxnStatusError):
            await as_coordinator.request(
                api.Command(
                    end_txn_on_store=api.EndTxnOnStore(txn_id=txn_pb, action=api.ABORT, topics=[OUT])
                ),
            )
        # Several ends in one request are applied and answered one by one.
        batch = api.Command()
        ends = batch.end_txns_on_store.ends
        ends.add(txn_id=txn_pb, action=api.COMMIT, topics=[OUT])  # a repeat: applied (no-op)
        ends.add(txn_id=txn_pb, action=api.ABORT, topics=[OUT])  # the other way: refused
        ends.add(txn_id=txn_pb, action=api.COMMIT)  # names nothing: refused
        answer = (await as_coordinator.request(batch, 10)).end_txns_on_store_result
        assert list(answer.failed) == [1, 2]
        assert [e.code for e in answer.errors] == [api.INVALID_TXN_STATUS, api.BAD_REQUEST]
        with pytest.raises(TimeoutError):
            await reader.receive(timeout=0.5)
