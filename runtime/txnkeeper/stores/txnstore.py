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
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter.codec import RecordCodec
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import BufferedWriterMetrics
from txnkeeper.bufferedwriter.writer import (
    FAILED,
    PositionSink,
    WritePosition,
    pack_position,
    unpack_position,
)
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.stores.recordlog import LiveEntryFormats, RecordLog
from txnkeeper.txnid import TxnID, TxnIdLike

R = TypeVar("R", bound=Message)
S = TypeVar("S")
Store = TypeVar("Store", bound="TxnRecordStore[Any, Any]")
TxnKey = tuple[int, int]

# Both logs' records carry the transaction id under these names (their field numbers differ).
_txn_key = attrgetter("txnid_most_bits", "txnid_least_bits")

# A transaction's records written since open, as one list (one GC-tracked object per transaction):
# item 0 counts the records submitted; the writer appends each one's packed position (or FAILED).
_SUBMITTED = 0


class StoreClosedError(RuntimeError):
    """The store was closed; reopen it to continue."""


class TxnRecordStore(ABC, Generic[R, S]):
    """A :class:`RecordLog` whose records belong to transactions; ``S`` is the replayed per-txn state."""

    def __init__(self, log: RecordLog[R]) -> None:
        self._log = log
        self._submit = log.writer.submit
        self._replayed: dict[TxnKey, list[WritePosition]] = {}
        self._written: dict[TxnKey, PositionSink] = {}
        self._recovered: dict[TxnID, S] = {}
        self._closed = False

    # -- record semantics supplied by each store ----------------------------------------------------

    @abstractmethod
    def _check_record(self, record: R) -> None:
        """Refuse (TypeError/ValueError, saying what to fix) a record this store must not write."""

    @abstractmethod
    def _fold(self, state: S | None, txn_id: TxnID, position: WritePosition, record: R) -> S:
        """Apply one replayed record to its transaction's state (``None``: first record seen)."""

    # -- lifecycle ----------------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Replay the log into per-transaction state (what ``open`` does last); a log that cannot be
        replayed is closed without flushing (nothing was written) and the error raised."""
        states: dict[TxnID, S] = {}
        # Per transaction, not per record: its TxnID and its list of positions (records of one txn
        # are usually several; building these once each is a measurable share of a replay).
        ids: dict[TxnKey, tuple[TxnID, list[WritePosition]]] = {}
        replayed = self._replayed
        fold = self._fold
        try:
            for live in await self._log.replay():
                record = live.record
                key: TxnKey = _txn_key(record)
                known = ids.get(key)
                if known is None:
                    txn_id = TxnID(*key)
                    positions = replayed.get(key)
                    if positions is None:
                        positions = replayed[key] = []
                    known = ids[key] = (txn_id, positions)
                txn_id, positions = known
                positions.append(live.position)
                states[txn_id] = fold(states.get(txn_id), txn_id, live.position, record)
        except BaseException:
            await self._log.close(flush=False)
            raise
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

    def append(self, record: R) -> asyncio.Future[WritePosition]:
        """Write one record of a transaction now; the future resolves once it is durable.

        A plain function returning the writer's future, not a coroutine: the record is queued at the
        call (so call order is log order), and the record path saves a coroutine per record, which
        was a sixth of its CPU. Refusals (closed store, wrong record) raise at the call.
        """
        if self._closed:
            self._check_open()
        self._check_record(record)
        key: TxnKey = _txn_key(record)
        written = self._written.get(key)
        if written is None:
            written = self._written[key] = [0]
        # The writer appends the position to ``written`` itself when the entry settles, so the record
        # path does nothing after the write and even a cancelled caller's record is known.
        future = self._submit(record, written)
        written[_SUBMITTED] += 1
        return future

    async def delete_txn(self, txn_id: TxnIdLike) -> None:
        """Delete every record of an ended transaction (idempotent; waits for its in-flight records)."""
        await self.delete_txns((txn_id,))

    async def delete_txns(self, txn_ids: Iterable[TxnIdLike]) -> None:
        """Delete every record of many ended transactions in one call (idempotent, all or nothing).

        What deferred housekeeping calls with the transactions that ended since its last round: one
        coroutine and one cursor round for all of them instead of a task each. On failure every
        record is kept for a retry (the caller's next round, or the replay after a restart).
        """
        self._check_open()
        taken: list[tuple[TxnKey, list[int]]] = []
        everything: list[int] = []
        for txn_id in txn_ids:
            key = (txn_id.most, txn_id.least)
            replayed = self._replayed.pop(key, None)
            packed = [pack_position(*p) for p in replayed] if replayed else []
            written = self._written.pop(key, None)
            if written is not None:
                while len(written) - 1 < written[_SUBMITTED]:
                    await self._log.writer.wait_for_progress()
                # FAILED marks a record whose write failed: it is not in the log.
                if FAILED in written:
                    packed.extend(p for p in written[1:] if p != FAILED)
                else:
                    packed.extend(written[1:])
            if self._recovered:
                self._recovered.pop(TxnID(*key), None)
            if packed:
                taken.append((key, packed))
                everything.extend(packed)
        if not everything:
            return
        try:
            await self._log.delete_packed(everything)
        except BaseException:
            # Keep them so a retry (the coordinator retries ends) deletes them after all.
            for key, packed in taken:
                self._replayed.setdefault(key, []).extend(unpack_position(p) for p in packed)
            raise

    def txn_positions(self, txn_id: TxnIdLike) -> list[WritePosition]:
        """Durable positions of a transaction's records not yet deleted (in-flight ones excluded)."""
        key = (txn_id.most, txn_id.least)
        positions = list(self._replayed.get(key, ()))
        written = self._written.get(key)
        if written is not None:
            positions.extend(unpack_position(p) for p in written[1:] if p != FAILED)
        return positions

    def txn_count(self) -> int:
        """Transactions with records still live (or in flight) in this store."""
        return len(self._replayed.keys() | self._written.keys())

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


async def open_store(
    make: Callable[[RecordLog[R]], Store],
    factory: ManagedLedgerFactory,
    ledger_name: str,
    cursor_name: str,
    codec: RecordCodec[R],
    *,
    config: BatchedWriteConfig | None,
    format_level: int,
    metrics_prefix: str,
    labels: dict[str, str],
    registry: CollectorRegistry | None,
    ledger_config: ManagedLedgerConfig | None,
) -> Store:
    """Open a store's log, build the store on it with ``make`` and replay it: every store's ``open``.

    ``config=None`` means the defaults (batching off). The writer's metrics are labelled ``labels``
    under ``metrics_prefix`` and created only once the log is reserved (see ``RecordLog.open``).
    """
    log = await RecordLog.open(
        factory,
        ledger_name,
        cursor_name,
        codec,
        config=config if config is not None else BatchedWriteConfig(),
        format_level=format_level,
        metrics=lambda: BufferedWriterMetrics(metrics_prefix, labels, registry),
        ledger_config=ledger_config,
    )
    store = make(log)
    await store._recover()
    return store
