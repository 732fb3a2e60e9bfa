"""What both transactional stores share: records grouped by transaction, deleted when it ends.

A store appends a transaction's records as they come and, when the transaction has ended, deletes
every one of them (batch-index-level for batched entries), so that entries and then ledgers can be
trimmed. It must know every position of a transaction, including records still in flight when the end
arrives: ``delete_txn`` waits for those instead of leaving them behind forever (a leaked record would
keep its ledger, and with it every later ledger, alive).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, TypeVar

from google.protobuf.message import EncodeError, Message
from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter.codec import RecordCodec, serialize_record
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import BufferedWriterMetrics
from txnkeeper.bufferedwriter.writer import (
    FAILED,
    PositionSink,
    WritePosition,
    pack_position,
    unpack_position,
)
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.stores.recordlog import LiveEntryFormats, RecordLog
from txnkeeper.txnid import TxnID, TxnIdLike

log = logging.getLogger(__name__)

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


@dataclass(slots=True)
class StoreSnapshot(Generic[S]):
    """Every transaction with live records as of one log position, as the replay would rebuild it.

    ``covers`` is the (ledger id, entry id) up to which every record is folded into ``txns`` (None: an
    empty log); ``txns`` holds each transaction's state and the packed positions of its records at or
    before ``covers``. Records deleted after the capture are found deleted on the cursor at load.
    """

    covers: tuple[int, int] | None
    txns: list[tuple[TxnID, S, list[int]]]
    source: str = ""  # where it was read from, for messages


_ENTRY_SHIFT = 64  # a packed position without its batch size and index: its entry (see pack_position)

# A transaction whose deletion is in flight: its state and positions stay part of any snapshot until
# the cursor has persisted the deletion (a crash before that must find them again).
_Deleting = tuple[TxnID, Any, list[int], list[Any], list[int]]


class TxnRecordStore(ABC, Generic[R, S]):
    """A :class:`RecordLog` whose records belong to transactions; ``S`` is the replayed per-txn state."""

    def __init__(self, log: RecordLog[R], *, snapshots: bool = False) -> None:
        self._log = log
        self._submit_serialized = log.writer.submit_serialized
        # Reads a retained record back (set by open_store, from the log's codec).
        self._parse_record: Callable[[bytes], R] | None = None
        # Packed positions (pack_position) of each transaction's records folded into ``_recovered``.
        self._replayed: dict[TxnKey, list[int]] = {}
        self._written: dict[TxnKey, PositionSink] = {}
        self._recovered: dict[TxnID, S] = {}
        self._closed = False
        # With snapshots, records written since the last capture are kept (in ``_written``'s order)
        # until a capture folds those that settled into ``_recovered``; ``_recovered`` then holds
        # every transaction with live records, as a replay up to the capture would. Kept as the
        # bytes written, parsed only if a capture folds them: most transactions are deleted first,
        # and freeing one bytes object long after the write costs a fraction of freeing the record.
        self._retained: dict[TxnKey, list[bytes]] | None = {} if snapshots else None
        self._deleting: dict[TxnKey, _Deleting] = {}
        self._covered: tuple[int, int] | None = None
        self.records_since_capture = 0
        self.replayed_records = 0  # by open: what no snapshot covered

    # -- record semantics supplied by each store ----------------------------------------------------

    @abstractmethod
    def _check_record(self, record: R) -> None:
        """Refuse (TypeError/ValueError, saying what to fix) a record this store must not write."""

    def _bind_positions(self, state: S, packed: list[int]) -> None:
        """Let ``state`` share the store's list of its transaction's packed positions (a store whose
        state shows positions overrides this instead of copying them in ``_fold``)."""

    @abstractmethod
    def _fold(self, state: S | None, txn_id: TxnID, position: WritePosition, record: R) -> S:
        """Apply one replayed record to its transaction's state (``None``: first record seen)."""

    # -- lifecycle ----------------------------------------------------------------------------------

    async def _recover(self, snapshot: StoreSnapshot[S] | None = None) -> None:
        """Rebuild per-transaction state (what ``open`` does last): from ``snapshot`` if given, then by
        replaying the records after the position it covers (all of them without one). A log that
        cannot be replayed is closed without flushing (nothing was written) and the error raised."""
        states: dict[TxnID, S] = {}
        # Per transaction, not per record: its TxnID and its list of positions (records of one txn
        # are usually several; building these once each is a measurable share of a replay).
        ids: dict[TxnKey, tuple[TxnID, list[int]]] = {}
        replayed = self._replayed
        fold = self._fold
        covered = self._log.last_confirmed()
        last = (covered.ledger_id, covered.entry_id) if covered is not None else None
        if snapshot is not None and snapshot.covers is not None and (last is None or snapshot.covers > last):
            log.warning(
                "snapshot %s of store %r covers up to %s:%s but the log ends at %s: it is not this log's"
                " (or the log lost entries, which the ledger refuses by itself); ignoring it and"
                " replaying the log in full",
                snapshot.source or "(in memory)",
                self._log.store,
                *snapshot.covers,
                "an empty log" if last is None else f"{last[0]}:{last[1]}",
            )
            snapshot = None
        try:
            after = None
            if snapshot is not None:
                await self._adopt(snapshot, states)
                if snapshot.covers is not None:
                    after = Position(*snapshot.covers)
            count = 0
            for live in await self._log.replay(after):
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
                positions.append(pack_position(*live.position))
                states[txn_id] = fold(states.get(txn_id), txn_id, live.position, record)
                count += 1
        except BaseException:
            await self._log.close(flush=False)
            raise
        bind = self._bind_positions
        for txn_id, positions in ids.values():
            bind(states[txn_id], positions)
        self.replayed_records = count
        self._recovered = states
        self._covered = last

    async def _adopt(self, snapshot: StoreSnapshot[S], states: dict[TxnID, S]) -> None:
        """Take the snapshot's transactions whose records the cursor still holds.

        All records gone: the transaction was deleted after the capture. Some gone: a deletion was
        interrupted by a crash; that transaction is rebuilt from its surviving records exactly as a
        full replay would (rare, so read entry by entry).
        """
        deleted = self._log.deleted_checker()
        replayed = self._replayed
        partial: list[tuple[TxnID, list[int]]] = []
        # Checked per entry first: usually no entry the snapshot names has lost a record since.
        touched = self._log.touched_entries(
            {p >> _ENTRY_SHIFT for _, _, packed in snapshot.txns for p in packed}
        )
        for txn_id, state, packed in snapshot.txns:
            if touched:
                live = [p for p in packed if not deleted(p)]
                if len(live) != len(packed):
                    if live:
                        partial.append((txn_id, live))
                    continue
            states[txn_id] = state
            replayed[(txn_id.most, txn_id.least)] = packed
        for txn_id, live in partial:
            rebuilt: S | None = None
            for packed_position, record in zip(live, await self._log.records_at(live), strict=True):
                rebuilt = self._fold(rebuilt, txn_id, unpack_position(packed_position), record)
            assert rebuilt is not None
            self._bind_positions(rebuilt, live)
            states[txn_id] = rebuilt
            replayed[(txn_id.most, txn_id.least)] = live

    def capture_snapshot(self) -> StoreSnapshot[S]:
        """Every transaction with live records as of the newest settled entry (synchronous, so the
        state is one instant's). Only stores opened with ``snapshots=True`` can capture."""
        if self._retained is None:
            raise RuntimeError(f"store {self._log.store!r} was opened without snapshots")
        settled = self._log.writer.last_settled_entry
        covers = settled if settled is not None else self._covered
        for key in list(self._retained):
            self._fold_settled(key)
        for key, (txn_id, deleting, packed, records, written) in list(self._deleting.items()):
            if records:
                folded = self._fold_records(txn_id, deleting, packed, records, written)
                if folded is not None:
                    self._bind_positions(folded, packed)
                self._deleting[key] = (txn_id, folded, packed, [], [])
        txns = [
            (txn_id, state, list(self._replayed.get((txn_id.most, txn_id.least), ())))
            for txn_id, state in self._recovered.items()
        ]
        txns.extend((txn_id, state, list(packed)) for txn_id, state, packed, _, _ in self._deleting.values())
        self.records_since_capture = 0
        return StoreSnapshot(covers, txns)

    def _fold_settled(self, key: TxnKey) -> None:
        """Fold the retained records of ``key`` whose entries settled; keep the rest retained."""
        assert self._retained is not None
        records = self._retained[key]
        written = self._written[key]
        settled = len(written) - 1
        if settled == 0:
            return
        txn_id = TxnID(*key)
        packed = self._replayed.get(key)
        if packed is None:
            packed = self._replayed[key] = []
        state = self._recovered.get(txn_id)
        state = self._fold_records(txn_id, state, packed, records[:settled], written[1:])
        if state is not None:
            self._bind_positions(state, packed)
            self._recovered[txn_id] = state
        del records[:settled]
        del written[1:]
        written[_SUBMITTED] -= settled
        if not records:
            del self._retained[key]
            del self._written[key]
        if not packed:
            del self._replayed[key]

    def _fold_records(
        self, txn_id: TxnID, state: S | None, packed: list[int], records: list[bytes], written: list[int]
    ) -> S | None:
        """Fold retained records (as written) with their positions into ``state``."""
        fold = self._fold
        parse = self._parse_record
        for record, position in zip(records, written, strict=True):
            if position == FAILED:  # never written: not in the log, not in the state
                continue
            assert parse is not None  # records are retained only by stores open_store opened
            packed.append(position)
            state = fold(state, txn_id, unpack_position(position), parse(record))
        return state

    async def flush(self) -> None:
        """Hand buffered records to the ledger and wait until every one so far has settled."""
        self._check_open()
        await self._log.writer.flush()

    async def replay(self) -> dict[TxnID, S]:
        """Per-transaction state rebuilt at open from the live records (deleted ones are skipped)."""
        return dict(self._recovered)

    async def destroy(self) -> None:
        """Close and remove the store's log for good (its owner, a subscription, is deleted)."""
        self._closed = True
        await self._log.destroy()

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
        written = self._sink(key)
        # The writer appends the position to ``written`` itself when the entry settles, so the record
        # path does nothing after the write and even a cancelled caller's record is known.
        future, data = self._write(record, written)
        written[_SUBMITTED] += 1
        if self._retained is not None:
            self._retain(key, (data,))
        return future

    def _sink(self, key: TxnKey) -> PositionSink:
        """Where the writer records the positions of ``key``'s records (created at its first)."""
        written = self._written.get(key)
        if written is None:
            written = self._written[key] = [0]
        return written

    def _retain(self, key: TxnKey, data: Sequence[bytes]) -> None:
        """Keep records as written until the next capture (stores that take snapshots only)."""
        assert self._retained is not None
        kept = self._retained.get(key)
        if kept is None:
            kept = self._retained[key] = []
        kept.extend(data)
        self.records_since_capture += len(data)

    def _write(self, record: R, written: PositionSink) -> tuple[asyncio.Future[WritePosition], bytes]:
        """Serialize a checked record (``_check_record`` refused any other type) and hand it to the
        writer: the bytes are what a snapshot-taking store retains."""
        try:
            data = record.SerializeToString()
        except EncodeError:
            data = serialize_record(record)  # raises the explanatory error
        return self._submit_serialized(data, written), data

    def append_all(self, records: Sequence[R]) -> list[asyncio.Future[WritePosition]]:
        """Write records of one transaction now, in order (``append`` for each, the transaction's
        bookkeeping looked up once): what a coordinator's begin writes (NEW and its ADD records).

        Every record is checked (``_check_record``) before any is written, and records of different
        transactions are refused (ValueError); one that cannot be serialized (a required field
        unset) stops the call there, its predecessors written. Returns each record's future.
        """
        if self._closed:
            self._check_open()
        if not records:
            raise ValueError("append_all needs at least one record")
        key: TxnKey = _txn_key(records[0])
        for record in records:
            self._check_record(record)
            if _txn_key(record) != key:
                raise ValueError(
                    f"append_all writes the records of one transaction: got {_txn_key(record)} after {key};"
                    " append each transaction's records in its own call"
                )
        written = self._sink(key)
        write = self._write
        futures: list[asyncio.Future[WritePosition]] = []
        written_data: list[bytes] = []
        try:
            for record in records:
                future, data = write(record, written)
                futures.append(future)
                written_data.append(data)
        finally:
            # Only what the writer took is counted and retained (a refusal leaves the rest unwritten).
            written[_SUBMITTED] += len(futures)
            if self._retained is not None and written_data:
                self._retain(key, written_data)
        return futures

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
        keys = [(txn_id.most, txn_id.least) for txn_id in txn_ids]
        for key in keys:  # records still in flight are deleted too, once they have a position
            written = self._written.get(key)
            if written is not None:
                while len(written) - 1 < written[_SUBMITTED]:
                    await self._log.writer.wait_for_progress()
        taken: list[TxnKey] = []
        everything: list[int] = []
        replayed, written_of, recovered, retained = (
            self._replayed,
            self._written,
            self._recovered,
            self._retained,
        )
        deleting = self._deleting
        for key in keys:
            packed = replayed.pop(key, None) or []
            written = written_of.pop(key, None)
            positions = written[1:] if written is not None else []
            txn_id = TxnID(*key)
            state = recovered.pop(txn_id, None) if recovered else None
            if retained is not None:
                # Each retained record pairs with its position in ``written`` (the ones settled).
                records = retained.pop(key, None) or []
                del records[len(positions) :]
            else:
                # FAILED marks a record whose write failed: it is not in the log.
                packed.extend(p for p in positions if p != FAILED)
                records, positions = [], []
            ids = packed + positions
            if FAILED in ids:
                ids = [p for p in ids if p != FAILED]
            if ids:
                deleting[key] = (txn_id, state, packed, records, positions)
                taken.append(key)
                everything.extend(ids)
        if not everything:
            return
        try:
            await self._log.delete_packed(everything)
        except BaseException:
            # Keep them so a retry (the coordinator retries ends) deletes them after all.
            for key in taken:
                self._restore(key)
            raise
        for key in taken:
            self._deleting.pop(key, None)

    def _restore(self, key: TxnKey) -> None:
        deleting = self._deleting.pop(key, None)
        if deleting is None:
            return
        txn_id, state, packed, records, written = deleting
        state = self._fold_records(txn_id, state, packed, records, written)
        newer = self._replayed.get(key)
        if newer:
            packed.extend(newer)
        self._replayed[key] = packed
        if state is not None:
            self._bind_positions(state, packed)
            self._recovered[txn_id] = state

    def txn_positions(self, txn_id: TxnIdLike) -> list[WritePosition]:
        """Durable positions of a transaction's records not yet deleted (in-flight ones excluded)."""
        key = (txn_id.most, txn_id.least)
        positions = [unpack_position(p) for p in self._replayed.get(key, ())]
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
    snapshot: StoreSnapshot[Any] | None = None,
) -> Store:
    """Open a store's log, build the store on it with ``make`` and replay it: every store's ``open``.

    ``config=None`` means the defaults (batching off). ``snapshot`` (a capture of an earlier run)
    replaces the replay of every record it covers. The writer's metrics are labelled ``labels``
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
    store._parse_record = codec.parse_record
    await store._recover(snapshot)
    return store
