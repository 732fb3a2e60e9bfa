"""``txnkeeper inspect-offload FILE``: decode a PIP-76 data or index object into a readable JSON report.

When a read fails with OffloadCorruptionError, or a segment written by Pulsar must be compared with
one written here, an operator downloads the object (``aws s3 cp``, or takes the file from the
filesystem driver's directory) and needs to see its blocks, entries, padding and index without writing
code. The kind is recognised by its magic number.

A data object is checked against its index (``--index``, else the ``${uuid}-index`` file beside it),
and an index against the data object beside it, with the checks the pod's reader applies
(``checks``): the data object's length, each block's length, CRC, structure, header ids and entries.
So whatever the pod refuses to serve is reported here, in the pod's words. Without an index a data
object can only be walked by its block headers: a cut on a block boundary, or a flipped bit in entry
data, cannot be seen then, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import index as index_format
from .block import BLOCK_MAGIC, HEADER_SIZE, DecodedBlock, block_crc, decode_block, decode_header
from .checks import BlockPlan, block_plans, check_block, check_index
from .errors import OffloadCorruptionError, OffloadFormatError
from .index import INDEX_MAGIC, OffloadIndex
from .writer import INDEX_SUFFIX, index_key

NO_INDEX = (
    "not checked against an index (none given with --index, no {name} beside the file): the object's "
    "length, the blocks' CRCs and the entries each must hold were not checked; pass --index"
)
NO_DATA = "no data object {name} beside the index: its length and blocks were not checked"


class InspectOffloadError(Exception):
    pass


@dataclass
class _BlockCheck:
    plan: BlockPlan
    present: bool  # the block's bytes lie (at least partly) within the data object
    crc: int | None = None
    decoded: DecodedBlock | None = None
    problem: str | None = None


def _problem(exc: OffloadCorruptionError) -> str:
    return str(exc)


def _check_segment(
    uuid: str, idx: OffloadIndex, data: bytes, require_crc: bool
) -> tuple[list[str], list[_BlockCheck]]:
    """The pod's checks (``checks``) of every block of a segment: the problems found (the index's
    first, then each block's) and what each block turned out to be."""
    problems: list[str] = []
    try:
        plans = check_index(uuid, idx, data_length=len(data), require_crc=require_crc)
    except OffloadCorruptionError as exc:
        problems.append(_problem(exc))
        # Go on block by block (a missing CRC, already reported, not again per block): which blocks
        # are still intact tells the operator what a backup must bring back.
        require_crc = False
        try:
            plans = block_plans(uuid, idx, require_crc=False)
        except OffloadCorruptionError:
            return problems, []
    view = memoryview(data)
    checks: list[_BlockCheck] = []
    for plan in plans:
        start = plan.entry.offset
        raw = view[start : start + plan.length]
        check = _BlockCheck(plan, present=len(raw) > 0)
        checks.append(check)
        if not check.present:
            check.problem = f"past the end of the data object ({len(data)} bytes)"
            continue  # the data object's length problem above says it
        check.crc = block_crc(raw)
        try:
            check.decoded = check_block(uuid, raw, plan, require_crc=require_crc)
        except OffloadCorruptionError as exc:
            check.problem = _problem(exc)
            problems.append(check.problem)
    return problems, checks


def _crc_check(check: _BlockCheck) -> str:
    expected = check.plan.crc
    if expected is None:
        return "no CRC in index"
    if check.crc is None:
        return "missing"
    return "ok" if expected == check.crc else f"MISMATCH {expected:08x}"


def _block_report(check: _BlockCheck, show_data: bool) -> dict[str, Any]:
    plan = check.plan
    report: dict[str, Any] = {
        "part_id": plan.entry.part_id,
        "offset": plan.entry.offset,
        "block_length": plan.length,
        "ledger_id": plan.entry.ledger_id,
        "first_entry_id": plan.entry.first_entry_id,
        "last_entry_id": plan.last_entry_id,
    }
    decoded = check.decoded
    if decoded is not None:
        report["last_entry_id"] = decoded.entries[-1][0]
        report["entry_count"] = len(decoded.entries)
        report["padding_bytes"] = decoded.header.block_len - decoded.data_end
    if check.crc is not None:
        report["crc32"] = f"{check.crc:08x}"
    report["crc_check"] = _crc_check(check)
    report["problem"] = check.problem
    if show_data and decoded is not None:
        report["entries"] = [{"entry_id": i, "length": len(d), "hex": d.hex()} for i, d in decoded.entries]
    return report


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


