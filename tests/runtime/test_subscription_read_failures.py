"""A subscription whose next entries cannot be read: it stops there, retries, tells its consumers after
a few failed reads, and resumes by itself; never a message past the failing position before it
(issue 25 item 9). Unit tests with a reader that fails on demand; the real pods' version is
tests/offload/test_damaged_tier.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from txnkeeper.ledger.offload import OffloadCorruptionError
from txnkeeper.ledger.position import Position
from txnkeeper.topic import subscription as subscription_module
from txnkeeper.topic.ports import IndexAck
from txnkeeper.topic.records import DecodedRecord, encode_data
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.txnbuffer import TransactionBuffer
from txnkeeper.txnid import TxnID

TOPIC = "persistent://public/default/t"
ENTRIES = [(Position(3, i), encode_data(f"m{i}".encode(), "", None, 0)) for i in range(10)]
DAMAGED = 6  # reads from this entry on fail until ``failures`` reads failed
PERMITS = 3  # reads of 3 entries: 0..2 and 3..5 are read, 6..8 fails


class FailingReader:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.failed = 0

    async def read_after(self, position: Position | None, max_entries: int) -> list[tuple[Position, bytes]]:
        start = 0 if position is None else position.entry_id + 1
        out = ENTRIES[start : start + max_entries]
        if self.failed < self.failures and any(p.entry_id >= DAMAGED for p, _ in out):
            self.failed += 1
            raise OffloadCorruptionError("seg-1", 3, 4096, "block CRC-32 is 00000000", "seg-1")
        return out


class Cursor:
    def mark_delete_position(self) -> Position | None:
        return None

    def is_deleted(self, position: Position) -> bool:
        return False

    def holds(self, position: Position) -> bool:
        return True

    async def mark_delete(self, position: Position) -> None:
        return None

    async def delete(self, positions: Iterable[Position]) -> None:
        return None

    def ack_set(self, position: Position) -> list[int] | None:
        return None

    async def reset(self, position: Position) -> None:
        return None

    async def delete_round(
        self, positions: Iterable[Position], batch_indexes: Iterable[tuple[Position, int, Iterable[int]]]
    ) -> None:
        return None


class PendingLog:
    def log_ack(
        self,
        txn_id: TxnID,
        positions: list[Position],
        cumulative: bool,
        index_acks: list[IndexAck] | None = None,
    ) -> asyncio.Future[Any]:
        raise AssertionError("no transactions here")

    def log_end(self, txn_id: TxnID, commit: bool) -> asyncio.Future[Any]:
        raise AssertionError("no transactions here")

    async def delete_txn(self, txn_id: TxnID) -> None:
        return None

    async def delete_txns(self, txn_ids: list[TxnID]) -> None:
        return None


class Consumer:
    consumer_id = 1
    ready = True

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.errors: list[tuple[Position | None, str, int]] = []  # (after, message, received so far)
        self.changed = asyncio.Event()
        self.subscription: Subscription | None = None

    def deliver(
        self,
        position: Position,
        record: DecodedRecord,
        redelivery_count: int,
        ack_set: list[int] | None = None,
    ) -> None:
        self.received.append(record.payload)
        self.changed.set()
        assert self.subscription is not None
        # Each message received grants one more (a client's flow), so reads stay PERMITS small.
        asyncio.get_running_loop().call_soon(self.subscription.flow, self.consumer_id, 1)

    def detach(self) -> bool:
        return False

    def read_failed(self, after: Position | None, message: str) -> None:
        self.errors.append((after, message, len(self.received)))
        self.changed.set()


async def run_until_all_received(failures: int) -> Consumer:
    sub = Subscription(
        TOPIC,
        "s",
        reader=FailingReader(failures),
        cursor=Cursor(),
        buffer=TransactionBuffer(),
        pending_log=PendingLog(),
    )
    consumer = Consumer()
    consumer.subscription = sub
    sub.add_consumer(consumer, PERMITS)
    sub.start()
    try:
        async with asyncio.timeout(60):  # a deadline, not an expected duration
            while len(consumer.received) < len(ENTRIES):
                await consumer.changed.wait()
                consumer.changed.clear()
    finally:
        await sub.close()
    return consumer


def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription_module, "READ_RETRY_FIRST_SECONDS", 0.001)
    monkeypatch.setattr(subscription_module, "READ_RETRY_MAX_SECONDS", 0.002)


async def test_consumers_are_told_after_four_failed_reads_and_get_everything_once_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast_retries(monkeypatch)
    consumer = await run_until_all_received(failures=6)
    assert consumer.received == [f"m{i}".encode() for i in range(10)]  # in order, once, nothing skipped
    # Failures 4, 5 and 6 were pushed, each after the messages before the damage and none after it.
    assert len(consumer.errors) == 3
    for after, message, received in consumer.errors:
        assert received == DAMAGED and after == Position(3, DAMAGED - 1)
        assert f"cannot deliver the entries after {Position(3, DAMAGED - 1)}" in message
        assert "the offloaded tier data is unreadable" in message and "block CRC-32 is 00000000" in message
        assert "resumes delivery by itself" in message


async def test_three_failed_reads_are_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_retries(monkeypatch)
    consumer = await run_until_all_received(failures=3)
    assert consumer.errors == [] and len(consumer.received) == len(ENTRIES)


def test_every_retry_runs_on_uvloop_whose_timers_fire_on_a_millisecond_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A retry timer on uvloop can fire with loop.time() a rounding short of the deadline computed
    when it was set; a retry refused then waited for a wake that never came (a real pod stalled)."""
    uvloop = pytest.importorskip("uvloop")
    fast_retries(monkeypatch)
    consumer = uvloop.run(run_until_all_received(failures=300))
    assert len(consumer.received) == len(ENTRIES) and len(consumer.errors) == 300 - 3
