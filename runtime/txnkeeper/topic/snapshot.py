"""The transaction buffer snapshot of one partition (Pulsar's __transaction_buffer_snapshot idea).

Without it a restarted store replays every live entry of every topic to learn which transactions
ended how; with it, recovery loads the ended (committed and aborted) transactions with their marker
positions, the open ones, and the position the snapshot covers, then replays only the entries after
that position. Recovery time then grows with the traffic since the last snapshot, not with the
retained data.

Since version 2 it also carries the topic's writer state (single-routing-key writers and idempotent
producers, txnkeeper.topic.writers), like Pulsar's pulsar.dedup cursor properties: the markers and
records it was rebuilt from may since have been trimmed, so this copy is what keeps dedup working
across trims. Since version 3 the ended transactions are the buffer's packed rows
(``txnbuffer.ENDED_ROW``), base64 in chunks of ``ROWS_PER_CHUNK`` rows, instead of one JSON array per
transaction: a capture is then a copy of one bytes object and its encoding a few C calls, where the
JSON rows cost a store pod 6-8 % of its CPU at 256 transactions in flight. Since version 4 each open
transaction carries the position of its first message (a ledger holding it is never trimmed, and no
cursor is moved past it) and the body the next store-local block's transaction number (committed block
outcomes are no longer kept, so the ended rows no longer tell it). Versions 1 to 3 are still read
(their open transactions' first positions count as unknown: they keep every ledger until they end);
an older release finds a newer file unreadable and rebuilds by a full replay.

The snapshot is a checksummed state file (txnkeeper.statefile), replaced atomically. It is derivable
from the ledger, so one that is damaged, of another topic, or ahead of the ledger is never used: the
partition logs a WARNING naming the file and what was wrong, and rebuilds by a full replay.
"""

from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import dataclass, field
from pathlib import Path

from txnkeeper import statefile
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.position import Position
from txnkeeper.topic.txnbuffer import ENDED_ROW, UNKNOWN_FIRST, check_ended_rows
from txnkeeper.topic.txnbuffer import EndedTxn as EndedTxn  # noqa: PLC0414 (re-exported: the readable row)
from txnkeeper.topic.txnbuffer import pack_ended as pack_ended  # noqa: PLC0414 (re-exported)
from txnkeeper.topic.txnbuffer import unpack_ended as unpack_ended  # noqa: PLC0414 (re-exported)
from txnkeeper.txnid import TxnID

KIND = "txn-buffer-snapshot"
VERSION = 4
READABLE = frozenset({1, 2, 3, 4})
# Ended rows per base64 string of a version 3 body: the state file's encoder gives up the GIL between
# array slices, so one huge string would hold it for the whole encoding.
ROWS_PER_CHUNK = 4096
REMEDY = "it is rebuilt from the topic's ledger by a full replay; nothing needs to be done"


# [writer id, last number, last block's first number, its first MessageId's ledger and entry id (-1:
# unknown), last active ms]
WriterRow = tuple[str, int, int, int, int, int]


@dataclass(frozen=True)
class BufferSnapshot:
    """The transaction buffer's state once every entry up to and including ``covers`` was applied."""

    topic: str
    covers: Position
    ended: bytes  # txnbuffer.ENDED_ROW rows (pack_ended / unpack_ended); a later row of a txn counts
    # open txns with their first durable message (None: not durable yet, so after ``covers``)
    open: list[tuple[TxnID, Position | None]]
    writers: list[WriterRow] = field(default_factory=list)
    next_block_txn: int = 0  # the lowest least bits a new store-local block may use (0: unknown)


class SnapshotError(ValueError):
    """A snapshot file that must not be used (the message names the file and the problem)."""


def snapshot_path(directory: Path, topic: str) -> Path:
    return directory / f"{encode_name(topic, 'topic')}.snapshot"


def encode_body(snapshot: BufferSnapshot) -> dict[str, object]:
    rows, chunk = snapshot.ended, ROWS_PER_CHUNK * ENDED_ROW.size
    return {
        "topic": snapshot.topic,
        "covers": [snapshot.covers.ledger_id, snapshot.covers.entry_id],
        "ended": [base64.b64encode(rows[i : i + chunk]).decode("ascii") for i in range(0, len(rows), chunk)],
        "open": [
            [t.most, t.least, *((first.ledger_id, first.entry_id) if first is not None else (-1, -1))]
            for t, first in snapshot.open
        ],
        "writers": [list(row) for row in snapshot.writers],
        "nextBlockTxn": snapshot.next_block_txn,
    }


# One snapshot encoded and written at a time in the process: a busy topic's is a few MB in memory while
# it is written, and the topics of a store reach their thresholds together under an even load.
_WRITING = threading.Lock()


def write(path: Path, snapshot: BufferSnapshot) -> None:
    """Durably replace the snapshot at ``path`` (temporary file, fsync, rename, fsync directory)."""
    with _WRITING:
        statefile.write(path, KIND, VERSION, encode_body(snapshot))


