"""End to end through real processes: produce, consume, commit and abort over the client library."""

from __future__ import annotations

import pytest
from runtime_pods import ServePod

from txnkeeper.client import Client

pytestmark = pytest.mark.timeout(120)


async def test_committed_messages_are_delivered_aborted_never(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe("persistent://t/ns/in", "sub")
        producer = await client.create_producer("persistent://t/ns/in")
        await producer.send(b"plain-1")
        committed = await client.new_transaction(timeout_ms=30_000)
        aborted = await client.new_transaction(timeout_ms=30_000)
        await producer.send(b"txn-commit", txn=committed)
        await producer.send(b"txn-abort", txn=aborted)
        await producer.send(b"plain-2")
        first = await consumer.receive(timeout=10)
        assert first.data == b"plain-1"
        # plain-2 sits behind two open transactions: nothing more may be dispatched yet.
        try:
            early = await consumer.receive(timeout=0.3)
            raise AssertionError(f"dispatched {early.data!r} past an open transaction")
        except TimeoutError:
            pass
        await aborted.abort()
        await committed.commit()
        got = [(await consumer.receive(timeout=10)).data for _ in range(2)]
        assert got == [b"txn-commit", b"plain-2"]
