"""The transaction buffer snapshot of one partition (Pulsar's __transaction_buffer_snapshot idea).

Without it a restarted store replays every live entry of every topic to learn which transactions
ended how; with it, recovery loads the ended (committed and aborted) transactions with their marker
positions, the open ones, and the position the snapshot covers, then replays only the entries after
that position. Recovery time then grows with the traffic since the last snapshot, not with the
retained data.

Since version 2 it also carries the topic's writer state (single-routing-key writers and idempotent
producers, txnkeeper.topic.writers), like Pulsar's pulsar.dedup cursor properties: the markers and
records it was rebuilt from may since have been trimmed, so this copy is what keeps dedup working
across trims. Version 1 files (no writers) are still read.

The snapshot is a checksummed state file (txnkeeper.statefile), replaced atomically. It is derivable
from the ledger, so one that is damaged, of another topic, or ahead of the ledger is never used: the
partition logs a WARNING naming the file and what was wrong, and rebuilds by a full replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from txnkeeper import statefile
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.position import Position
from txnkeeper.topic.txnbuffer import EndedTxn as EndedTxn  # noqa: PLC0414 (re-exported: what a snapshot lists)
from txnkeeper.txnid import TxnID

KIND = "txn-buffer-snapshot"
VERSION = 2
READABLE = frozenset({1, 2})
REMEDY = "it is rebuilt from the topic's ledger by a full replay; nothing needs to be done"


# [writer id, last number, last block's first number, its first MessageId's ledger and entry id (-1:
# unknown), last active ms]
WriterRow = tuple[str, int, int, int, int, int]


@dataclass(frozen=True)
class BufferSnapshot:
    """The transaction buffer's state once every entry up to and including ``covers`` was applied."""

    topic: str
    covers: Position
    ended: list[EndedTxn]  # in marker order
    open: list[TxnID]
    writers: list[WriterRow] = field(default_factory=list)


class SnapshotError(ValueError):
    """A snapshot file that must not be used (the message names the file and the problem)."""


def snapshot_path(directory: Path, topic: str) -> Path:
    return directory / f"{encode_name(topic, 'topic')}.snapshot"


def encode_body(snapshot: BufferSnapshot) -> dict[str, object]:
    return {
        "topic": snapshot.topic,
        "covers": [snapshot.covers.ledger_id, snapshot.covers.entry_id],
        # Unpacked in the loop header: one row per ended transaction, and there may be many.
        "ended": [
            [most, least, 1 if committed else 0, ledger_id, entry_id, deadline_ms]
            for (most, least), committed, (ledger_id, entry_id), deadline_ms in snapshot.ended
        ],
        "open": [[t.most, t.least] for t in snapshot.open],
        "writers": [list(row) for row in snapshot.writers],
    }


def write(path: Path, snapshot: BufferSnapshot) -> None:
    """Durably replace the snapshot at ``path`` (temporary file, fsync, rename, fsync directory)."""
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


def _decode_body(body: object, version: int) -> BufferSnapshot:
    keys = {"topic", "covers", "ended", "open"} | ({"writers"} if version >= 2 else set())
    doc = statefile.obj(body, "the snapshot", keys)
    ended: list[EndedTxn] = []
    for i, row in enumerate(statefile.array(doc["ended"], "ended")):
        fields = statefile.array(row, f"ended[{i}]")
        if len(fields) != 6:
            raise statefile.StateShapeError(f"ended[{i}] must have 6 fields, has {len(fields)}")
        most, least, committed, ledger_id, entry_id, deadline = (
            statefile.integer(f, f"ended[{i}]", 0) for f in fields
        )
        ended.append(EndedTxn(TxnID(most, least), bool(committed), Position(ledger_id, entry_id), deadline))
    opened: list[TxnID] = []
    for i, row in enumerate(statefile.array(doc["open"], "open")):
        fields = statefile.array(row, f"open[{i}]")
        if len(fields) != 2:
            raise statefile.StateShapeError(f"open[{i}] must be [most, least]")
        opened.append(TxnID(statefile.integer(fields[0], "open", 0), statefile.integer(fields[1], "open", 0)))
    return BufferSnapshot(
        statefile.string(doc["topic"], "topic"),
        _position(doc["covers"], "covers"),
        ended,
        opened,
        _decode_writers(doc["writers"]) if version >= 2 else [],
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
