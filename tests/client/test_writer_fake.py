"""The single-key writer, send_atomic and the idempotent producer against a fake store on a real socket:
each reconnect decision produced exactly (answer lost after applying, state forgotten, fenced, old
release), and the client-only rules (buffering, size limit, timeout, one open transaction)."""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import AsyncIterator

import pytest

from txnkeeper.client import (
    Client,
    InvalidTxnStatusError,
    MaxTransactionSizeExceededError,
    MessageId,
    ServiceError,
    TxnFailedError,
    UnsupportedFeatureError,
    WriterFencedError,
    WriterStateLostError,
)
from txnkeeper.client.appender import CHUNK_BYTES, encode_events

from .fakestore import LEDGER, FakeStore, start_fake

pytestmark = pytest.mark.timeout(60)
TOPIC = "persistent://t/ns/srk"


@pytest.fixture
async def store() -> AsyncIterator[tuple[FakeStore, Client]]:
    fake = FakeStore()
    server, address = await start_fake(fake)
    client = Client(coordinators=[], stores=[address], operation_timeout=10)
    yield fake, client
    await client.close()
    await server.close()


async def test_events_are_buffered_until_commit_and_get_contiguous_ids(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "order-1", txn_timeout_ms=10_000)
    async with writer.begin_transaction() as txn:
        for i in range(5):
            txn.write(f"e{i}".encode())
        assert fake.messages == []  # nothing sent before commit
    assert txn.message_ids == [MessageId(LEDGER, i) for i in range(5)]
    assert fake.messages == [("order-1", f"e{i}".encode()) for i in range(5)]
    assert writer.last_event_number == 4  # events 0..4


async def test_abort_and_an_exception_write_nothing(store: tuple[FakeStore, Client]) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    txn = writer.begin_transaction()
    txn.write(b"x")
    txn.abort()
    with pytest.raises(RuntimeError, match="application failed"):
        async with writer.begin_transaction() as txn2:
            txn2.write(b"y")
            raise RuntimeError("application failed")
    assert txn2.state == "ABORTED"
    assert fake.messages == [] and fake.blocks_applied == 0


async def test_one_open_transaction_per_writer(store: tuple[FakeStore, Client]) -> None:
    _, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    txn = writer.begin_transaction()
    with pytest.raises(InvalidTxnStatusError, match="already has an open transaction"):
        writer.begin_transaction()
    txn.abort()
    writer.begin_transaction().abort()


async def test_a_write_over_the_size_limit_is_refused_and_nothing_is_sent(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000, max_txn_bytes=1000)
    txn = writer.begin_transaction()
    txn.write(b"a" * 600)
    with pytest.raises(MaxTransactionSizeExceededError, match="above max_txn_bytes=1000"):
        txn.write(b"b" * 401)
    assert fake.messages == []
    assert await txn.commit() == [MessageId(LEDGER, 0)]  # what fit is still committable


async def test_a_commit_after_the_timeout_fails_and_writes_nothing(store: tuple[FakeStore, Client]) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=50)
    txn = writer.begin_transaction()
    txn.write(b"late")
    await asyncio.sleep(0.1)  # the timeout itself is what is tested: it must pass
    with pytest.raises(TxnFailedError, match="passed its timeout of 50 ms"):
        await txn.commit()
    assert fake.messages == []
    writer.begin_transaction().abort()  # the writer goes on


