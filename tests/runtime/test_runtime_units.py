"""Unit tests of pure logic: frame codec, pending-ack conflict rules, coordinator state machine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_waits import wait_until

from txnkeeper.aio import failure_of
from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.coordinator.ports import RecoveredTxn
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.coordinator.state import TxnStatus
from txnkeeper.errors import InvalidTxnStatusError, TxnConflictError, TxnNotFoundError
from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import TICKET_GRACE_MS, ClusterSecret, UnauthorizedError
from txnkeeper.protocol.frames import FrameDecoder, FrameError, encode_frame
from txnkeeper.protocol.limits import ConnectionLimits, InvalidLimitsError
from txnkeeper.topic.pending_acks import PendingAcks
from txnkeeper.topic.ports import IndexAck
from txnkeeper.txnid import TxnID


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20), st.integers(min_value=1, max_value=50))
def test_frames_survive_any_split(payloads: list[bytes], chunk: int) -> None:
    commands = [
        api.Command(request_id=i + 1, produce=api.Produce(topic="t", payload=p))
        for i, p in enumerate(payloads)
    ]
    stream = b"".join(encode_frame(c) for c in commands)
    decoder = FrameDecoder()
    decoded: list[api.Command] = []
    for start in range(0, len(stream), chunk):
        decoded += decoder.feed(stream[start : start + chunk])
    assert decoded == commands and decoder.buffered == 0


def test_oversized_frame_is_refused_before_it_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    with pytest.raises(FrameError) as info:
        decoder.feed((101).to_bytes(4, "big"))
    assert info.value.code == api.FRAME_TOO_LARGE


def test_pending_acks_conflicts() -> None:
    t1, t2 = TxnID(0, 1), TxnID(0, 2)
    p = [Position(1, i) for i in range(5)]
    acks = PendingAcks()
    assert acks.reserve(t1, [p[1], p[2]], cumulative=False) == [p[1], p[2]]
    assert acks.reserve(t1, [p[1]], cumulative=False) == []  # same txn again: nothing new
    with pytest.raises(TxnConflictError):
        acks.reserve(t2, [p[2]], cumulative=False)
    with pytest.raises(TxnConflictError):
        acks.reserve(t2, [p[3]], cumulative=True)  # would cover t1's pending p[1], p[2]
    assert acks.conflict_for_plain([p[1]], cumulative=False) is not None
    assert acks.conflict_for_plain([p[0]], cumulative=False) is None
    released = acks.release(t1)
    assert released.individual == {p[1], p[2]}
    assert acks.reserve(t2, [p[3]], cumulative=True) == [p[3]]
    with pytest.raises(TxnConflictError):
        acks.reserve(t1, [p[0]], cumulative=False)  # covered by t2's cumulative ack


def test_pending_batch_index_acks_conflict_per_index() -> None:
    t1, t2 = TxnID(0, 1), TxnID(0, 2)
    entry, other = Position(1, 3), Position(1, 7)
    acks = PendingAcks()
    # (txn, indexes acked (bits), what must happen: the new bits, or a conflict)
    table: list[tuple[TxnID, int, int | None]] = [
        (t1, 0b0001, 0b0001),
        (t1, 0b0011, 0b0010),  # index 0 again: only index 1 is new
        (t2, 0b0100, 0b0100),  # another index of the same entry: no conflict
        (t2, 0b0010, None),  # index 1 is t1's
        (t1, 0b0100, None),  # index 2 is t2's
    ]
    for txn, indexes, expected in table:
        if expected is None:
            with pytest.raises(TxnConflictError, match="batch index"):
                acks.reserve_indexes(txn, [IndexAck(entry, indexes, 4)])
        else:
            assert acks.reserve_indexes(txn, [IndexAck(entry, indexes, 4)]) == [IndexAck(entry, expected, 4)]
    assert acks.index_mask(entry) == 0b0111 and acks.batch_size(entry) == 4
    assert not acks.is_pending(entry)  # index 3 is free
    with pytest.raises(TxnConflictError):
        acks.reserve(t2, [entry], cumulative=False)  # the whole entry holds t1's indexes
    with pytest.raises(TxnConflictError):
        acks.reserve(t2, [other], cumulative=True)  # covers t1's indexes of ``entry``
    assert acks.conflict_for_plain([], False, [IndexAck(entry, 0b0001, 4)]) is not None
    assert acks.conflict_for_plain([], False, [IndexAck(entry, 0b1000, 4)]) is None
    assert acks.conflict_for_plain([entry], False) is not None
    acks.unreserve(t2, [], False, [IndexAck(entry, 0b0100, 4)])  # its logging failed
    assert acks.index_mask(entry) == 0b0011 and acks.txn_acks(t2) is None
    released = acks.release(t1)
    assert released.index_acks() == [IndexAck(entry, 0b0011, 4)]
    assert acks.index_mask(entry) == 0 and acks.batch_size(entry) is None and acks.position_count == 0
    assert acks.reserve(t2, [other], cumulative=True) == [other]


class MemoryLog:
    def __init__(self) -> None:
        self.records: list[meta_pb.TransactionMetadataEntry] = []
        self.deleted: list[TxnID] = []
        self.fail = False

    async def append(self, entry: meta_pb.TransactionMetadataEntry) -> object:
        if self.fail:
            raise OSError("disk gone")
        self.records.append(entry)
        return len(self.records)

    def append_all(self, entries: Sequence[meta_pb.TransactionMetadataEntry]) -> list[Awaitable[object]]:
        return [self.append(entry) for entry in entries]

    async def delete_txn(self, txn_id: TxnID) -> None:
        self.deleted.append(txn_id)

    async def delete_txns(self, txn_ids: list[TxnID]) -> None:
        self.deleted.extend(txn_ids)


class RecordingSink:
    def __init__(self) -> None:
        self.ends: list[tuple[str, TxnID, bool]] = []
        self.failures_left = 0
        self.requests: list[str] = []
        self.failing: dict[str, int] = {}  # store address -> failures left

    async def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
        *,
        deadline_ms: int = 0,
    ) -> None:
        self.requests.append(address)
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("store down")
        if self.failing.get(address):
            self.failing[address] -= 1
            raise ConnectionError(f"store {address} down")
        self.ends += [(topic, txn_id, commit) for topic in topics]
        self.ends += [(f"{topic}/{sub}", txn_id, commit) for topic, sub in subscriptions]

    def end_on_store_then(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        ends: tuple[Sequence[str], Sequence[tuple[str, str]], int],
        then: Callable[[BaseException | None], None],
    ) -> None:
        topics, subscriptions, deadline_ms = ends
        ended = asyncio.ensure_future(
            self.end_on_store(
                address, txn_id, commit, list(topics), list(subscriptions), deadline_ms=deadline_ms
            )
        )
        ended.add_done_callback(lambda done: then(failure_of(done)))


def make_coordinator(
    tmp_path: Path, clock: list[int]
) -> tuple[TransactionCoordinator, MemoryLog, RecordingSink]:
    log, sink = MemoryLog(), RecordingSink()
    sequence = SequenceAllocator(tmp_path / "seq", block=3)
    sequence.load()
    coordinator = TransactionCoordinator(
        7, log, sequence, RouteTable(tmp_path / "routes.json"), sink, clock=lambda: clock[0]
    )
    return coordinator, log, sink


async def test_coordinator_commit_logs_every_step_and_is_idempotent(tmp_path: Path) -> None:
    clock = [1_000]
    coordinator, log, sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000)
    assert txn == TxnID(7, 1)
    await coordinator.add_partitions(txn, ["t1", "t1"], "s:1")
    await coordinator.add_subscriptions(txn, [("t0", "sub")], "s:1")
    sink.failures_left = 1  # the first delivery fails and is retried
    await coordinator.end_txn(txn, commit=True)
    await coordinator.end_txn(txn, commit=True)  # a retried commit succeeds
    with pytest.raises(InvalidTxnStatusError):
        await coordinator.end_txn(txn, commit=False)
    await coordinator.close()
    ops = [(r.metadata_op, r.new_status) for r in log.records]
    op = meta_pb.TransactionMetadataEntry
    assert ops[:4] == [
        (op.NEW, meta_pb.OPEN),
        (op.ADD_PARTITION, meta_pb.OPEN),
        (op.ADD_SUBSCRIPTION, meta_pb.OPEN),
        (op.UPDATE, meta_pb.COMMITTING),
    ]
    assert sorted(sink.ends) == [("t0/sub", txn, True), ("t1", txn, True)]
    assert coordinator.status_of(txn) == "COMMITTED"


async def test_coordinator_end_whose_decision_cannot_be_logged_leaves_the_txn_open(tmp_path: Path) -> None:
    # The end runs as callbacks (no task): a failed decision write must still reach the caller and
    # every concurrent end of the same transaction, and undo the COMMITTING status.
    clock = [1_000]
    coordinator, log, sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000)
    await coordinator.add_partitions(txn, ["t1"], "s:1")
    log.fail = True
    first = coordinator.end_txn(txn, commit=True)
    second = coordinator.end_txn(txn, commit=True)  # joins the end in progress
    with pytest.raises(OSError, match="disk gone"):
        await first
    with pytest.raises(Exception, match="could not log the end"):
        await second
    assert coordinator.status_of(txn) == "OPEN" and sink.ends == []
    log.fail = False
    await coordinator.end_txn(txn, commit=True)
    await coordinator.close()
    assert coordinator.status_of(txn) == "COMMITTED" and sink.ends == [("t1", txn, True)]


async def test_coordinator_seals_ended_transactions_in_rounds_then_deletes_them(tmp_path: Path) -> None:
    # COMMITTED/ABORTED is not written per transaction but for all transactions ended since the
    # last round, queued together (one entry), and only those sealed are deleted.
    clock = [1_000]
    coordinator, log, _sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    txns = [await coordinator.new_txn(5_000) for _ in range(3)]
    for txn in txns:
        await coordinator.add_partitions(txn, ["t1"], "s:1")
    await coordinator.end_txn(txns[0], commit=True)
    await coordinator.end_txn(txns[1], commit=False)
    await coordinator.end_txn(txns[2], commit=True)
    assert [coordinator.status_of(t) for t in txns] == ["COMMITTED", "ABORTED", "COMMITTED"]

    def sealed() -> list[tuple[int, int]]:
        op = meta_pb.TransactionMetadataEntry.UPDATE
        finals = (meta_pb.COMMITTED, meta_pb.ABORTED)
        return [
            (r.txnid_least_bits, r.new_status)
            for r in log.records
            if r.metadata_op == op and r.new_status in finals
        ]

    async def all_deleted() -> bool:
        return sorted(log.deleted) == sorted(txns)

    await wait_until(all_deleted, 10, "the ended transactions' records to be deleted")
    assert sorted(sealed()) == [(1, meta_pb.COMMITTED), (2, meta_pb.ABORTED), (3, meta_pb.COMMITTED)]
    late = await coordinator.new_txn(5_000)
    await coordinator.add_partitions(late, ["t1"], "s:1")
    await coordinator.end_txn(late, commit=True)
    log.fail = True  # its seal cannot be logged: its records stay for the replay to finish
    await coordinator.close()  # drains the pending round
    assert late not in log.deleted and coordinator.status_of(late) == "COMMITTED"


async def test_coordinator_ends_once_per_store_and_retries_only_the_failed_store(tmp_path: Path) -> None:
    clock = [1_000]
    coordinator, _log, sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000)
    await coordinator.add_partitions(txn, ["a1", "a2"], "a:1")
    await coordinator.add_subscriptions(txn, [("a1", "sub")], "a:1")
    await coordinator.add_partitions(txn, ["b1"], "b:1")
    sink.failing["b:1"] = 2
    await coordinator.end_txn(txn, commit=True)
    await coordinator.close()
    # One request per store pod per attempt: store a answered at once, store b on its third attempt.
    assert sorted(sink.requests) == ["a:1", "b:1", "b:1", "b:1"]
    assert sorted(sink.ends) == [
        ("a1", txn, True),
        ("a1/sub", txn, True),
        ("a2", txn, True),
        ("b1", txn, True),
    ]
    assert coordinator.status_of(txn) == "COMMITTED"


async def test_add_to_txn_logs_the_same_records_as_the_two_separate_requests(tmp_path: Path) -> None:
    from txnkeeper.server.handler import PodHandler

    clock = [1_000]
    coordinator, log, _sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000)
    secret = ClusterSecret(b"unit-test-cluster-secret")
    handler = PodHandler({7: coordinator}, None, secret)
    body = api.AddToTxn(
        txn_id=api.TxnId(most=txn.most, least=txn.least),
        topics=["out"],
        store_address="s:1",
        owner_token=secret.owner_token(txn),
    )
    body.subscriptions.add(topic="in", subscription="work")
    session = object()
    result = handler.handle(session, "add_to_txn", api.Command(add_to_txn=body))  # type: ignore[arg-type]
    assert result is not None and not isinstance(result, api.Command)
    answer = await result
    # One ticket per registered partition and subscription, each valid only for itself.
    tickets = {(t.topic, t.subscription): t for t in answer.txn_tickets.tickets}  # type: ignore[attr-defined]
    assert set(tickets) == {("out", ""), ("in", "work")}
    secret.check_ticket(tickets[("out", "")], txn, "out", "", now_ms=1_000)
    secret.check_ticket(tickets[("in", "work")], txn, "in", "work", now_ms=1_000)
    with pytest.raises(UnauthorizedError):
        secret.check_ticket(tickets[("out", "")], txn, "in", "", now_ms=1_000)
    with pytest.raises(UnauthorizedError):
        secret.check_ticket(tickets[("out", "")], TxnID(7, txn.least + 1), "out", "", now_ms=1_000)
    with pytest.raises(UnauthorizedError, match="deadline"):
        secret.check_ticket(tickets[("out", "")], txn, "out", "", now_ms=1_000 + 5_000 + TICKET_GRACE_MS + 1)
    # The separate requests (older clients) log the same records.
    other = await coordinator.new_txn(5_000)
    other_pb = api.TxnId(most=other.most, least=other.least)
    token = secret.owner_token(other)
    partition = api.AddPartitionToTxn(txn_id=other_pb, topics=["out"], store_address="s:1", owner_token=token)
    subscription = api.AddSubscriptionToTxn(txn_id=other_pb, store_address="s:1", owner_token=token)
    subscription.subscriptions.add(topic="in", subscription="work")
    for name, command in (
        ("add_partition", api.Command(add_partition=partition)),
        ("add_subscription", api.Command(add_subscription=subscription)),
    ):
        result = handler.handle(session, name, command)  # type: ignore[arg-type]
        assert result is not None and not isinstance(result, api.Command)
        await result
    await coordinator.close()
    op = meta_pb.TransactionMetadataEntry
    records = [
        (
            r.txnid_least_bits,
            r.metadata_op,
            list(r.partitions),
            [(s.topic, s.subscription) for s in r.subscriptions],
        )
        for r in log.records
    ]
    for least in (txn.least, other.least):
        assert [r[1:] for r in records if r[0] == least] == [
            (op.NEW, [], []),
            (op.ADD_PARTITION, ["out"], []),
            (op.ADD_SUBSCRIPTION, [], [("in", "work")]),
        ]


async def test_coordinator_sequence_is_never_reused_and_timeouts_abort(tmp_path: Path) -> None:
    clock = [1_000]
    coordinator, _log, _sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    ids = [await coordinator.new_txn(100) for _ in range(4)]
    await coordinator.close()
    again, _, _sink2 = make_coordinator(tmp_path, clock)
    assert (await again._sequence.next()) > max(t.least for t in ids)
    again.recover(
        [
            RecoveredTxn(TxnID(7, 50), TxnStatus.OPEN, 100, 1_000, 1_000, ["t"]),
            RecoveredTxn(TxnID(7, 51), TxnStatus.COMMITTING, 100, 1_000, 1_000, ["t"]),
        ]
    )
    await again._routes.learn(["t"], "s:1")
    clock[0] = 5_000

    async def both_ended() -> bool:
        return again.status_of(TxnID(7, 50)) == "ABORTED" and again.status_of(TxnID(7, 51)) == "COMMITTED"

    await wait_until(both_ended, 10, "the recovered transactions to end")
    assert again.status_of(TxnID(7, 50)) == "ABORTED"
    assert again.status_of(TxnID(7, 51)) == "COMMITTED"
    with pytest.raises(TxnNotFoundError):
        await again.end_txn(TxnID(7, 999), commit=True)
    await again.close()


def test_transaction_buffer_outcomes_and_forgetting() -> None:
    """Open until its marker; committed kept (as a fence) until its deadline + the grace, aborted until
    its marker's ledger is trimmed; a transaction neither open nor kept aborted reads as committed."""
    from txnkeeper.topic.txnbuffer import TransactionBuffer, TxnOutcome
    from txnkeeper.topic.txnfence import FENCE_GRACE_MS

    clock = [1_000_000]
    buffer = TransactionBuffer(clock=lambda: clock[0])
    a, b, block = TxnID(0, 1), TxnID(0, 2), TxnID(2**64 - 1, 9)
    buffer.message_written(a)
    buffer.message_written(b)
    assert buffer.outcome(a) is TxnOutcome.OPEN and buffer.ongoing == 2
    assert buffer.first_open_position() is None  # nothing durable yet: bounds nothing
    buffer.message_durable(b, Position(1, 7))
    buffer.message_durable(a, Position(1, 3))
    buffer.message_durable(a, Position(1, 4))  # only the first counts
    assert buffer.first_open_position() == Position(1, 3)
    buffer.begin_end(a)
    assert not buffer.accepts_message(a)  # a zombie's late write is refused while the end is written
    buffer.ended(a, True, Position(1, 5), deadline_ms=clock[0] + 5_000)
    buffer.ended(b, False, Position(2, 0), deadline_ms=clock[0] + 5_000)
    buffer.ended(block, True, Position(2, 1))  # no deadline (a store-local block): nothing to fence
    assert buffer.first_open_position() is None
    assert buffer.outcome(a) is TxnOutcome.COMMITTED and buffer.outcome(b) is TxnOutcome.ABORTED
    assert buffer.outcome(block) is TxnOutcome.COMMITTED and buffer.ended_count == 2
    assert not buffer.accepts_message(a) and buffer.is_ended(a) and not buffer.is_ended(block)
    assert buffer.forget_before(Position(2, -1)) == []  # commits go by time, not with their ledger
    assert buffer.forget_before(Position(3, -1)) == [(b, clock[0] + 5_000)]
    assert buffer.outcome(b) is TxnOutcome.COMMITTED  # (its messages went with its ledger)
    assert buffer.expire() == 0
    clock[0] += 5_000 + FENCE_GRACE_MS + 10_000  # past the deadline, the grace and a bucket
    assert buffer.expire() == 1
    assert buffer.ended_count == 0 and buffer.outcome(a) is TxnOutcome.COMMITTED
    assert buffer.accepts_message(a)  # its tickets expired: the store refuses them before this
    buffer.ended(TxnID(0, 3), True, Position(3, 0), deadline_ms=1)  # deadline long past: not kept
    assert buffer.ended_count == 0


