"""The body of the admin API's ``GET /admin/v1/topics/entries``: a range of one ledger's entries.

Why binary: a bulk reader fetches megabytes per request; JSON with base64 would grow them by a third
and cost a decode per byte. The body is a header (magic ``b"TKEF"``, u16 version 1, u64 ledger id,
u64 first entry id, u32 count, u64 durable entries of that ledger) then ``count`` records of u32 length
and the entry's bytes, as stored (the reader decodes them). Little-endian. ``decode`` checks all of it:
a short, long or inconsistent body is an EntryFramesError, never entries.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"TKEF"
VERSION = 1
_HEADER = struct.Struct("<4sHQQIQ")
_LENGTH = struct.Struct("<I")
CONTENT_TYPE = "application/x-txnkeeper-entries"


class EntryFramesError(ValueError):
    """A body that is not a valid entry range (names what is wrong)."""


@dataclass(frozen=True, slots=True)
class EntryRange:
    ledger_id: int
    first_entry_id: int
    durable_entries: int  # of the ledger when it was read: where a reader of its tail stops
    entries: list[bytes]


def encode(ledger_id: int, first_entry_id: int, durable_entries: int, entries: Sequence[bytes]) -> bytes:
    parts = [_HEADER.pack(MAGIC, VERSION, ledger_id, first_entry_id, len(entries), durable_entries)]
    for data in entries:
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode(body: bytes) -> EntryRange:
    if len(body) < _HEADER.size:
        raise EntryFramesError(f"entry range body is {len(body)} bytes, shorter than its header")
    magic, version, ledger_id, first, count, durable = _HEADER.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION:
        raise EntryFramesError(f"not an entry range body (magic {magic!r}, version {version})")
    view = memoryview(body)
    pos = _HEADER.size
    entries: list[bytes] = []
    for i in range(count):
        if len(body) - pos < _LENGTH.size:
            raise EntryFramesError(f"entry range body ends inside record {i} of {count}")
        (length,) = _LENGTH.unpack_from(body, pos)
        pos += _LENGTH.size
        if len(body) - pos < length:
            raise EntryFramesError(f"record {i} of {count} runs past the end of the body")
        entries.append(bytes(view[pos : pos + length]))
        pos += length
    if pos != len(body):
        raise EntryFramesError(f"{len(body) - pos} bytes follow the last of {count} records")
    if first + count > durable:
        raise EntryFramesError(f"entries {first}..{first + count - 1} lie past the durable {durable}")
    return EntryRange(ledger_id, first, durable, entries)
