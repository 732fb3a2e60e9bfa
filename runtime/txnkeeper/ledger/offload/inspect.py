"""``txnkeeper inspect-offload FILE``: decode a PIP-76 data or index object into a readable JSON report.

When a read fails with OffloadCorruptionError, or a segment written by Pulsar must be compared with
one written here, an operator downloads the object (``aws s3 cp``, or takes the file from the
filesystem driver's directory) and needs to see its blocks, entries, padding and index without writing
code. The kind is recognised by its magic number; ``--index`` checks a data object's blocks against the
CRCs an index records.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

from . import index as index_format
from .block import BLOCK_MAGIC, HEADER_SIZE, block_crc, decode_block, decode_header
from .errors import OffloadFormatError
from .index import INDEX_MAGIC


class InspectOffloadError(Exception):
    pass


def inspect_index(data: bytes) -> dict[str, Any]:
    idx = index_format.decode(data)
    return {
        "kind": "index",
        "index_length": len(data),
        "data_object_length": idx.data_object_length,
        "data_header_length": idx.data_header_length,
        "ledgers": [
            {
                "ledger_id": led.info.ledger_id,
                "entries": led.info.entries,
                "size": led.info.size,
                "timestamp": led.info.timestamp,
                "properties": dict(led.info.properties),
                "blocks": [
                    {
                        "first_entry_id": e.first_entry_id,
                        "part_id": e.part_id,
                        "offset": e.offset,
                        "length": idx.block_length(e),
                    }
                    for e in led.entries
                ],
            }
            for led in idx.ledgers
        ],
    }


def inspect_data(data: bytes, crcs: dict[int, int] | None, show_data: bool) -> dict[str, Any]:
    """Walk the blocks by their header lengths; stop at the first one that does not decode."""
    blocks: list[dict[str, Any]] = []
    pos = 0
    problem: str | None = None
    while pos < len(data):
        try:
            header = decode_header(data[pos : pos + HEADER_SIZE])
            raw = data[pos : pos + header.block_len]
            decoded = decode_block(raw)
        except OffloadFormatError as exc:
            problem = f"at object offset {pos + exc.offset}: {exc.problem}"
            break
        crc = block_crc(raw)
        part = len(blocks) + 1
        report: dict[str, Any] = {
            "part_id": part,
            "offset": pos,
            "block_length": header.block_len,
            "ledger_id": header.ledger_id,
            "first_entry_id": header.first_entry_id,
            "last_entry_id": decoded.entries[-1][0],
            "entry_count": len(decoded.entries),
            "padding_bytes": header.block_len - decoded.data_end,
            "crc32": f"{crc:08x}",
        }
        if crcs is not None:
            expected = crcs.get(part)
            report["crc_check"] = (
                "no CRC in index"
                if expected is None
                else ("ok" if expected == crc else f"MISMATCH {expected:08x}")
            )
        if show_data:
            report["entries"] = [
                {"entry_id": i, "length": len(d), "hex": d.hex()} for i, d in decoded.entries
            ]
        blocks.append(report)
        pos += header.block_len
    return {"kind": "data", "object_length": len(data), "blocks": blocks, "problem": problem}


def inspect_file(path: Path, index_path: Path | None = None, show_data: bool = False) -> dict[str, Any]:
    data = _read(path)
    if len(data) < 4:
        raise InspectOffloadError(f"{path}: {len(data)} bytes is too short for a PIP-76 object")
    (magic,) = struct.unpack_from(">I", data, 0)
    try:
        if magic == INDEX_MAGIC:
            return {"file": str(path), **inspect_index(data)}
        if magic == BLOCK_MAGIC:
            crcs: dict[int, int] | None = None
            if index_path is not None:
                idx = index_format.decode(_read(index_path))
                crcs = {}
                for led in idx.ledgers:
                    crcs.update(led.info.block_crcs())
            return {"file": str(path), **inspect_data(data, crcs, show_data)}
    except OffloadFormatError as exc:
        raise InspectOffloadError(f"{index_path or path}: not a valid index: {exc}") from None
    raise InspectOffloadError(
        f"{path}: magic 0x{magic:08X} is neither a PIP-76 data block (0x{BLOCK_MAGIC:08X}) "
        f"nor an index (0x{INDEX_MAGIC:08X}); pass the object ${{uuid}} or ${{uuid}}-index"
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InspectOffloadError(f"{path}: cannot read: {exc.strerror or exc}") from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inspect-offload",
        help="decode an offloaded (PIP-76) data or index object into JSON",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, help="a data object (${uuid}) or index object (${uuid}-index)")
    parser.add_argument("--index", type=Path, help="the segment's index object, to check each block's CRC")
    parser.add_argument("--show-data", action="store_true", help="include every entry's bytes in hex")
    parser.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        report = inspect_file(ns.file, ns.index, ns.show_data)
    except InspectOffloadError as exc:
        print(f"txnkeeper inspect-offload: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    bad = report.get("problem") or any(
        str(b.get("crc_check", "ok")).startswith("MISMATCH") for b in report.get("blocks", [])
    )
    return 1 if bad else 0