def test_transaction_buffer_keeps_each_open_txns_first_position_and_age_together() -> None:
    """The two things kept per open transaction (its first durable message, which bounds trimming, and
    when its first message was written, the held-back age) come and go together, also over a
    snapshot: a restored one keeps its position and counts its age from the restart."""
    from txnkeeper.topic.txnbuffer import TransactionBuffer

    buffer = TransactionBuffer(clock=lambda: 1_000_000)
    a, b = TxnID(0, 1), TxnID(0, 2)
    assert buffer.oldest_open_age_s(now=5_000.0) == 0.0
    buffer.message_written(a, 1_000.0)
    buffer.message_written(a, 4_000.0)  # a later message of it: still held back since the first
    buffer.message_written(b)
    buffer.message_durable(a, Position(2, 5))
    assert buffer.is_open(a) and buffer.oldest_open_age_s(now=5_000.0) == 4_000.0
    assert buffer.first_open_position() == Position(2, 5)
    buffer.ended(a, True, Position(2, 9), deadline_ms=2_000_000)
    assert not buffer.is_open(a) and buffer.first_open_position() is None
    assert buffer.oldest_open_age_s(now=5_000.0) < 4_000.0  # b's age, not a's
    buffer.message_written(a, 10.0)  # a zombie's late message of an ended transaction reopens nothing
    assert not buffer.is_open(a) and buffer.ongoing == 1

    rows, opened = buffer.export()
    restored = TransactionBuffer(clock=lambda: 1_000_000)
    restored.restore(rows, [*opened, (TxnID(0, 3), Position(3, 0))])
    assert restored.ongoing == 2 and restored.first_open_position() == Position(3, 0)
    assert 0.0 <= restored.oldest_open_age_s() < 60.0  # from the restart, not from the epoch
    restored.ended(b, False, Position(4, 0))
    restored.ended(TxnID(0, 3), False, Position(4, 1))
    assert restored.ongoing == 0 and restored.oldest_open_age_s() == 0.0


