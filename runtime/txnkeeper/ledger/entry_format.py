"""The byte format of one ledger file, and the scan that checks it on open.

File  = file header (16 bytes: magic b"TKLG", u16 version 1, u16 flags 0, u64 ledger id), then records.
Record = u32 data length, u64 entry id, u32 CRC32 of the data, u32 CRC32 of those first 16 header bytes,
then the data. All little-endian. The header CRC covers the length and the entry id, the data CRC the
data, so a flipped length, id or data byte is always caught.

A torn tail is what an interrupted append leaves at the end of the file: an incomplete header, a body
running past the end, a bad data CRC on the very last record, or a zero-filled remainder. Only the
ledger that was being written may have one, and it is cut. Any other failure is a CorruptEntryError.
A process crash (SIGKILL) only ever leaves a prefix of the last write. A power loss could in principle
persist a later page of the last, unacknowledged group but not an earlier one; that shows up as a bad
record followed by good ones and is reported as corruption (safe, but it needs a human).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from .errors import CorruptEntryError

FILE_MAGIC = b"TKLG"
FILE_VERSION = 1
FILE_HEADER = struct.Struct("<4sHHQ")
RECORD_PREFIX = struct.Struct("<IQI")  # length, entry id, data crc
RECORD_HEADER = struct.Struct("<IQII")  # ... plus the CRC of the prefix
HEADER_CRC = struct.Struct("<I")
RECORD_HEADER_SIZE = RECORD_HEADER.size
MAX_ENTRY_SIZE = 64 * 1024 * 1024

_crc32 = zlib.crc32
_pack_prefix = RECORD_PREFIX.pack
_pack_crc = HEADER_CRC.pack


def file_header(ledger_id: int) -> bytes:
    return FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0, ledger_id)


def record_header(entry_id: int, data: bytes) -> bytes:
    """The 20-byte header written before ``data`` (hot path: one call per append)."""
    prefix = _pack_prefix(len(data), entry_id, _crc32(data))
    return prefix + _pack_crc(_crc32(prefix))


@dataclass
class ScanResult:
    """What a scan found: record start offsets, the valid length and whether a tail was cut."""

    offsets: array[int]
    data_bytes: int
    valid_end: int
    torn_reason: str | None


def check_file_header(data: bytes, ledger_id: int, path: Path) -> None:
    magic, version, _flags, stored_id = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        raise CorruptEntryError(ledger_id, None, path, 0, f"bad magic {magic!r}, expected {FILE_MAGIC!r}")
    if version != FILE_VERSION:
        raise CorruptEntryError(
            ledger_id, None, path, 0, f"unknown ledger file version {version} (this build reads 1)"
        )
    if stored_id != ledger_id:
        raise CorruptEntryError(ledger_id, None, path, 0, f"file header names ledger {stored_id}")


def scan(data: bytes, ledger_id: int, path: Path, *, tail_allowed: bool) -> ScanResult:
    """Check every record of a whole ledger file.

    ``tail_allowed``: this ledger was open for writing, so a torn tail is expected after a crash and
    reported (to be cut) instead of raised.
    """
    size = len(data)
    if size < FILE_HEADER.size:
        if tail_allowed:
            return ScanResult(array("q"), 0, 0, f"incomplete file header ({size} bytes)")
        raise CorruptEntryError(ledger_id, None, path, 0, f"file is only {size} bytes long")
    check_file_header(data, ledger_id, path)
    offsets = array("q")
    data_bytes = 0
    offset = FILE_HEADER.size
    entry_id = 0
    view = memoryview(data)

    def bad(reason: str, *, torn: bool) -> ScanResult:
        if torn and tail_allowed:
            return ScanResult(offsets, data_bytes, offset, f"{reason} at offset {offset}")
        raise CorruptEntryError(ledger_id, entry_id, path, offset, reason)

    while offset < size:
        if size - offset < RECORD_HEADER_SIZE:
            return bad(f"incomplete record header ({size - offset} bytes)", torn=True)
        length, stored_id, data_crc, header_crc = RECORD_HEADER.unpack_from(data, offset)
        if _crc32(view[offset : offset + RECORD_PREFIX.size]) != header_crc:
            zero_tail = not any(view[offset:])
            return bad("bad record header checksum", torn=zero_tail)
        if stored_id != entry_id:
            return bad(f"entry id {stored_id} out of sequence (expected {entry_id})", torn=False)
        if length > MAX_ENTRY_SIZE:
            return bad(f"record length {length} exceeds the maximum {MAX_ENTRY_SIZE}", torn=False)
        end = offset + RECORD_HEADER_SIZE + length
        if end > size:
            return bad(f"record body runs past the end of the file ({end} > {size})", torn=True)
        if _crc32(view[offset + RECORD_HEADER_SIZE : end]) != data_crc:
            return bad("bad data checksum", torn=end == size)
        offsets.append(offset)
        data_bytes += length
        offset = end
        entry_id += 1
    return ScanResult(offsets, data_bytes, offset, None)


def decode_records(
    chunk: bytes, first_entry_id: int, count: int, *, ledger_id: int, path: Path, base_offset: int
) -> list[bytes]:
    """Verify and split ``count`` consecutive records read from ``base_offset`` (the read path)."""
    out: list[bytes] = []
    view = memoryview(chunk)
    pos = 0
    for i in range(count):
        entry_id = first_entry_id + i
        if len(chunk) - pos < RECORD_HEADER_SIZE:
            raise CorruptEntryError(ledger_id, entry_id, path, base_offset + pos, "record cut short")
        length, stored_id, data_crc, header_crc = RECORD_HEADER.unpack_from(chunk, pos)
        if _crc32(view[pos : pos + RECORD_PREFIX.size]) != header_crc or stored_id != entry_id:
            raise CorruptEntryError(
                ledger_id, entry_id, path, base_offset + pos, "bad record header (checksum or entry id)"
            )
        start = pos + RECORD_HEADER_SIZE
        body = bytes(view[start : start + length])
        if len(body) != length or _crc32(body) != data_crc:
            raise CorruptEntryError(ledger_id, entry_id, path, base_offset + pos, "bad data checksum")
        out.append(body)
        pos = start + length
    return out
