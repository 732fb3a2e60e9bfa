"""``txnkeeper inspect``: decode one transaction-log or pending-ack entry into JSON.

Operators need to see what a position holds when a downgrade is blocked ("ledger 7 entry 12 is still
batched: whose records are those?") or when a store refuses to open. The entry comes from a stopped
pod's data directory (``--data-dir --log --position``) or as raw bytes (``--hex`` / ``--file``); the
output says whether it is batched, its batch version and size, and every set field of every record.
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from txnkeeper.bufferedwriter.codec import (
    PENDING_ACK_CODEC,
    TXN_LOG_CODEC,
    EntryDecodeError,
    RecordCodec,
    batch_version,
)
from txnkeeper.ledger import LedgerError, LedgerLockedError, ManagedLedgerFactory, Position

KINDS = ("txnlog", "pendingack")


class InspectError(Exception):
    """A problem with what the user asked to inspect; the message says what to do."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="decode a transaction-log or pending-ack entry into JSON",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        help="record type; inferred from --log when it is a txnkeeper log name",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hex", help="the entry's bytes in hex (spaces and colons allowed)")
    source.add_argument("--file", type=Path, help="a file holding exactly the entry's bytes")
    source.add_argument("--position", help="ledgerId:entryId of a stored entry (needs --data-dir and --log)")
    parser.add_argument("--data-dir", type=Path, help="the data directory (PV) holding the managed ledgers")
    parser.add_argument("--log", help="managed ledger name, e.g. __transaction_log_0")
    parser.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        report = inspect(ns)
    except InspectError as exc:
        print(f"txnkeeper inspect: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0


def inspect(ns: argparse.Namespace) -> dict[str, Any]:
    """Build the JSON report for the parsed arguments (raises InspectError with a fix-it message)."""
    kind = ns.kind or infer_kind(ns.log)
    if kind is None:
        raise InspectError(
            "say which records the entry holds: --kind txnlog or --kind pendingack"
            " (it can only be inferred from a --log name ending in __transaction_pending_ack"
            " or starting with __transaction_log_)"
        )
    report: dict[str, Any] = {"kind": kind}
    if ns.position is not None:
        if ns.data_dir is None or ns.log is None:
            raise InspectError("--position needs --data-dir and --log to find the entry")
        try:
            position = Position.parse(ns.position)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        if not ns.data_dir.is_dir():
            raise InspectError(f"--data-dir {ns.data_dir} is not a directory")
        data, cursors = asyncio.run(read_stored_entry(ns.data_dir, ns.log, position))
        report.update({"log": ns.log, "position": str(position), "cursors": cursors})
    elif ns.hex is not None:
        cleaned = "".join(ch for ch in ns.hex if ch not in " :\n\t")
        try:
            data = binascii.unhexlify(cleaned)
        except (binascii.Error, ValueError) as exc:
            raise InspectError(f"--hex is not valid hexadecimal ({exc}); pass e.g. 0e0100010a02...") from None
    else:
        try:
            data = ns.file.read_bytes()
        except OSError as exc:
            raise InspectError(f"cannot read --file {ns.file}: {exc.strerror or exc}") from None
    report.update(decode_report(data, PENDING_ACK_CODEC if kind == "pendingack" else TXN_LOG_CODEC))
    return report


def infer_kind(log_name: str | None) -> str | None:
    if log_name is None:
        return None
    if log_name.endswith("__transaction_pending_ack"):
        return "pendingack"
    if log_name.startswith("__transaction_log_"):
        return "txnlog"
    return None


async def read_stored_entry(
    data_dir: Path, log_name: str, position: Position
) -> tuple[bytes, dict[str, Any]]:
    """The entry's bytes, and per cursor whether it (or which of its batch indexes) is deleted."""
    factory = ManagedLedgerFactory(data_dir, io_threads=1)
    try:
        names = factory.list_names()
        if log_name not in names:
            raise InspectError(
                f"no managed ledger {log_name!r} in {data_dir}; present: {', '.join(names) or 'none'}"
            )
        try:
            ledger = await factory.open(log_name)
            data = await ledger.read_entry(position)
        except LedgerLockedError as exc:
            raise InspectError(f"{exc}; inspect a copy of the directory, or stop the pod first") from None
        except LedgerError as exc:
            raise InspectError(str(exc)) from None
        batch_size = count_batch(data)
        cursors = {
            name: {
                "entryDeleted": cursor.is_deleted(position),
                "deletedBatchIndexes": [
                    i for i in range(batch_size) if cursor.is_batch_index_deleted(position, i)
                ],
            }
            for name, cursor in sorted(ledger.cursors().items())
        }
        return data, cursors
    finally:
        await factory.close()


def count_batch(data: bytes) -> int:
    """Records in a batched entry (0 for an unbatched or unreadable one), to list deleted indexes."""
    try:
        return TXN_LOG_CODEC.decode_entry(data).batch_size if batch_version(data) == 1 else 0
    except EntryDecodeError:
        return 0


def decode_report(data: bytes, codec: RecordCodec[Any]) -> dict[str, Any]:
    """What an entry holds: format, batch version and size, and every record's fields."""
    try:
        version = batch_version(data)
        decoded = codec.decode_entry(data)
    except EntryDecodeError as exc:
        raise InspectError(f"{exc} (first bytes: {data[:8].hex() or 'none'})") from None
    return {
        "sizeBytes": len(data),
        "batched": decoded.batched,
        "batchVersion": version,
        "batchSize": decoded.batch_size,
        "records": [
            {"index": i, **record_json(record)} if decoded.batched else record_json(record)
            for i, record in enumerate(decoded.records)
        ],
    }


def record_json(record: Message) -> dict[str, Any]:
    """Every set field by its proto name; enums by name; 64-bit numbers as JSON numbers."""
    out: dict[str, Any] = {}
    for field, value in record.ListFields():
        if field.is_repeated:
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    if "txnid_most_bits" in out or "txnid_least_bits" in out:
        out["txnId"] = f"({out.get('txnid_most_bits', 0)},{out.get('txnid_least_bits', 0)})"
    return out


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return record_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    return value
