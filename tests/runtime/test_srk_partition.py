"""Single-routing-key blocks on a partition over a real managed ledger: writer state survives trimming
through the snapshot (and is reported lost, never silently re-applied, without it), recovery aborts a
block left without its commit marker, and the pure pieces (writer table, block encoding)."""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from txnkeeper.errors import BadRequestError
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.position import Position
from txnkeeper.protocol.blocks import BlockEncodingError, decode_events, encode_events
from txnkeeper.topic import snapshot as snapshots
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.records import decode, encode_data
from txnkeeper.topic.snapshot import snapshot_path
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.txnbuffer import EndedTxn, TxnOutcome, unpack_ended
from txnkeeper.topic.writers import (
    BLOCK_TXN_MOST,
    InFlight,
    TooManyWritersError,
    WriterFencedError,
    WriterStateLostError,
    WriterTable,
    writer_key,
)
from txnkeeper.txnid import TxnID

TOPIC = "persistent://t/ns/srk"
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=4)


async def _open(tmp_path: Path) -> tuple[ManagedLedgerFactory, Partition]:
    factory = ManagedLedgerFactory(tmp_path / "ledgers")
    ledger = await factory.open(TOPIC, CONFIG)
    partition = Partition(TOPIC, ledger, snapshot_path(tmp_path / "snapshots", TOPIC))
    await partition.recover()
    return factory, partition


def cursor_only(cursor: Any) -> Any:
    """A subscription as a partition's housekeeping sees it (its cursor only; no dispatch)."""
    return SimpleNamespace(
        mark_delete_position=cursor.mark_delete_position, is_acknowledged=cursor.is_deleted
    )


async def test_writer_state_survives_trimming_through_the_snapshot(tmp_path: Path) -> None:
    factory, partition = await _open(tmp_path)
    await partition.append_block("w", 0, [b"a", b"b", b"c"], "k", 30)
    last = await partition.append_block("w", 3, [b"d"], "k", 10)
    sent = await partition.publish_idempotent(b"x", "", "prod", 9)
    assert last.first_message_id is not None and sent.first_message_id is not None
    for i in range(8):  # roll past the ledgers holding the markers and the producer's record
        await partition.publish(f"p{i}".encode(), "", None)
    ledger = partition.ledger
    cursor = await cast(Any, ledger).open_cursor("sub")
    await cursor.mark_delete(ledger.last_confirmed_entry())
    partition.subscriptions["sub"] = cast(Subscription, cursor_only(cursor))
    await partition.housekeeping()  # snapshot, then trim
    assert ledger.ledger_ids()[0] > sent.first_message_id.ledger_id  # every writer record is gone
    await factory.close()

    factory, partition = await _open(tmp_path)
    again = await partition.append_block("w", 3, [b"d"], "k", 10)
    assert again.duplicate and again.first_message_id == last.first_message_id
    retry = await partition.publish_idempotent(b"x", "", "prod", 9)
    assert retry.duplicate and retry.first_message_id == sent.first_message_id
    await factory.close()

    # Without the snapshot the trimmed state is gone: the retransmission is refused, not re-applied.
    snapshot_path(tmp_path / "snapshots", TOPIC).unlink()
    factory, partition = await _open(tmp_path)
    with pytest.raises(WriterStateLostError, match="no state for writer 'w'"):
        await partition.append_block("w", 3, [b"d"], "k", 10)
    await factory.close()


async def test_a_retransmission_is_a_duplicate_only_when_the_store_holds_its_events(tmp_path: Path) -> None:
    """Numbers alone cannot tell a retransmission from another session's block with the same numbers
    (a writer cut off before its block arrived, back after another instance of its id wrote): the
    events at the last block's first message id decide, from the tail cache and read back after a
    restart. Other events, another key, or a block reaching into the last one are refused fenced."""
    factory, partition = await _open(tmp_path)
    first = await partition.append_block("w", 0, [b"a", b"b"], "k", 10)
    sent = await partition.publish_idempotent(b"x", "k", "prod", 4)
    for restarted in (False, True):
        if restarted:
            await factory.close()
            factory, partition = await _open(tmp_path)
        again = await partition.append_block("w", 0, [b"a", b"b"], "k", 10)
        assert again.duplicate and again.first_message_id == first.first_message_id
        retry = await partition.publish_idempotent(b"x", "k", "prod", 4)
        assert retry.duplicate and retry.first_message_id == sent.first_message_id
        for events, key in [([b"a", b"c"], "k"), ([b"a", b"b"], "other-key")]:
            with pytest.raises(WriterFencedError, match=r"last block the store .* but other"):
                await partition.append_block("w", 0, events, key, 10)
        with pytest.raises(WriterFencedError, match=r"1\.\.1 of 'w' .* is not a block this id wrote"):
            await partition.append_block("w", 1, [b"b"], "k", 5)
        with pytest.raises(WriterFencedError, match=r"sequence id 4 of 'prod' .* last send .* but other"):
            await partition.publish_idempotent(b"y", "k", "prod", 4)
    assert partition.writers.queued_last("w") == 1 and partition.writers.queued_last("prod") == 4
    assert partition.published_count == 0  # nothing written since the restart
    await factory.close()