def walk_data(data: bytes, show_data: bool) -> dict[str, Any]:
    """Without an index: walk the blocks by their header lengths; stop at the first that does not
    decode."""
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
        report: dict[str, Any] = {
            "part_id": len(blocks) + 1,
            "offset": pos,
            "block_length": header.block_len,
            "ledger_id": header.ledger_id,
            "first_entry_id": header.first_entry_id,
            "last_entry_id": decoded.entries[-1][0],
            "entry_count": len(decoded.entries),
            "padding_bytes": header.block_len - decoded.data_end,
            "crc32": f"{block_crc(raw):08x}",
        }
        if show_data:
            report["entries"] = [
                {"entry_id": i, "length": len(d), "hex": d.hex()} for i, d in decoded.entries
            ]
        blocks.append(report)
        pos += header.block_len
    return {"kind": "data", "object_length": len(data), "blocks": blocks, "problem": problem}


def _result(report: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    report["problems"] = problems
    report["problem"] = problems[0] if problems else None
    return report


def _decode_index(uuid: str, raw: bytes) -> OffloadIndex:
    try:
        return index_format.decode(raw)
    except OffloadFormatError as exc:
        raise OffloadCorruptionError(uuid, None, exc.offset, exc.problem, index_key(uuid)) from None


def inspect_data_object(
    path: Path, data: bytes, index_path: Path | None, show_data: bool, require_crc: bool
) -> dict[str, Any]:
    uuid = path.name
    if index_path is None:
        beside = path.with_name(path.name + INDEX_SUFFIX)
        if not beside.is_file():
            walked = {"file": str(path), "index": None, **walk_data(data, show_data)}
            walked["unchecked"] = NO_INDEX.format(name=beside.name)
            return _result(walked, [walked["problem"]] if walked["problem"] else [])
        index_path = beside
    report: dict[str, Any] = {
        "file": str(path),
        "kind": "data",
        "index": str(index_path),
        "object_length": len(data),
    }
    try:
        idx = _decode_index(uuid, _read(index_path))
    except OffloadCorruptionError as exc:
        return _result({**report, "blocks": []}, [_problem(exc)])
    report["index_data_object_length"] = idx.data_object_length
    problems, checks = _check_segment(uuid, idx, data, require_crc)
    report["blocks"] = [_block_report(c, show_data) for c in checks]
    return _result(report, problems)


def inspect_index_object(path: Path, raw: bytes, require_crc: bool) -> dict[str, Any]:
    uuid = path.name.removesuffix(INDEX_SUFFIX)
    try:
        report: dict[str, Any] = {"file": str(path), **inspect_index(raw)}
    except OffloadFormatError as exc:
        problem = _problem(OffloadCorruptionError(uuid, None, exc.offset, exc.problem, index_key(uuid)))
        return _result({"file": str(path), "kind": "index"}, [problem])
    data_path = path.with_name(uuid)
    if not path.name.endswith(INDEX_SUFFIX) or not data_path.is_file():
        report["data_object"] = None
        report["unchecked"] = NO_DATA.format(name=data_path.name)
        return _result(report, [])
    data = _read(data_path)
    report["data_object"] = {"file": str(data_path), "object_length": len(data)}
    problems, checks = _check_segment(uuid, index_format.decode(raw), data, require_crc)
    by_offset = {c.plan.entry.offset: c for c in checks}
    for led in report["ledgers"]:
        for block in led["blocks"]:
            check = by_offset.get(block["offset"])
            if check is not None:
                block["crc_check"] = _crc_check(check)
                block["problem"] = check.problem
    return _result(report, problems)


def inspect_file(
    path: Path, index_path: Path | None = None, show_data: bool = False, *, require_crc: bool = True
) -> dict[str, Any]:
    data = _read(path)
    if len(data) < 4:
        raise InspectOffloadError(f"{path}: {len(data)} bytes is too short for a PIP-76 object")
    (magic,) = struct.unpack_from(">I", data, 0)
    if magic == INDEX_MAGIC:
        return inspect_index_object(path, data, require_crc)
    if magic == BLOCK_MAGIC:
        return inspect_data_object(path, data, index_path, show_data, require_crc)
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
        help="decode an offloaded (PIP-76) data or index object into JSON, checked as the pod reads it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, help="a data object (${uuid}) or index object (${uuid}-index)")
    parser.add_argument(
        "--index",
        type=Path,
        help="the segment's index object (default: ${uuid}-index beside FILE, if there is one)",
    )
    parser.add_argument("--show-data", action="store_true", help="include every entry's bytes in hex")
    parser.add_argument(
        "--allow-missing-crc",
        action="store_true",
        help="a segment written by Pulsar (its index records no CRCs): structural checks only",
    )
    parser.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    try:
        report = inspect_file(ns.file, ns.index, ns.show_data, require_crc=not ns.allow_missing_crc)
    except InspectOffloadError as exc:
        print(f"txnkeeper inspect-offload: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 1 if report["problems"] else 0