def test_transaction_buffer_rows_survive_re_ends_compaction_and_restore() -> None:
    from txnkeeper.topic.txnbuffer import UNKNOWN_FIRST, TransactionBuffer, TxnOutcome, unpack_ended

    now = 1_000_000
    buffer = TransactionBuffer(clock=lambda: now)
    ids = [TxnID(3, i) for i in range(20_000)]
    deadline = now + 600_000
    for i, txn in enumerate(ids):
        buffer.ended(txn, i % 3 != 0, Position(1 + i // 1000, i % 1000), deadline_ms=deadline + i)
    # ended again later (a marker written twice): its latest marker counts, the earlier row is stale
    buffer.ended(ids[0], False, Position(99, 0), deadline_ms=7)
    assert buffer.ended_count == 20_000
    forgotten = buffer.forget_before(Position(11, -1))  # ledgers 1..10 trimmed: rows cut from the front
    assert forgotten == [(ids[i], deadline + i) for i in range(3, 10_000, 3)]  # not ids[0]: re-ended
    assert buffer.outcome(ids[0]) is TxnOutcome.ABORTED and buffer.outcome(ids[1]) is TxnOutcome.COMMITTED
    assert (
        buffer.outcome(ids[10_002]) is TxnOutcome.ABORTED
        and buffer.outcome(ids[10_001]) is TxnOutcome.COMMITTED
    )
    rows, opened = buffer.export()
    exported = list(unpack_ended(rows))
    committed = [e.txn_id for e in exported if e.committed]
    assert sorted(committed) == sorted(t for i, t in enumerate(ids) if i % 3)  # every commit still fences
    assert [e.txn_id for e in exported if not e.committed] == [*ids[10_002::3], ids[0]] and opened == []
    restored = TransactionBuffer(clock=lambda: now)
    restored.message_written(ids[19_999])  # opened before the snapshot is applied: ended wins
    restored.restore(
        rows, [(TxnID(4, 1), Position(12, 3)), (TxnID(4, 2), None), (TxnID(4, 3), UNKNOWN_FIRST)]
    )
    assert restored.ended_count == buffer.ended_count and restored.ongoing == 3
    for txn in ids:
        assert restored.outcome(txn) is buffer.outcome(txn)
    assert restored.first_open_position() == UNKNOWN_FIRST  # an old snapshot's: keeps every ledger
    assert restored.forget_before(Position(99, 999)) == [
        (txn, deadline + 10_002 + 3 * i) for i, txn in enumerate(ids[10_002::3])
    ] + [(ids[0], 7)]
    assert restored.ended_count == len(committed)
    restored.ended(TxnID(4, 1), False, Position(100, 0), deadline_ms=3)  # after the front was cut
    assert [
        (e.txn_id, e.committed, e.marker) for e in unpack_ended(restored.export()[0]) if not e.committed
    ] == [
        (TxnID(4, 1), False, Position(100, 0)),
    ]
    assert restored.ongoing == 2 and restored.outcome(TxnID(4, 1)) is TxnOutcome.ABORTED


async def test_store_peers_send_the_ends_of_one_turn_together_and_fail_only_the_refused() -> None:
    import asyncio

    from txnkeeper.server.peers import StorePeers

    peers = StorePeers()
    sent: list[api.Command] = []
    answer: asyncio.Future[api.Command] = asyncio.get_running_loop().create_future()

    def request(address: str, command: api.Command) -> asyncio.Future[api.Command]:
        sent.append(command)
        return answer

    peers._pool.request = request  # type: ignore[method-assign]
    ends = [
        peers.end_on_store("s:1", TxnID(0, n), True, ["t"], [("t", "sub")] if n == 2 else [])
        for n in range(1, 4)
    ]
    # The turn ends (callbacks run in the order they were scheduled): one request carries all three.
    turn_over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turn_over.set_result, None)
    await turn_over
    assert len(sent) == 1 and [e.txn_id.least for e in sent[0].end_txns_on_store.ends] == [1, 2, 3]
    assert [(s.topic, s.subscription) for s in sent[0].end_txns_on_store.ends[1].subscriptions] == [
        ("t", "sub")
    ]
    result = api.Command()
    result.end_txns_on_store_result.failed.append(1)
    result.end_txns_on_store_result.errors.add(code=api.INVALID_TXN_STATUS, message="other way")
    answer.set_result(result)
    outcomes = await asyncio.gather(*ends, return_exceptions=True)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], InvalidTxnStatusError)
    await peers.close()


