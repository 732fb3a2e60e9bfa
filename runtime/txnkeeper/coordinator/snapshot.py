"""Snapshots of a coordinator's transaction log, so a restart replays only what came after one.

Why: the coordinator rebuilds its transaction table by replaying every live record of its log, and
with a million live records that took half a minute. Pulsar has no such snapshot for its transaction
log (it always replays ``__transaction_log_N``); ours is an addition, and it is only ever a shortcut:

- a snapshot is what a replay of the log up to one position (``covers``) would have rebuilt: every
  transaction with live records (status, timeout, start and modification times, owner, partitions,
  subscriptions, whether its NEW record is live) and the packed positions of those records. It is
  captured by the store from records whose entries are durable (never from the coordinator's own
  table, which runs ahead of the log while a write is in flight), so it never holds an outcome the
  log does not;
- at open the store takes the snapshot's transactions whose records the cursor still holds (all gone:
  deleted since; some gone: a deletion a crash interrupted, rebuilt from the surviving records as a
  full replay would) and replays only the entries after ``covers``. A snapshot older than trimmed
  ledgers is still right: every record in a trimmed ledger is below the mark-delete position, so it
  is found deleted;
- the file is a checksummed state file (``txnkeeper.statefile``, kind ``txn-log-snapshot``, version
  1) replaced atomically. A file that cannot be used (damaged, another log's, a newer version,
  covering more than the log holds) is ignored with a warning naming it and why, and the log is
  replayed in full: the log is the truth and the snapshot only saves time, so nothing is served from
  a bad file and nothing is lost. The next snapshot replaces it.

When: every ``max(SNAPSHOT_EVERY_RECORDS, live records / SNAPSHOT_GROWTH)`` appended records (checked
every ``CHECK_INTERVAL_S``) and at a graceful close, so a crash replays at most that many records and
writing snapshots costs a bounded share of the appends however large the table grows.
"""

from __future__ import annotations

import asyncio
import logging
from itertools import chain
from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError
from txnkeeper.stores import StoreSnapshot
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import TransactionLogStore, TxnLogState

log = logging.getLogger(__name__)

SNAPSHOT_KIND = "txn-log-snapshot"
SNAPSHOT_VERSION = 1
SNAPSHOT_EVERY_RECORDS = 50_000
SNAPSHOT_GROWTH = 4
CHECK_INTERVAL_S = 1.0
_MAX_STATUS = 4  # TxnStatus OPEN..ABORTED
_INT_COLUMNS = ("least", "status", "timeout", "start", "modified", "owner", "complete")
_RAGGED_COLUMNS = ("partitions", "subscriptions", "positions")
_FIELDS = {"log", "covers", "names", "most", *_INT_COLUMNS, *_RAGGED_COLUMNS}


def snapshot_path(state_dir: Path, coordinator_id: int) -> Path:
    """Where coordinator ``coordinator_id``'s snapshot lives (beside its sequence file)."""
    return state_dir / f"{coordinator_id}.txn-log-snapshot"


def encode(log_name: str, snapshot: StoreSnapshot[TxnLogState]) -> dict[str, Any]:
    """The JSON body of a snapshot file.

    Column by column (one JSON array per field, not one object per transaction): a million-record
    table parses several times faster. Strings (topics, subscriptions, owners) are stored once in
    ``names``; positions are the store's packed ones (``pack_position``).
    """
    names: dict[str, int] = {}
    name = names.setdefault
    txns = snapshot.txns
    states = [state for _, state, _ in txns]
    partitions = [[name(p, len(names)) for p in state.partitions] for state in states]
    subscriptions = []
    for state in states:
        pairs: list[int] = []
        for topic, subscription in state.subscriptions:
            pairs.append(name(topic, len(names)))
            pairs.append(name(subscription, len(names)))
        subscriptions.append(pairs)
    return {
        "log": log_name,
        "covers": list(snapshot.covers) if snapshot.covers is not None else None,
        "most": [txn_id.most for txn_id, _, _ in txns],
        "least": [txn_id.least for txn_id, _, _ in txns],
        "status": [state.status for state in states],
        "timeout": [state.timeout_ms for state in states],
        "start": [state.start_time for state in states],
        "modified": [state.last_modification_time for state in states],
        "owner": [name(state.owner, len(names)) for state in states],
        "complete": [int(state.complete) for state in states],
        "partitions": partitions,
        "subscriptions": subscriptions,
        "positions": [packed for _, _, packed in txns],
        "names": list(names),
    }


def write(path: Path, log_name: str, snapshot: StoreSnapshot[TxnLogState]) -> None:
    """Durably replace ``path`` with ``snapshot`` (blocking: run it in a thread)."""
    statefile.write(path, SNAPSHOT_KIND, SNAPSHOT_VERSION, encode(log_name, snapshot))


def read(path: Path, log_name: str) -> StoreSnapshot[TxnLogState] | None:
    """The snapshot at ``path``, or None if there is none or it cannot be used (warned, naming it)."""
    try:
        doc = statefile.read(path, SNAPSHOT_KIND, frozenset({SNAPSHOT_VERSION}), remedy=_REMEDY)
        if doc is None:
            return None
        try:
            return decode(doc.body, log_name, str(path))
        except (StateShapeError, TypeError, ValueError, IndexError, KeyError) as exc:
            raise StateFileError(path, f"not a valid transaction log snapshot: {exc}", _REMEDY) from exc
    except StateFileError as exc:
        # Our own remedy, whatever the state file layer suggests: a snapshot is never needed.
        log.warning("transaction log snapshot %s is unusable: %s; %s", exc.path, exc.problem, _REMEDY)
        return None


