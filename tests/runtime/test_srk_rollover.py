"""A single-routing-key block's MessageIds across ledger rollovers (issue 14: N events -> N contiguous
MessageIds): on a partition over a real managed ledger with tiny rollover limits, blocks that would
straddle a rollover are placed whole in one ledger, so the ids DataAppended implies (its first id + i)
are the positions the events are read back at; a retransmission gets the same ids, also after a
restart. The last test does the same against a real store process over real sockets, at the store's
own rollover limit (64 MiB per ledger), with the client library's writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_pods import ServePod
from srk_wire import SrkWire

from txnkeeper.client import Client, MessageId
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.position import Position
from txnkeeper.topic.partition import BlockResult, Partition
from txnkeeper.topic.records import decode
from txnkeeper.topic.snapshot import snapshot_path

TOPIC = "persistent://t/ns/srk-rollover"
SRK = ["--srk-enabled", "true", "--release", "3.0.0"]  # single-key transactions need a 3.x release
MIB = 1024 * 1024


async def _open(tmp_path: Path, config: ManagedLedgerConfig) -> tuple[ManagedLedgerFactory, Partition]:
    factory = ManagedLedgerFactory(tmp_path / "ledgers")
    ledger = await factory.open(TOPIC, config)
    partition = Partition(TOPIC, ledger, snapshot_path(tmp_path / "snapshots", TOPIC))
    await partition.recover()
    return factory, partition


def implied_ids(result: BlockResult, count: int) -> list[Position]:
    """What the client returns for a block: the first id and the next count - 1 entry ids."""
    first = result.first_message_id
    assert first is not None
    return [Position(first.ledger_id, first.entry_id + i) for i in range(count)]


async def read_back(partition: Partition) -> dict[bytes, Position]:
    """Every message payload on the partition and the position it is read back at."""
    found: dict[bytes, Position] = {}
    after: Position | None = None
    while entries := await partition.read_after(after, 100):
        for position, data in entries:
            record = decode(data, TOPIC, position)
            if not record.is_marker:
                assert record.payload not in found, f"{record.payload!r} appears twice"
                found[record.payload] = position
            after = position
    return found


async def _write_blocks(
    partition: Partition, sizes: list[int], width: int
) -> list[tuple[list[bytes], BlockResult]]:
    blocks: list[tuple[list[bytes], BlockResult]] = []
    number = 0
    for n, size in enumerate(sizes):
        await partition.publish(f"plain-{n}".encode().ljust(width, b"."), "", None)  # shifts the fill level
        events = [f"b{n}-e{i}".encode().ljust(width, b".") for i in range(size)]
        result = await partition.append_block("w", number, events, "k", sum(len(e) + 4 for e in events))
        assert not result.duplicate and result.previous == number - 1
        blocks.append((events, result))
        number += size
    return blocks


def _assert_ids_are_where_events_are(
    blocks: list[tuple[list[bytes], BlockResult]], found: dict[bytes, Position]
) -> None:
    for events, result in blocks:
        assert implied_ids(result, len(events)) == [found[e] for e in events]


async def _check_limit(tmp_path: Path, config: ManagedLedgerConfig, sizes: list[int], width: int) -> None:
    factory, partition = await _open(tmp_path, config)
    blocks = await _write_blocks(partition, sizes, width)
    assert len(partition.ledger.ledger_ids()) >= 4  # the limits did roll the ledger, several times
    found = await read_back(partition)
    _assert_ids_are_where_events_are(blocks, found)
    last_events, last = blocks[-1]
    first_number = sum(sizes) - len(last_events)
    again = await partition.append_block("w", first_number, last_events, "k", 0)
    assert again.duplicate and again.first_message_id == last.first_message_id
    await factory.close()

    factory, partition = await _open(tmp_path, config)  # restart: replay (or snapshot) rebuilds it
    again = await partition.append_block("w", first_number, last_events, "k", 0)
    assert again.duplicate and again.first_message_id == last.first_message_id
    assert await read_back(partition) == found  # nothing re-written, nothing moved
    # The next block after the restart is placed whole too.
    events = [f"post-{i}".encode().ljust(width, b".") for i in range(3)]
    after = await partition.append_block("w", sum(sizes), events, "k", 0)
    found = await read_back(partition)
    _assert_ids_are_where_events_are([*blocks, (events, after)], found)
    await factory.close()


async def test_blocks_that_would_cross_the_entry_limit_keep_contiguous_ids(tmp_path: Path) -> None:
    # 4 entries per ledger; a plain message before each block, and blocks of 1..5 events plus their
    # marker: most would straddle a rollover, one is larger than a whole ledger.
    config = ManagedLedgerConfig(max_entries_per_ledger=4, max_ledger_age_seconds=None)
    await _check_limit(tmp_path, config, [3, 2, 5, 1, 3, 2], width=8)


async def test_blocks_that_would_cross_the_size_limit_keep_contiguous_ids(tmp_path: Path) -> None:
    # ~300 bytes per ledger against 64-byte events: a block of 2..4 events crosses the limit.
    config = ManagedLedgerConfig(max_size_per_ledger_bytes=300, max_ledger_age_seconds=None)
    await _check_limit(tmp_path, config, [2, 4, 3, 2, 4, 3], width=64)


@pytest.mark.timeout(300)
async def test_a_store_process_answers_the_ids_its_events_are_read_at_across_a_rollover(
    pods: Callable[..., ServePod],
) -> None:
    # Blocks of 5 x 3 MiB against the store's 64 MiB per ledger: the fifth (the writer's last) would
    # cross the limit with 60 MiB written, so it starts the next ledger.
    pod = pods("pas-0", "store", extra=SRK)
    blocks: list[tuple[list[bytes], list[MessageId]]] = []
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        writer = await client.create_single_key_writer(TOPIC, "rk", txn_timeout_ms=120_000, writer_id="w")
        for n in range(5):
            events = [f"b{n}-e{i}:".encode().ljust(3 * MIB, b".") for i in range(5)]
            async with writer.begin_transaction() as txn:
                for event in events:
                    txn.write(event)
            blocks.append((events, txn.message_ids))
    for _, ids in blocks:
        first = ids[0]
        assert ids == [MessageId(first.ledger_id, first.entry_id + i) for i in range(5)]
    fifth_events, fifth_ids = blocks[4]
    assert fifth_ids[0].ledger_id > blocks[3][1][0].ledger_id and fifth_ids[0].entry_id == 0  # rolled

    async def retransmit_fifth() -> None:
        # The fifth block again, as a writer whose DataAppended was lost resends it: nothing is
        # written and the answer carries the ids the commit returned.
        wire = await SrkWire.open(pod.listen)
        try:
            assert await wire.setup(TOPIC, "w") == 24
            again = await wire.append("w", 20, fifth_events, key="rk")
            assert again.duplicate and again.event_number == 24
            first = again.first_message_id
            assert MessageId(first.ledger_id, first.entry_id) == fifth_ids[0]
        finally:
            wire.close()

    await retransmit_fifth()
    pod.restart()  # SIGKILL: the store rebuilds the writer's state from its ledgers
    await retransmit_fifth()
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader", receiver_queue_size=4)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"end")
        got: list[tuple[bytes, MessageId]] = []
        while (message := await consumer.receive(timeout=60)).data != b"end":
            got.append((message.data, message.message_id))
    # Every event once (the retransmissions wrote nothing), at exactly the id its commit returned.
    assert got == [(event, mid) for events, ids in blocks for event, mid in zip(events, ids, strict=True)]
