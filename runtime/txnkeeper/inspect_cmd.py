"""``txnkeeper inspect``: decode one transaction-log or pending-ack entry into JSON.

Operators need to see what a position holds when a downgrade is blocked ("ledger 7 entry 12 is still
batched: whose records are those?") or when a store refuses to open. The entry comes from a stopped
pod's data directory (``--data-dir --log --position``) or as raw bytes (``--hex`` / ``--file``); the
output says whether it is batched, its batch version and size, and every set field of every record.

Read-only by construction: a stored entry is read through the ledger's read-only view (files opened
O_RDONLY, no lock, no recovery, torn tails reported instead of cut), so inspecting a volume never
changes it. A record that cannot be decoded (bad framing, truncated varint, invalid UTF-8 in a string
field, a proto2 required field missing) is reported in its place with what is wrong, and the command
exits non-zero: the entry is evidence to look at, not data to trust.
"""

from __future__ import annotations

import argparse
import binascii
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from txnkeeper.bufferedwriter.codec import (
    BATCH_HEADER_SIZE,
    BATCH_VERSION,
    PENDING_ACK_CODEC,
    TXN_LOG_CODEC,
    EntryDecodeError,
    RecordCodec,
    UnknownBatchVersionError,
    batch_version,
)
from txnkeeper.ledger import LedgerError, Position
from txnkeeper.ledger.readonly import is_batch_index_deleted, open_read_only

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
    errors = [r for r in report["records"] if "error" in r]
    for record in errors:
        print(f"txnkeeper inspect: record {record['index']}: {record['error']}", file=sys.stderr)
    if errors:
        print(
            f"txnkeeper inspect: {len(errors)} of {len(report['records'])} records could not be decoded; "
            "the entry is corrupt or not a record of this kind (check --kind)",
            file=sys.stderr,
        )
        return 1
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
        data, stored = read_stored_entry(ns.data_dir, ns.log, position)
        report.update({"log": ns.log, "position": str(position), **stored})
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


def read_stored_entry(data_dir: Path, log_name: str, position: Position) -> tuple[bytes, dict[str, Any]]:
    """The entry's bytes, and per cursor whether it (or which of its batch indexes) is deleted.

    Through the ledger's read-only view: nothing in ``data_dir`` is created, locked or rewritten.
    """
    try:
        view = open_read_only(data_dir, log_name)
        data = view.read_entry(position)
    except LedgerError as exc:
        raise InspectError(str(exc)) from None
    except ValueError as exc:  # a --log that cannot be a managed-ledger name
        raise InspectError(f"--log {log_name!r}: {exc}") from None
    except OSError as exc:
        raise InspectError(f"cannot read managed ledger {log_name!r} in {data_dir}: {exc}") from None
    batch_size = count_batch(data)
    stored: dict[str, Any] = {
        "cursors": {
            name: {
                "entryDeleted": state.is_deleted(position),
                "deletedBatchIndexes": [
                    i for i in range(batch_size) if is_batch_index_deleted(state, position, i)
                ],
            }
            for name, state in sorted(view.cursors.items())
        }
    }
    if view.torn_tails:
        stored["tornTails"] = view.torn_tails
    return data, stored


def count_batch(data: bytes) -> int:
    """Records in a batched entry (0 for an unbatched or unreadable one), to list deleted indexes."""
    try:
        return len(split_batch(data)) if batch_version(data) == BATCH_VERSION else 0
    except (EntryDecodeError, InspectError):
        return 0


def decode_report(data: bytes, codec: RecordCodec[Any]) -> dict[str, Any]:
    """What an entry holds: format, batch version and size, and every record's fields.

    A record that does not decode is listed as {"index": i, "error": why}; the caller exits non-zero.
    """
    try:
        version = batch_version(data)
        if version is not None and version != BATCH_VERSION:
            raise UnknownBatchVersionError(version)
    except EntryDecodeError as exc:
        raise InspectError(f"{exc} (first bytes: {data[:8].hex() or 'none'})") from None
    batched = version is not None
    raws = split_batch(data) if batched else [data]
    records: list[dict[str, Any]] = []
    for index, raw in enumerate(raws):
        try:
            fields = record_json(parse_record(codec, raw, index if batched else None))
        except RecordDecodeError as exc:
            records.append({"index": index, "error": str(exc)})
            continue
        records.append({"index": index, **fields} if batched else fields)
    return {
        "sizeBytes": len(data),
        "batched": batched,
        "batchVersion": version,
        "batchSize": len(raws) if batched else 0,
        "records": records,
    }


class RecordDecodeError(ValueError):
    """One record of an entry cannot be decoded; the message says which field and why."""


def split_batch(data: bytes) -> list[bytes]:
    """The serialized records of a batched entry: each framed as tag 0x0A, varint length, bytes."""
    records: list[bytes] = []
    pos = BATCH_HEADER_SIZE
    while pos < len(data):
        if data[pos] != 0x0A:
            raise InspectError(
                f"batched entry of {len(data)} bytes: byte {pos} is tag 0x{data[pos]:02x}, expected 0x0a "
                f"(record {len(records)}); the entry is corrupt"
            )
        length, body = _varint(data, pos + 1, what=f"length of record {len(records)}")
        if body + length > len(data):
            raise InspectError(
                f"batched entry of {len(data)} bytes: record {len(records)} at byte {pos} claims {length} "
                f"bytes, only {len(data) - body} remain; the entry is truncated or corrupt"
            )
        records.append(data[body : body + length])
        pos = body + length
    return records


def _varint(data: bytes, pos: int, *, what: str) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise InspectError(f"truncated or overlong varint ({what}) at byte {start}; the entry is corrupt")


def parse_record(codec: RecordCodec[Any], raw: bytes, index: int | None) -> Message:
    """One record, parsed and checked for proto2 required fields (protobuf's parser accepts both)."""
    name = codec.record_type.__name__
    try:
        record: Message = codec.record_type.FromString(raw)
    except DecodeError as exc:
        raise RecordDecodeError(
            f"{len(raw)} bytes are not a valid {name} ({exc}: e.g. a truncated varint or length); "
            f"first bytes {raw[:8].hex() or 'none'}"
        ) from None
    missing: list[str] = record.FindInitializationErrors()  # type: ignore[attr-defined]
    if missing:
        raise RecordDecodeError(
            f"{name} lacks required field(s) {', '.join(missing)}; txnkeeper never writes such a record, "
            "so the entry is corrupt or from another log"
        )
    return record


def record_json(record: Message, path: str = "") -> dict[str, Any]:
    """Every set field by its proto name; enums by name; 64-bit numbers as JSON numbers.

    Raises RecordDecodeError for a string field holding invalid UTF-8 (protobuf hands such a proto2
    string over as bytes).
    """
    out: dict[str, Any] = {}
    for field, value in record.ListFields():
        where = f"{path}{field.name}"
        if field.is_repeated:
            out[field.name] = [_value(field, v, f"{where}[{i}]") for i, v in enumerate(value)]
        else:
            out[field.name] = _value(field, value, where)
    if "txnid_most_bits" in out or "txnid_least_bits" in out:
        out["txnId"] = f"({out.get('txnid_most_bits', 0)},{out.get('txnid_least_bits', 0)})"
    return out


def _value(field: FieldDescriptor, value: Any, where: str) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return record_json(value, f"{where}.")
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if isinstance(value, bytes):
        if field.type == FieldDescriptor.TYPE_STRING:
            raise RecordDecodeError(
                f"string field {where} is not valid UTF-8 (bytes {value[:32].hex()}); the entry is "
                "corrupt or was not written by txnkeeper"
            )
        return value.hex()
    return value
