"""One topic partition: a managed ledger of messages and transaction markers, its transaction buffer
and its subscriptions.

Writes are acknowledged only once durable (the ledger group-commits them). A transaction ends on the
partition by a marker entry, written once (idempotent), so a restart replays the outcome; messages
for a transaction that already ended here are refused, which fences zombie producers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from typing import Protocol

from txnkeeper.errors import InvalidTxnStatusError
from txnkeeper.ledger.position import Entry, Position
from txnkeeper.topic.records import decode, encode_data, encode_marker
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.txnbuffer import TransactionBuffer
from txnkeeper.topic.txnfence import LateFence
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)

REPLAY_BATCH = 1000
TAIL_CACHE_ENTRIES = 20_000
TAIL_CACHE_BYTES = 32 * 1024 * 1024
HOUSEKEEPING_INTERVAL = 10.0  # seconds between trims of consumed ledgers


class PartitionLedger(Protocol):
    """The managed-ledger operations a partition uses (contracts §1)."""

    name: str

    def add_entry(self, data: bytes) -> Awaitable[Position]: ...

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]: ...

    def ledger_ids(self) -> list[int]: ...

    async def trim(self) -> list[int]: ...

    def last_confirmed_entry(self) -> Position | None: ...


class Partition:
    """A partition and everything that reads from it."""

    def __init__(self, topic: str, ledger: PartitionLedger) -> None:
        self.topic = topic
        self.ledger = ledger
        self.buffer = TransactionBuffer()
        self.subscriptions: dict[str, Subscription] = {}
        self._ending: dict[TxnID, asyncio.Future[None]] = {}
        # Ended txns whose outcome was forgotten (trimmed) before their deadline: still refused.
        self.late_fence = LateFence()
        self.published_count = 0
        # Recently written entries: subscriptions that keep up read the tail from memory, not disk.
        self._tail: OrderedDict[Position, bytes] = OrderedDict()
        self._tail_bytes = 0

    async def recover(self) -> None:
        """Rebuild the transaction buffer from the live entries (markers say how each txn ended)."""
        after: Position | None = None
        while True:
            entries = await self.read_after(after, REPLAY_BATCH)
            if not entries:
                return
            for position, data in entries:
                record = decode(data, self.topic, position)
                if record.txn_id is not None:
                    if record.is_marker:
                        self.buffer.ended(record.txn_id, record.commit, position, record.deadline_ms)
                    else:
                        self.buffer.message_written(record.txn_id)
                after = position

    async def read_after(self, position: Position | None, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` durable entries after ``position`` (None: from the oldest live entry)."""
        if position is None:
            ledgers = self.ledger.ledger_ids()
            if not ledgers:
                return []
            start = Position(ledgers[0], 0)
        else:
            start = Position(position.ledger_id, position.entry_id + 1)
        if start in self._tail:
            cached: list[tuple[Position, bytes]] = []
            tail = self._tail
            while start in tail and len(cached) < max_entries:
                cached.append((start, tail[start]))
                start = Position(start.ledger_id, start.entry_id + 1)
            return cached
        last = self.ledger.last_confirmed_entry()
        if last is None or start > last:
            return []
        entries = await self.ledger.read_entries(start, max_entries)
        return [(e.position, e.data) for e in entries]

    async def publish(self, payload: bytes, key: str, txn_id: TxnID | None) -> Position:
        if txn_id is not None:
            if not self.buffer.accepts_message(txn_id) or self.late_fence.holds(txn_id):
                raise InvalidTxnStatusError(f"transaction {txn_id} already ended on {self.topic}")
            self.buffer.message_written(txn_id)
        data = encode_data(payload, key, txn_id, int(time.time() * 1000))
        position = await self.ledger.add_entry(data)
        self._remember(position, data)
        self.published_count += 1
        if txn_id is None:
            self._notify()
        return position

    async def end_txn(self, txn_id: TxnID, commit: bool, deadline_ms: int = 0) -> None:
        """Write the transaction's marker (once) and let its messages be dispatched or dropped.

        ``deadline_ms`` (the txn's timeout deadline, in the marker) keeps it refusing the txn's late
        messages until then, even once its outcome is forgotten."""
        if self.buffer.is_ended(txn_id):
            committed = self.buffer.outcome(txn_id).value == "committed"
            if committed != commit:
                raise InvalidTxnStatusError(
                    f"transaction {txn_id} already ended the other way on {self.topic}"
                )
            return
        in_progress = self._ending.get(txn_id)
        if in_progress is not None:
            await asyncio.shield(in_progress)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ending[txn_id] = done
        self.buffer.begin_end(txn_id)
        marker = encode_marker(txn_id, commit, deadline_ms)
        try:
            position = await self.ledger.add_entry(marker)
            self._remember(position, marker)
        except BaseException as exc:
            self.buffer.cancel_end(txn_id)
            done.set_exception(exc)
            done.exception()
            raise
        finally:
            del self._ending[txn_id]
        self.buffer.ended(txn_id, commit, position, deadline_ms)
        done.set_result(None)
        self._notify()

    async def housekeeping(self) -> None:
        """Delete ledgers every subscription is done with, then forget the outcomes of transactions
        whose markers were in them (their entries are gone for every reader, present or future).

        Only with at least one subscription: without any, retained messages wait for a future one.
        """
        if not self.subscriptions:
            return
        await self.ledger.trim()
        live = self.ledger.ledger_ids()
        if live:
            for txn_id, deadline_ms in self.buffer.forget_before(Position(live[0], -1)):
                self.late_fence.add(txn_id, deadline_ms)

    async def housekeeping_forever(self, interval: float = HOUSEKEEPING_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.housekeeping()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping of partition %s failed; retrying later", self.topic)

    def _remember(self, position: Position, data: bytes) -> None:
        tail = self._tail
        tail[position] = data
        self._tail_bytes += len(data)
        while tail and (len(tail) > TAIL_CACHE_ENTRIES or self._tail_bytes > TAIL_CACHE_BYTES):
            _, evicted = tail.popitem(last=False)
            self._tail_bytes -= len(evicted)

    def attach(self, subscription: Subscription) -> None:
        self.subscriptions[subscription.name] = subscription

    def _notify(self) -> None:
        for subscription in self.subscriptions.values():
            subscription.notify()

    def subscription_names(self) -> Iterable[str]:
        return self.subscriptions.keys()