async def test_a_block_applied_whose_answer_was_lost_is_not_applied_again(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    txn = writer.begin_transaction()
    txn.write(b"first")
    await txn.commit()
    fake.drop_next_answers = 1
    txn = writer.begin_transaction()
    txn.write(b"a")
    txn.write(b"b")
    ids = await txn.commit()
    assert ids == [MessageId(LEDGER, 1), MessageId(LEDGER, 2)]  # the lost answer's ids, from the store
    assert [m[1] for m in fake.messages] == [b"first", b"a", b"b"]
    assert fake.blocks_applied == 2 and fake.duplicates == 1


async def test_a_duplicate_answered_without_ids_fails_that_commit_only_and_the_next_goes_on(
    store: tuple[FakeStore, Client],
) -> None:
    """The head block was applied, its answer lost; the store answers its retransmission as a
    duplicate but no longer knows its message ids. That commit fails saying so; the commit queued
    behind it is still sent and answered (it was once dropped unanswered with the head)."""
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    fake.drop_next_answers = 1
    fake.duplicates_without_ids = True
    head = writer.begin_transaction()
    head.write(b"head")
    head_commit = asyncio.ensure_future(head.commit())
    await asyncio.sleep(0)  # one loop turn: the commit numbers its block and sends it
    behind = writer.begin_transaction()
    behind.write(b"behind")
    behind_commit = asyncio.ensure_future(behind.commit())
    with pytest.raises(ServiceError, match=r"block 0\.\.0 is applied, but the store no longer knows its"):
        await asyncio.wait_for(head_commit, 10)
    assert await asyncio.wait_for(behind_commit, 10) == [MessageId(LEDGER, 1)]
    assert [m[1] for m in fake.messages] == [b"head", b"behind"]
    assert writer.last_event_number == 1


async def test_a_store_that_forgot_the_writer_fails_it_instead_of_reapplying(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    async with writer.begin_transaction() as txn:
        txn.write(b"one")
    fake.writers.clear()  # its state expired
    txn = writer.begin_transaction()
    txn.write(b"two")
    # The fake refuses the block of an unknown writer (state lost), which the writer reports as is.
    with pytest.raises(WriterStateLostError):
        await txn.commit()
    assert [m[1] for m in fake.messages] == [b"one"]


async def test_reconnect_to_a_store_that_forgot_confirmed_events_raises_state_lost(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    async with writer.begin_transaction() as txn:
        txn.write(b"one")
    fake.drop_next_answers = 1
    fake.forget_when_dropping = True  # applied, answer lost, then the writer's state expired
    txn = writer.begin_transaction()
    txn.write(b"two")
    with pytest.raises(WriterStateLostError, match="knows its events only through -1"):
        await txn.commit()
    assert [m[1] for m in fake.messages] == [b"one", b"two"]  # never applied twice


async def test_a_newer_session_fences_the_older_writer(store: tuple[FakeStore, Client]) -> None:
    fake, client = store
    older = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    # Another process (its own connection) takes the same writer id over.
    async with Client(coordinators=[], stores=[client.store_for(TOPIC)]) as other:
        newer = await other.create_single_key_writer(
            TOPIC, "k", txn_timeout_ms=10_000, writer_id=older.writer_id
        )
        async with newer.begin_transaction() as txn:
            txn.write(b"new")
        txn = older.begin_transaction()
        txn.write(b"old")
        with pytest.raises(WriterFencedError, match="fenced by a newer session"):
            await txn.commit()
    assert [m[1] for m in fake.messages] == [b"new"]
    with pytest.raises(WriterFencedError):
        older.begin_transaction()


async def test_an_older_release_is_unsupported_feature(store: tuple[FakeStore, Client]) -> None:
    fake, client = store
    fake.old_release = True
    with pytest.raises(UnsupportedFeatureError, match="does not serve single-routing-key appends"):
        await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    fake.old_release, fake.unparsable = False, True
    with pytest.raises(UnsupportedFeatureError, match="closed the connection twice"):
        await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
    fake.unparsable = False
    with pytest.raises(UnsupportedFeatureError, match="last sequence id"):
        fake.old_release = True
        await client.create_producer(TOPIC, producer_name="p")


async def test_a_large_block_travels_in_chunks_and_arrives_whole(store: tuple[FakeStore, Client]) -> None:
    fake, client = store
    producer = await client.create_producer(TOPIC)
    events = [bytes([i]) * (1024 * 1024) for i in range(10)]  # 10 MiB: 3 events a chunk
    assert len(encode_events(events)) == 4
    ids = await producer.send_atomic(events, key="big")
    assert ids == [MessageId(LEDGER, i) for i in range(10)]
    assert [m[1] for m in fake.messages] == events and {m[0] for m in fake.messages} == {"big"}


def test_events_are_length_prefixed_and_never_split() -> None:
    events = [b"x" * (CHUNK_BYTES - 8), b"yy", b""]
    chunks = encode_events(events)
    assert chunks == [
        struct.pack(">I", CHUNK_BYTES - 8) + events[0],
        struct.pack(">I", 2) + b"yy" + struct.pack(">I", 0),
    ]
    assert zlib.crc32(b"".join(chunks)) == zlib.crc32(chunks[1], zlib.crc32(chunks[0]))


async def test_a_named_producer_resends_after_a_lost_receipt_and_writes_once(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    producer = await client.create_producer(TOPIC, producer_name="app-1")
    await producer.send(b"m1")
    fake.drop_next_answers = 1
    message_id = await producer.send(b"m2", key="k")
    assert message_id == MessageId(LEDGER, 1)
    assert [m[1] for m in fake.messages] == [b"m1", b"m2"] and fake.duplicates == 1
    # A restarted application with the same name continues after the store's last sequence id.
    await producer.close()
    again = await client.create_producer(TOPIC, producer_name="app-1")
    assert again.last_sequence_id == 1  # m1 was 0, m2 was 1
    await again.send(b"m3")
    assert [m[1] for m in fake.messages] == [b"m1", b"m2", b"m3"]


async def test_a_refused_block_fails_its_commit_only_and_the_next_takes_its_numbers(
    store: tuple[FakeStore, Client],
) -> None:
    fake, client = store
    producer = await client.create_producer(TOPIC)
    fake.refuse_next_blocks = 1
    refused = asyncio.ensure_future(producer.send_atomic([b"r1", b"r2"]))
    accepted = asyncio.ensure_future(producer.send_atomic([b"ok"]))  # numbered 2 first, then 0
    with pytest.raises(ServiceError, match="above maxBlockBytes"):
        await refused
    assert await accepted == [MessageId(LEDGER, 0)]
    assert [m[1] for m in fake.messages] == [b"ok"]
    assert next(iter(fake.writers.values())).last_event_number == 0  # "ok" took event 0