_REMEDY = (
    "it is ignored and the transaction log is replayed in full (nothing is lost; the next snapshot "
    "replaces the file)"
)


def decode(body: Any, log_name: str, source: str) -> StoreSnapshot[TxnLogState]:
    """Check and rebuild a snapshot body (StateShapeError/TypeError/ValueError/IndexError if malformed)."""
    doc = statefile.obj(body, "snapshot", _FIELDS)
    if doc["log"] != log_name:
        raise StateShapeError(f"it is a snapshot of {doc['log']!r}, not of {log_name!r}")
    covers_doc = doc["covers"]
    covers: tuple[int, int] | None = None
    if covers_doc is not None:
        ledger_id, entry_id = statefile.array(covers_doc, "covers")
        covers = (
            statefile.integer(ledger_id, "covers ledger", 0),
            statefile.integer(entry_id, "covers entry", 0),
        )
    names = _column(doc, "names", str)
    count = len(_column(doc, "most", int))
    for field in _INT_COLUMNS:
        if len(_column(doc, field, int)) != count:
            raise StateShapeError(f"column {field!r} has {len(doc[field])} values, not {count}")
    for field in _RAGGED_COLUMNS:
        column = _column(doc, field, list)
        if len(column) != count:
            raise StateShapeError(f"column {field!r} has {len(column)} values, not {count}")
        values = list(chain.from_iterable(column))
        if values and (set(map(type, values)) != {int} or min(values) < 0):
            raise StateShapeError(f"column {field!r} holds something other than numbers >= 0")
        if values and field != "positions" and max(values) >= len(names):
            raise StateShapeError(f"column {field!r} refers to a name that is not there")
    if doc["status"] and (min(doc["status"]) < 0 or max(doc["status"]) > _MAX_STATUS):
        raise StateShapeError("a status is not a TxnStatus number (0..4)")
    if doc["complete"] and (min(doc["complete"]) < 0 or max(doc["complete"]) > 1):
        raise StateShapeError("a complete flag is not 0 or 1")
    if doc["owner"] and (min(doc["owner"]) < 0 or max(doc["owner"]) >= len(names)):
        raise StateShapeError("an owner refers to a name that is not there")
    if not all(doc["positions"]):
        raise StateShapeError("a transaction has no position")
    txns: list[tuple[TxnID, TxnLogState, list[int]]] = []
    add = txns.append
    name = names.__getitem__
    new_id = tuple.__new__  # TxnID(most, least) without the named tuple's Python-level __new__
    for most, least, status, timeout, start, modified, owner, complete, parts, subs, positions in zip(
        doc["most"],
        doc["least"],
        doc["status"],
        doc["timeout"],
        doc["start"],
        doc["modified"],
        doc["owner"],
        doc["complete"],
        doc["partitions"],
        doc["subscriptions"],
        doc["positions"],
        strict=True,
    ):
        txn_id: TxnID = new_id(TxnID, (most, least))
        state = TxnLogState(
            txn_id,
            status,
            timeout,
            start,
            modified,
            names[owner],
            list(map(name, parts)),
            [(names[subs[i]], names[subs[i + 1]]) for i in range(0, len(subs), 2)] if subs else [],
            positions,  # the same list the store keeps as the transaction's positions
            complete == 1,
        )
        add((txn_id, state, positions))
    return StoreSnapshot(covers, txns, source)


def _column(doc: dict[str, Any], field: str, kind: type) -> list[Any]:
    column = statefile.array(doc[field], field)
    if column and set(map(type, column)) != {kind}:
        raise StateShapeError(f"column {field!r} must hold only {kind.__name__} values")
    return column


class TxnLogSnapshots:
    """Writes one coordinator's snapshots: periodically while it runs and once at a graceful close."""

    def __init__(
        self, path: Path, store: TransactionLogStore, *, every: int = SNAPSHOT_EVERY_RECORDS
    ) -> None:
        self.path = path
        self._store = store
        self._every = every
        self._threshold = every
        self._lock = asyncio.Lock()  # one capture and file write at a time, in capture order
        self._task: asyncio.Task[None] | None = None
        self.written = 0

    @property
    def threshold(self) -> int:
        """Records appended since the last capture that make the next snapshot due."""
        return self._threshold

    def start(self, *, due: bool = False) -> None:
        """Start the periodic writes; ``due``: write the first one at once."""
        self._task = asyncio.get_running_loop().create_task(self._run(due))

    async def write(self) -> None:
        """Capture the store's state now and persist it (the capture is instant; encoding and the
        fsyncs run in a thread, the encoding in slices that give the GIL back to the loop between
        them: ``statefile._json_pieces``)."""
        async with self._lock:
            snapshot = self._store.capture_snapshot()
            await asyncio.to_thread(write, self.path, self._store.name, snapshot)
            live = sum(len(packed) for _, _, packed in snapshot.txns)
            self._threshold = max(self._every, live // SNAPSHOT_GROWTH)
            self.written += 1

    async def _run(self, due: bool) -> None:
        while True:
            if not due:
                await asyncio.sleep(CHECK_INTERVAL_S)
                if self._store.records_since_capture < self._threshold:
                    continue
            due = False
            try:
                await self.write()
            except (OSError, StateFileError) as exc:
                # The log stays the truth: a missed snapshot only makes the next restart replay more.
                log.error(
                    "writing the transaction log snapshot %s failed (%s); retried later", self.path, exc
                )

    async def close(self, *, final: bool = True) -> None:
        """Stop the periodic writes; with ``final``, flush the store's writer and write one last
        snapshot so a graceful restart replays nothing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if final:
            await self._store.flush()
            await self.write()