async def test_recovery_aborts_a_block_left_without_its_marker(tmp_path: Path) -> None:
    factory, partition = await _open(tmp_path)
    await partition.append_block("w", 0, [b"a"], "k", 5)
    orphan = TxnID(BLOCK_TXN_MOST, 2**40)
    for payload in (b"half-1", b"half-2"):  # what a crash between the events and the marker leaves
        await partition.ledger.add_entry(encode_data(payload, "k", orphan, 0))
    await partition.publish(b"after", "", None)
    await factory.close()

    factory, partition = await _open(tmp_path)
    assert partition.buffer.outcome(orphan) is TxnOutcome.ABORTED
    assert partition.block_stats.orphan_aborts == 1
    assert partition.writers.queued_last("w") == 0  # the orphan never counted
    applied = await partition.append_block("w", 1, [b"b"], "k", 5)
    assert not applied.duplicate and applied.previous == 0
    # A second restart finds the abort marker: nothing left to abort.
    await factory.close()
    factory, partition = await _open(tmp_path)
    assert partition.block_stats.orphan_aborts == 0
    entries = await partition.read_after(None, 100)
    markers = [decode(data, TOPIC, pos) for pos, data in entries]
    assert [(r.txn_id, r.commit) for r in markers if r.is_marker and r.txn_id == orphan] == [(orphan, False)]
    await factory.close()


def test_writer_table_limits_fencing_and_expiry() -> None:
    now = [1_000_000]
    table = WriterTable(TOPIC, max_writers=2, inactivity_ms=60_000, clock_ms=lambda: now[0])
    epoch_a, last = table.setup("a")
    assert last == -1
    table.setup("b")
    table.setup("c")  # a session holds no writer slot: only writing takes one
    newer, _ = table.setup("a")
    with pytest.raises(WriterFencedError):
        table.check_epoch("a", epoch_a)
    table.check_epoch("a", newer)
    table.observe("a", 0, 4, Position(3, 0))
    assert table.decide("b", 0, 0) is None
    table.observe("b", 0, 0, Position(3, 1))
    with pytest.raises(TooManyWritersError, match="maxWritersPerTopic 2"):
        table.decide("c", 0, 0)  # the third writer's first write
    with pytest.raises(TooManyWritersError, match="maxWritersPerTopic 2"):
        table.decide_send("c", 0)
    now[0] += 61_000
    assert sorted(table.expire()) == ["a", "b", "c"]  # c never wrote: its session alone expires too
    with pytest.raises(WriterStateLostError, match="expired"):
        table.check_epoch("a", newer)
    assert table.setup("a")[1] == -1
    assert table.decide("c", 0, 0) is None  # slots freed by the expiry


def test_a_session_that_never_wrote_ends_with_its_connection_and_a_writer_keeps_its_fence() -> None:
    table = WriterTable(TOPIC, max_writers=1)
    idle, _ = table.setup("idle", owner="instance-1")
    assert table.sessions_without_writes() == 1
    table.end_session("idle", idle)
    assert table.sessions_without_writes() == 0 and not table.has_session("idle")
    # A session replaced by a newer one leaves the newer one alone when its connection closes.
    older, _ = table.setup("x")
    newer, _ = table.setup("x")
    table.end_session("x", older)
    table.check_epoch("x", newer)
    # A writer that wrote keeps its newest epoch after that session's connection closed: the
    # sessions it fenced stay fenced.
    fenced, _ = table.setup("w")
    writing, _ = table.setup("w")
    table.observe("w", 0, 0, Position(1, 0))
    table.end_session("w", writing)
    with pytest.raises(WriterFencedError):
        table.check_epoch("w", fenced)


async def test_a_failed_first_write_gives_its_writer_slot_back(tmp_path: Path) -> None:
    factory, partition = await _open(tmp_path)
    table = partition.writers
    table.max_writers = 1
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[Position] = loop.create_future()
    flight = InFlight("first", 0, 0, failed, failed)
    assert table.decide("first", 0, 0) is None
    table.began(flight)
    with pytest.raises(TooManyWritersError):
        table.decide("second", 0, 0)  # the first writer's write in flight holds the only slot
    failed.set_exception(OSError("disk full"))
    table.settled(flight)
    assert table.decide("second", 0, 0) is None
    await factory.close()