async def test_store_peers_tell_each_sender_its_own_outcome_even_if_another_sender_fails() -> None:
    # The coordinator's usual end hears its outcome by a callback (no future): a sender whose
    # callback raises must not keep the later ones of the same request from hearing theirs.
    from txnkeeper.server.peers import StorePeers

    peers = StorePeers()
    answer: asyncio.Future[api.Command] = asyncio.get_running_loop().create_future()

    def request(address: str, command: api.Command) -> asyncio.Future[api.Command]:
        return answer

    peers._pool.request = request  # type: ignore[method-assign]
    heard: list[tuple[int, BaseException | None]] = []

    def then(n: int, failure: BaseException | None) -> None:
        heard.append((n, failure))
        if n == 1:
            raise RuntimeError("a sender's own bug")

    for n in (1, 2, 3):
        peers.end_on_store_then("s:1", TxnID(0, n), False, (["t"], [], 9), partial(then, n))
    result = api.Command()
    result.end_txns_on_store_result.failed.append(2)
    result.end_txns_on_store_result.errors.add(code=api.INVALID_TXN_STATUS, message="committed already")
    answer.set_result(result)

    async def all_heard() -> bool:
        return len(heard) == 3

    await wait_until(all_heard, 10, "every sender to hear its outcome")
    assert [(n, failure is None) for n, failure in heard] == [(1, True), (2, True), (3, False)]
    assert isinstance(heard[2][1], InvalidTxnStatusError)
    await peers.close()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_pending_bytes": 1024}, "max_pending_bytes"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"frame_timeout_s": -1.0}, "frame_timeout_s"),
        ({"max_unsent_bytes": 1024}, "max_unsent_bytes"),
        ({"write_timeout_s": 0}, "write_timeout_s"),
    ],
)
def test_connection_limits_refuse_nonsense_naming_the_limit(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(InvalidLimitsError, match=named):
        ConnectionLimits(**kwargs)  # type: ignore[arg-type]


def test_owner_tokens_and_coordinator_proofs_are_bound_to_their_secret_and_subject() -> None:
    secret, other = ClusterSecret(b"s" * 32), ClusterSecret(b"t" * 32)
    txn = TxnID(1, 2)
    secret.check_owner(txn, secret.owner_token(txn), "end-txn")
    for token in (b"", other.owner_token(txn), secret.owner_token(TxnID(1, 3))):
        with pytest.raises(UnauthorizedError):
            secret.check_owner(txn, token, "end-txn")
    nonce = secret.new_nonce()
    assert secret.check_coordinator_proof(nonce, secret.coordinator_proof(nonce))
    assert not secret.check_coordinator_proof(nonce, other.coordinator_proof(nonce))
    assert not secret.check_coordinator_proof(secret.new_nonce(), secret.coordinator_proof(nonce))
    # A ticket's MAC is not an owner token (labels keep derivations apart).
    ticket = api.TxnTicket()
    secret.fill_ticket(ticket, txn, "", "", 0)
    assert ticket.mac != secret.owner_token(txn)


async def test_coordinator_times_out_txns_whose_deadlines_arrive_out_of_begin_order(tmp_path: Path) -> None:
    # Deadlines of equal timeouts queue in begin order; a shorter timeout begun later must still
    # expire first, and a longer one must not expire with its earlier neighbours.
    clock = [1_000]
    coordinator, _log, _sink = make_coordinator(tmp_path, clock)
    coordinator.recover([])
    long_first = await coordinator.new_txn(5_000)  # deadline 6_000
    clock[0] = 1_500
    short = await coordinator.new_txn(1_000)  # deadline 2_500: before long_first's
    clock[0] = 2_000
    long_second = await coordinator.new_txn(5_000)  # deadline 7_000
    clock[0] = 3_000

    async def short_aborted() -> bool:
        return coordinator.status_of(short) == "ABORTED"

    await wait_until(short_aborted, 10, "the short transaction to time out")
    assert coordinator.status_of(long_first) == "OPEN" and coordinator.status_of(long_second) == "OPEN"
    clock[0] = 6_500

    async def first_aborted() -> bool:
        return coordinator.status_of(long_first) == "ABORTED"

    await wait_until(first_aborted, 10, "the first long transaction to time out")
    assert coordinator.status_of(long_second) == "OPEN"
    assert coordinator.timed_out_count == 2
    await coordinator.close()
