"""What both transactional stores share: records grouped by transaction, deleted when it ends.

A store appends a transaction's records as they come and, when the transaction has ended, deletes
every one of them (batch-index-level for batched entries), so that entries and then ledgers can be
trimmed. It must know every position of a transaction, including records still in flight when the end
arrives: ``delete_txn`` waits for those instead of leaving them behind forever (a leaked record would
keep its ledger, and with it every later ledger, alive).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.recordlog import LiveEntryFormats, RecordLog
from txnkeeper.bufferedwriter.writer import WritePosition, WriterState
from txnkeeper.txnlog.txnid import TxnID, TxnIdLike

R = TypeVar("R", bound=Message)
S = TypeVar("S")

TxnKey = tuple[int, int]


class StoreClosedError(RuntimeError):
    """The store was closed; reopen it to continue."""


class TxnRecordStore(ABC, Generic[R, S]):
    """A :class:`RecordLog` whose records belong to transactions; ``S`` is the replayed per-txn state."""

    def __init__(self, log: RecordLog[R]) -> None:
        self._log = log
        self._positions: dict[TxnKey, list[WritePosition]] = {}
        self._in_flight: dict[TxnKey, int] = {}
        self._settled: dict[TxnKey, asyncio.Future[None]] = {}
        self._recovered: dict[TxnID, S] = {}
        self._closed = False

    # -- record semantics supplied by each store ----------------------------------------------------

    @abstractmethod
    def _txn_key(self, record: R) -> TxnKey:
        """The (most, least) transaction id of a record; raises ValueError for an unusable record."""

    @abstractmethod
    def _fold(self, state: S | None, txn_id: TxnID, position: WritePosition, record: R) -> S:
        """Apply one replayed record to its transaction's state (``None``: first record seen)."""

    # -- lifecycle ----------------------------------------------------------------------------------

    async def _recover(self) -> None:
        states: dict[TxnID, S] = {}
        for live in await self._log.replay():
            key = self._txn_key(live.record)
            txn_id = TxnID(*key)
            self._positions.setdefault(key, []).append(live.position)
            states[txn_id] = self._fold(states.get(txn_id), txn_id, live.position, live.record)
        self._recovered = states

    async def replay(self) -> dict[TxnID, S]:
        """Per-transaction state rebuilt at open from the live records (deleted ones are skipped)."""
        return dict(self._recovered)

    async def close(self, *, flush: bool = True) -> None:
        """Flush (unless ``flush=False``, which drops buffered records as a crash would) and close."""
        if self._closed:
            return
        self._closed = True
        await self._log.close(flush=flush)

    # -- records ------------------------------------------------------------------------------------

    async def append(self, record: R) -> WritePosition:
        """Write one record of a transaction; resolves once it is durable."""
        self._check_open()
        key = self._txn_key(record)
        future = self._log.writer.submit(record)
        in_flight = self._in_flight
        in_flight[key] = in_flight.get(key, 0) + 1
        try:
            position = await future
            positions = self._positions.get(key)
            if positions is None:
                self._positions[key] = [position]
            else:
                positions.append(position)
            return position
        finally:
            left = in_flight[key] - 1
            if left:
                in_flight[key] = left
            else:
                del in_flight[key]
                settled = self._settled.pop(key, None)
                if settled is not None and not settled.done():
                    settled.set_result(None)

    async def delete_txn(self, txn_id: TxnIdLike) -> None:
        """Delete every record of an ended transaction (idempotent; waits for its in-flight records)."""
        self._check_open()
        key = (txn_id.most, txn_id.least)
        while key in self._in_flight:
            settled = self._settled.get(key)
            if settled is None:
                settled = self._settled[key] = asyncio.get_running_loop().create_future()
            await asyncio.shield(settled)
        positions = self._positions.pop(key, None)
        self._recovered.pop(TxnID(*key), None)
        if positions:
            try:
                await self._log.delete(positions)
            except BaseException:
                # Keep them so a retry (the coordinator retries ends) deletes them after all.
                self._positions.setdefault(key, []).extend(positions)
                raise

    def txn_positions(self, txn_id: TxnIdLike) -> list[WritePosition]:
        """Durable positions of a transaction's records not yet deleted."""
        return list(self._positions.get((txn_id.most, txn_id.least), ()))

    def txn_count(self) -> int:
        """Transactions with records still live in this store."""
        return len(self._positions)

    # -- settings and inspection --------------------------------------------------------------------

    async def configure(self, config: BatchedWriteConfig) -> None:
        """Change batched-write settings dynamically (disabling waits until no batched write is pending)."""
        self._check_open()
        await self._log.configure(config)

    @property
    def config(self) -> BatchedWriteConfig:
        return self._log.config

    @property
    def name(self) -> str:
        """The managed ledger name (the store's identity in the admin API)."""
        return self._log.ledger_name

    @property
    def format_level(self) -> int:
        return self._log.format_level

    @property
    def writer_state(self) -> WriterState:
        return self._log.writer.state

    def batched_write_stat(self) -> dict[str, Any]:
        """Pulsar's TxnBufferedWriterStat of this store's writer."""
        return self._log.batched_write_stat()

    def internal_stats(self) -> dict[str, Any]:
        """``{"managedLedgerName", "managedLedgerInternalStats"}`` (Pulsar's shape)."""
        return self._log.internal_stats()

    async def live_entry_formats(self) -> LiveEntryFormats:
        """Live entries by format, read from disk (the downgrade verifier's input)."""
        self._check_open()
        return await self._log.live_entry_formats()

    def ledger_ids(self) -> list[int]:
        return self._log.ledger_ids()

    def current_ledger_id(self) -> int:
        return self._log.current_ledger_id()

    def oldest_live_ledger(self) -> int | None:
        ids = self._log.ledger_ids()
        return ids[0] if ids else None

    async def rollover(self) -> int:
        """Roll the ledger over and trim; returns LastBatchedLedger (largest ledger id before it)."""
        self._check_open()
        return await self._log.rollover()

    async def trim(self) -> list[int]:
        """Delete ledgers whose records are all deleted; returns the deleted ledger ids."""
        self._check_open()
        return await self._log.trim()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self._log.store!r} is closed; reopen it to continue")