def test_each_principal_has_its_own_writer_ids_and_its_own_limit() -> None:
    table = WriterTable(TOPIC, max_writers=1)
    alice, bob = writer_key("alice", "w"), writer_key("bob", "w")
    assert alice not in (bob, "w")
    table.observe(alice, 0, 0, Position(1, 0))
    assert table.setup(bob)[1] == -1  # bob's "w" is not alice's
    assert table.decide(bob, 0, 0) is None  # bob's limit is his own
    with pytest.raises(TooManyWritersError, match="principal 'alice'"):
        table.decide(writer_key("alice", "v"), 0, 0)
    assert table.decide("w", 0, 0) is None  # the unauthenticated namespace too
    rows = {(r["principal"], r["writerId"]) for r in table.rows_for_admin()}
    assert rows == {("alice", "w")}


def test_block_encoding_round_trip_and_refusals() -> None:
    block = encode_events([b"", b"one", b"x" * 300])
    assert decode_events(block.data, 3, block.total_bytes, block.crc) == [b"", b"one", b"x" * 300]
    with pytest.raises(BlockEncodingError, match="total_bytes"):
        decode_events(block.data[:-1], 3, block.total_bytes, block.crc)
    with pytest.raises(BlockEncodingError, match="crc32"):
        decode_events(block.data, 3, block.total_bytes, block.crc ^ 0xFF)
    truncated = block.data[:-1]
    with pytest.raises(BlockEncodingError, match="event 2 declares 300 bytes"):
        decode_events(truncated, 3, len(truncated), zlib.crc32(truncated))


def test_a_session_from_before_its_writer_expired_never_matches_a_newer_session() -> None:
    now = [1_000_000]
    table = WriterTable(TOPIC, inactivity_ms=60_000, clock_ms=lambda: now[0])
    old, _ = table.setup("x")
    now[0] += 61_000
    assert table.expire() == ["x"]
    new, _ = table.setup("x")  # another connection, after the state was forgotten
    assert new != old
    with pytest.raises(WriterFencedError):
        table.check_epoch("x", old)


def test_a_producer_reconnect_is_refused_once_another_instance_took_the_name() -> None:
    table = WriterTable(TOPIC)
    first, _ = table.setup("app", owner="instance-1")
    assert table.setup("app", owner="instance-1", resume=True)[0] == first + 1  # its own reconnect
    table.setup("app", owner="instance-2")  # a new producer of the name: always admitted
    with pytest.raises(WriterFencedError, match="fenced for good"):
        table.setup("app", owner="instance-1", resume=True)
    with pytest.raises(WriterFencedError, match="newer producer with the same name"):
        table.check_epoch("app", first, producer=True)


async def test_a_new_producer_session_continues_after_the_older_sessions_queued_sends(
    tmp_path: Path,
) -> None:
    factory, partition = await _open(tmp_path)
    older, last = await partition.open_session("app", "instance-1")
    assert last == -1
    queued = asyncio.ensure_future(partition.publish_idempotent(b"m0", "", "app", 0, epoch=older))
    await asyncio.sleep(0)  # one loop turn: the task runs to its first await, the send is queued
    assert partition.writers.in_flight_of("app")
    newer, last = await partition.open_session("app", "instance-2")
    assert last == 0  # it waited for the older session's queued send and counts it
    assert not (await queued).duplicate
    with pytest.raises(WriterFencedError):
        await partition.publish_idempotent(b"m1", "", "app", 1, epoch=older)
    written = await partition.publish_idempotent(b"n1", "", "app", 1, epoch=newer)
    assert not written.duplicate
    await factory.close()


async def test_a_new_writer_session_counts_the_older_sessions_queued_blocks_and_fences_the_rest(
    tmp_path: Path,
) -> None:
    """The rule of named producers, for single-key writers (issue 25 item 1): the newer session's
    answer waits for the older one's blocks already queued to the ledger and counts them; the older
    one's blocks not queued yet are refused, never applied behind the newer session's back."""
    factory, partition = await _open(tmp_path)
    older, last = await partition.open_session("w")
    assert last == -1
    queued = asyncio.ensure_future(partition.append_block("w", 0, [b"a0", b"a1"], "k", 10, epoch=older))
    await asyncio.sleep(0)  # one loop turn: the task runs to its first await, the block is queued
    assert partition.writers.in_flight_of("w")
    # Received before the takeover, decided after it: the block's task has not run yet.
    late = asyncio.ensure_future(partition.append_block("w", 2, [b"a2"], "k", 5, epoch=older))
    newer, last = await partition.open_session("w")
    assert last == 1  # it waited for the queued block and counts it
    assert not (await queued).duplicate
    with pytest.raises(WriterFencedError, match="taken over by a newer SetupAppend"):
        await late
    written = await partition.append_block("w", 2, [b"b2"], "k", 5, epoch=newer)
    assert not written.duplicate and written.previous == 1
    payloads: list[bytes] = []
    after: Position | None = None
    while entries := await partition.read_after(after, 100):  # ledger by ledger (4 entries each)
        payloads += [r.payload for r in (decode(d, TOPIC, p) for p, d in entries) if not r.is_marker]
        after = entries[-1][0]
    assert payloads == [b"a0", b"a1", b"b2"]
    await factory.close()


