"""The coordinator's begin + register (NewTxn naming partitions/subscriptions), as pure logic."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from test_runtime_units import RecordingSink, make_coordinator

from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.errors import BadRequestError
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb
from txnkeeper.txnid import TxnID


async def test_begin_logs_its_adds_right_behind_new_and_commit_reaches_them(tmp_path: Path) -> None:
    coordinator, log, sink = make_coordinator(tmp_path, [1_000])
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000, ["t1"], [("t0", "sub")], "s:1")
    op = meta_pb.TransactionMetadataEntry
    assert [r.metadata_op for r in log.records] == [op.NEW, op.ADD_PARTITION, op.ADD_SUBSCRIPTION]
    assert all(r.txnid_least_bits == txn.least for r in log.records)
    assert list(log.records[1].partitions) == ["t1"]
    # Registered for real: adding them again writes nothing, and the commit is delivered to both.
    await coordinator.add_partitions(txn, ["t1"], "s:1")
    assert len(log.records) == 3
    await coordinator.end_txn(txn, commit=True)
    assert sorted(sink.ends) == [("t0/sub", txn, True), ("t1", txn, True)]
    await coordinator.close()


async def test_a_failed_begin_adopts_nothing_and_bad_names_are_refused(tmp_path: Path) -> None:
    coordinator, log, _sink = make_coordinator(tmp_path, [1_000])
    coordinator.recover([])
    log.fail = True
    with pytest.raises(OSError, match="disk gone"):
        await coordinator.new_txn(5_000, ["t1"], [], "s:1")
    assert coordinator.ongoing_count == 0
    log.fail = False
    with pytest.raises(BadRequestError, match=r"subscription name '' must be 1\.\.512 printable"):
        coordinator.new_txn(5_000, ["t1"], [("t1", "")], "s:1")
    # The stores' own rule (issue 25 item 7): a name every store refuses is never logged, since the
    # end naming it would be retried for ever.
    for topics, subscriptions, refusal in (
        (["x" * 513], [], r"topic name 'xxx.*\.\.\. \(513 characters\) must be 1\.\.512 printable"),
        (["a\nb"], [], r"topic name 'a\\nb' must be 1\.\.512 printable"),
        ([], [("t1", "s\x00")], r"subscription name 's\\x00' must be 1\.\.512 printable"),
        (["t__transaction_pending_ack"], [], "may not end with __transaction_pending_ack"),
    ):
        with pytest.raises(BadRequestError, match=refusal):
            coordinator.new_txn(5_000, topics, subscriptions, "s:1")
    with pytest.raises(BadRequestError, match="needs store_address"):
        coordinator.new_txn(5_000, ["t1"], [], "")
    assert log.records == []
    txn = await coordinator.new_txn(5_000, [], [], "s:1")
    records = len(log.records)
    with pytest.raises(BadRequestError, match=r"\(513 characters\) must be 1\.\.512"):
        coordinator.add_partitions(txn, ["y" * 513], "s:1")
    with pytest.raises(BadRequestError, match="printable"):
        coordinator.add_subscriptions(txn, [("t1", "\x1f")], "s:1")
    assert len(log.records) == records  # nothing logged for them
    await coordinator.close()


class HeldLog:
    """A log whose appends settle only when the test says so, in any order it picks."""

    def __init__(self) -> None:
        self.records: list[meta_pb.TransactionMetadataEntry] = []
        self.writes: list[asyncio.Future[object]] = []

    def append(self, entry: meta_pb.TransactionMetadataEntry) -> asyncio.Future[object]:
        self.records.append(entry)
        write: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.writes.append(write)
        return write

    def append_all(self, entries: Sequence[meta_pb.TransactionMetadataEntry]) -> list[Awaitable[object]]:
        return [self.append(entry) for entry in entries]

    async def delete_txn(self, txn_id: TxnID) -> None:
        pass

    async def delete_txns(self, txn_ids: list[TxnID]) -> None:
        pass


async def held_coordinator(tmp_path: Path) -> tuple[TransactionCoordinator, HeldLog]:
    """A coordinator on a HeldLog that knows topics t0 and t1 (served at s:1)."""
    log = HeldLog()
    sequence = SequenceAllocator(tmp_path / "seq", block=3)
    sequence.load()
    routes = RouteTable(tmp_path / "routes.json")
    await routes.learn(["t0", "t1"], "s:1")
    coordinator = TransactionCoordinator(7, log, sequence, routes, RecordingSink(), clock=lambda: 1_000)
    coordinator.recover([])
    return coordinator, log


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def test_a_begin_answers_only_once_every_record_settled_in_whatever_order(tmp_path: Path) -> None:
    # The begin waits on its last record; one that settles before the others must not answer early.
    coordinator, log = await held_coordinator(tmp_path)
    begun = coordinator.new_txn(5_000, ["t1"], [("t0", "sub")], "s:1")
    await wait_until(lambda: len(log.writes) == 3, "the begin's records")  # after the id reservation
    log.writes[2].set_result(3)
    log.writes[1].set_result(2)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not begun.done() and coordinator.ongoing_count == 0  # NEW is not durable yet
    log.writes[0].set_result(1)
    txn = await asyncio.wait_for(begun, 10)
    assert coordinator.status_of(txn) == "OPEN" and coordinator.ongoing_count == 1
    await coordinator.close()


async def test_a_begin_whose_add_failed_keeps_the_durable_txn_but_says_why(tmp_path: Path) -> None:
    coordinator, log = await held_coordinator(tmp_path)
    begun = coordinator.new_txn(5_000, ["t1"], [("t0", "sub")], "s:1")
    await wait_until(lambda: len(log.writes) == 3, "the begin's records")
    log.writes[0].set_result(1)
    log.writes[1].set_exception(OSError("disk gone"))
    log.writes[2].set_result(3)
    with pytest.raises(OSError, match="disk gone"):
        await asyncio.wait_for(begun, 10)
    # NEW is durable: the transaction exists (and will time out or be ended) all the same.
    await wait_until(lambda: coordinator.ongoing_count == 1, "the txn to be adopted")
    assert coordinator.status_of(TxnID(7, 1)) == "OPEN"
    await coordinator.close()


async def test_a_begin_whose_new_failed_adopts_nothing_and_reports_new_s_error(tmp_path: Path) -> None:
    coordinator, log = await held_coordinator(tmp_path)
    begun = coordinator.new_txn(5_000, ["t1"], [], "s:1")
    await wait_until(lambda: len(log.writes) == 2, "the begin's records")
    log.writes[1].set_exception(OSError("later entry lost"))
    log.writes[0].set_exception(OSError("NEW lost"))
    with pytest.raises(OSError, match="NEW lost"):
        await asyncio.wait_for(begun, 10)
    assert coordinator.ongoing_count == 0 and coordinator.status_of(TxnID(7, 1)) == "UNKNOWN"
    await coordinator.close()