def _position(value: object, what: str) -> Position:
    pair = statefile.array(value, what)
    if len(pair) != 2:
        raise statefile.StateShapeError(f"{what} must be [ledger id, entry id]")
    return Position(statefile.integer(pair[0], what, 0), statefile.integer(pair[1], what, -1))


def _decode_writers(value: object) -> list[WriterRow]:
    rows: list[WriterRow] = []
    for i, row in enumerate(statefile.array(value, "writers")):
        fields = statefile.array(row, f"writers[{i}]")
        if len(fields) != 6:
            raise statefile.StateShapeError(f"writers[{i}] must have 6 fields, has {len(fields)}")
        last, last_first, ledger_id, entry_id, active = (
            statefile.integer(f, f"writers[{i}]", -1) for f in fields[1:]
        )
        rows.append(
            (statefile.string(fields[0], f"writers[{i}] id"), last, last_first, ledger_id, entry_id, active)
        )
    return rows


def _decode_ended_rows(value: object) -> bytes:
    """Version 1 and 2: one JSON array per ended transaction."""
    ended: list[EndedTxn] = []
    for i, row in enumerate(statefile.array(value, "ended")):
        fields = statefile.array(row, f"ended[{i}]")
        if len(fields) != 6:
            raise statefile.StateShapeError(f"ended[{i}] must have 6 fields, has {len(fields)}")
        most, least, committed, ledger_id, entry_id, deadline = (
            statefile.integer(f, f"ended[{i}]", 0) for f in fields
        )
        if most >= 2**64 or least >= 2**64 or committed > 1 or max(ledger_id, entry_id, deadline) >= 2**63:
            raise statefile.StateShapeError(f"ended[{i}] has a field out of range")
        ended.append(EndedTxn(TxnID(most, least), bool(committed), Position(ledger_id, entry_id), deadline))
    return pack_ended(ended)


def _decode_ended_chunks(value: object) -> bytes:
    """Version 3: base64 strings of packed rows."""
    chunks: list[bytes] = []
    for i, text in enumerate(statefile.array(value, "ended")):
        try:
            chunk = base64.b64decode(statefile.string(text, f"ended[{i}]"), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise statefile.StateShapeError(f"ended[{i}] is not base64: {exc}") from exc
        problem = check_ended_rows(chunk)
        if problem is not None:
            raise statefile.StateShapeError(f"ended[{i}]: {problem}")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode_open(value: object, version: int) -> list[tuple[TxnID, Position | None]]:
    opened: list[tuple[TxnID, Position | None]] = []
    width = 4 if version >= 4 else 2
    for i, row in enumerate(statefile.array(value, "open")):
        fields = statefile.array(row, f"open[{i}]")
        if len(fields) != width:
            raise statefile.StateShapeError(
                f"open[{i}] must be [most, least{', first ledger, first entry' if width == 4 else ''}]"
            )
        txn_id = TxnID(statefile.integer(fields[0], "open", 0), statefile.integer(fields[1], "open", 0))
        first: Position | None = UNKNOWN_FIRST  # versions 1-3: somewhere before `covers`
        if width == 4:
            ledger_id, entry_id = (statefile.integer(f, f"open[{i}]", -1) for f in fields[2:])
            if (ledger_id < 0) != (entry_id < 0):
                raise statefile.StateShapeError(f"open[{i}] has half a position")
            first = Position(ledger_id, entry_id) if ledger_id >= 0 else None
        opened.append((txn_id, first))
    return opened


def _decode_body(body: object, version: int) -> BufferSnapshot:
    keys = {"topic", "covers", "ended", "open"} | ({"writers"} if version >= 2 else set())
    if version >= 4:
        keys.add("nextBlockTxn")
    doc = statefile.obj(body, "the snapshot", keys)
    ended = _decode_ended_chunks(doc["ended"]) if version >= 3 else _decode_ended_rows(doc["ended"])
    return BufferSnapshot(
        statefile.string(doc["topic"], "topic"),
        _position(doc["covers"], "covers"),
        ended,
        _decode_open(doc["open"], version),
        _decode_writers(doc["writers"]) if version >= 2 else [],
        statefile.integer(doc["nextBlockTxn"], "nextBlockTxn", 0) if version >= 4 else 0,
    )


def read(path: Path, topic: str) -> BufferSnapshot | None:
    """The snapshot at ``path``; None if there is none. Raises SnapshotError naming the file if it is
    damaged or is not this topic's."""
    try:
        document = statefile.read(path, KIND, READABLE, remedy=REMEDY)
        if document is None:
            return None
        snapshot = _decode_body(document.body, document.version)
    except (statefile.StateFileError, statefile.StateShapeError) as exc:
        raise SnapshotError(f"transaction buffer snapshot {path} is unusable: {exc}") from exc
    if snapshot.topic != topic:
        raise SnapshotError(
            f"transaction buffer snapshot {path} belongs to topic {snapshot.topic!r}, not {topic!r}"
        )
    return snapshot