async def test_a_block_whose_marker_is_durable_but_not_yet_applied_is_captured_as_committed(
    tmp_path: Path,
) -> None:
    """Between a block's marker becoming durable and its completion running, the buffer still has the
    block open; a snapshot taken then must record it committed at its marker (a restart from it would
    otherwise abort a block the writer was told is written)."""
    factory, partition = await _open(tmp_path)
    written = await partition.append_block("w", 0, [b"a"], "k", 30)
    assert written.first_message_id is not None
    loop = asyncio.get_running_loop()
    block = TxnID(BLOCK_TXN_MOST, 77)
    marker, first = loop.create_future(), loop.create_future()
    marker.set_result(Position(9, 4))
    first.set_result(Position(9, 3))
    partition._blocks[block] = InFlight("w2", 0, 0, marker, first)
    partition.buffer.message_written(block)  # its data entry is written, the block still open
    pending = loop.create_future()  # a block still in flight: not captured
    partition._blocks[TxnID(BLOCK_TXN_MOST, 78)] = InFlight("w3", 0, 0, pending, loop.create_future())

    captured = partition.capture_snapshot()
    assert captured is not None
    rows = {row.txn_id: row for row in unpack_ended(captured.ended)}
    assert rows[block] == EndedTxn(block, True, Position(9, 4), 0)
    assert TxnID(BLOCK_TXN_MOST, 78) not in rows
    assert block not in dict(captured.open)
    assert partition.buffer.outcome(block) is TxnOutcome.OPEN  # the capture changed nothing live
    partition._blocks.clear()
    pending.cancel()
    await factory.close()


def test_numbers_beyond_int64_are_refused_and_never_restored() -> None:
    table = WriterTable(TOPIC)
    table.setup("p", owner="instance-1")
    with pytest.raises(BadRequestError, match=r"sequence id 9223372036854775808 .* above 2\^63 - 1"):
        table.decide_send("p", 2**63)
    with pytest.raises(BadRequestError, match=r"ends beyond event number 2\^63 - 1"):
        table.decide("w", 2**63 - 1, 2**63)
    assert table.decide_send("p", 2**63 - 1) is None  # the largest is still a sequence id
    assert not table.restore_row("old", 2**63, 2**63, None, 0)
    assert table.restore_row("ok", 5, 5, None, 0)
    assert sorted(table.durable) == ["ok"]


async def test_a_block_begun_before_the_snapshot_and_committed_after_it_keeps_its_message_ids(
    tmp_path: Path,
) -> None:
    """A snapshot that covers a block's first events but not its marker (the block open in it): after
    a restart the replay meets the marker without having seen the block's first entry. The writer's
    state must still know the block's first message id, so that the retransmission of a block whose
    answer was lost is answered with its ids (found by the cluster soak: "block N..M is applied, but
    the store no longer knows its message ids")."""
    factory, partition = await _open(tmp_path)
    written = await partition.append_block("w", 0, [b"a", b"b", b"c"], "k", 3)
    assert written.first_message_id is not None
    block = TxnID(BLOCK_TXN_MOST, partition._next_block_least - 1)
    marker = partition.ledger.last_confirmed_entry()
    assert marker is not None and marker.entry_id == written.first_message_id.entry_id + 3
    await factory.close()
    # The state a capture taken after the first event and before the marker would have held.
    covers = Position(marker.ledger_id, written.first_message_id.entry_id)
    snapshots.write(
        snapshot_path(tmp_path / "snapshots", TOPIC),
        snapshots.BufferSnapshot(TOPIC, covers, b"", [(block, written.first_message_id)]),
    )

    factory, partition = await _open(tmp_path)
    again = await partition.append_block("w", 0, [b"a", b"b", b"c"], "k", 3)
    assert again.duplicate and again.first_message_id == written.first_message_id
    await factory.close()
