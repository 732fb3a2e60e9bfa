"""A dispatch pass reads at most about READ_BATCH_BYTES (Pulsar's dispatcherMaxReadSizeBytes), judged by
the sizes of the entries it read last: large entries are read a few at a time, small ones READ_BATCH at
a time. Unit test with a reader that records what it was asked for."""

from __future__ import annotations

import asyncio

import pytest
from test_subscription_read_failures import Consumer, Cursor, PendingLog

from txnkeeper.ledger.position import Position
from txnkeeper.topic.records import encode_data
from txnkeeper.topic.subscription import READ_BATCH, READ_BATCH_BYTES, Subscription
from txnkeeper.topic.txnbuffer import TransactionBuffer

TOPIC = "persistent://public/default/t"


class CountingReader:
    def __init__(self, payload: int, count: int) -> None:
        self.entries = [(Position(3, i), encode_data(b"x" * payload, "", None, 0)) for i in range(count)]
        self.asked: list[int] = []

    async def read_after(self, position: Position | None, max_entries: int) -> list[tuple[Position, bytes]]:
        self.asked.append(max_entries)
        start = 0 if position is None else position.entry_id + 1
        return self.entries[start : start + max_entries]


async def deliver_all(reader: CountingReader) -> Consumer:
    sub = Subscription(
        TOPIC, "s", reader=reader, cursor=Cursor(), buffer=TransactionBuffer(), pending_log=PendingLog()
    )
    consumer = Consumer()
    consumer.subscription = sub
    sub.add_consumer(consumer, 100_000)
    sub.start()
    try:
        async with asyncio.timeout(60):  # a deadline, not an expected duration
            while len(consumer.received) < len(reader.entries):
                await consumer.changed.wait()
                consumer.changed.clear()
    finally:
        await sub.close()
    return consumer


@pytest.mark.parametrize(("payload", "per_read"), [(10_000, READ_BATCH_BYTES // 10_000), (100, READ_BATCH)])
async def test_reads_are_bounded_by_bytes_once_entry_sizes_are_known(payload: int, per_read: int) -> None:
    reader = CountingReader(payload, 600)
    consumer = await deliver_all(reader)
    assert len(consumer.received) == 600
    assert reader.asked[0] == READ_BATCH, "nothing read yet: no estimate"
    later = reader.asked[1:]
    assert later and max(later) <= per_read, reader.asked
    assert max(later) >= per_read - 1, reader.asked
