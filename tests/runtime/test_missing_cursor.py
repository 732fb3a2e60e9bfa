"""A registered subscription whose cursor file is gone is refused at start, never restarted from 0.

Issue 25 item 2: with the store stopped, a subscription's cursor file was deleted; the restarted store
started without a word and redelivered every message the subscription had acknowledged (plainly and in
a committed transaction). A missing cursor is refused like a damaged one (naming the file), and the
reset is taken only when the operator says so with the documented acceptance file.
"""

from __future__ import annotations

import pytest
from runtime_pods import ServePod

from txnkeeper.client import Client
from txnkeeper.ledger.names import encode_name

pytestmark = pytest.mark.timeout(120)

TOPIC = "persistent://t/ns/cursor-lost"
SUB = "app"


async def test_missing_cursor_file_stops_the_start_until_the_reset_is_accepted(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(TOPIC)
        for i in range(20):
            await producer.send(f"m{i}".encode())
        consumer = await client.subscribe(TOPIC, SUB)
        for _ in range(10):
            await consumer.acknowledge(await consumer.receive(timeout=10))
        txn = await client.new_transaction()
        for _ in range(5):
            await consumer.acknowledge(await consumer.receive(timeout=10), txn=txn)
        await txn.commit()
    store.stop()
    cursors = store.data_dir / "ledgers" / encode_name(TOPIC) / "cursors"
    cursor = cursors / f"{encode_name(SUB, 'cursor')}.json"
    assert cursor.is_file()
    cursor.unlink()

    with pytest.raises(RuntimeError, match="exited with 1") as info:
        store.start()
    log = str(info.value)
    assert f"state file {cursor} is unusable: it is missing" in log, log
    assert f"subscription {SUB!r} of topic {TOPIC!r}" in log, log
    acceptance = cursors / f"{encode_name(SUB, 'cursor')}.accept-reset"
    assert f"touch '{acceptance}'" in log, log
    assert "Traceback" not in log
    assert not cursor.exists()  # nothing was created in its place

    acceptance.touch()
    store.start()
    assert "starts again from the earliest retained entry" in store.log()
    assert cursor.is_file() and not acceptance.exists()  # taken once, not left to accept a later loss
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, SUB)
        again = [(await consumer.receive(timeout=10)).data for _ in range(20)]
    assert again == [f"m{i}".encode() for i in range(20)]  # the reset the operator accepted
