"""How a single-routing-key block's events travel inside AppendBlock chunks (contracts §10).

Why one module: the client encodes and the store decodes the same bytes, and the CRC that proves the
store got every chunk is computed over exactly this encoding. Each event is ``[len: u32 big-endian]
[payload]``; ``total_bytes`` is the length of the whole encoding and ``crc`` its ``zlib.crc32``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class EncodedBlock:
    data: bytes
    event_count: int
    total_bytes: int
    crc: int


class BlockEncodingError(ValueError):
    """The block's bytes do not match what AppendBlockEnd declared (the message says how)."""


def encode_events(events: Iterable[bytes]) -> EncodedBlock:
    parts: list[bytes] = []
    count = 0
    for payload in events:
        parts.append(_LEN.pack(len(payload)))
        parts.append(bytes(payload))
        count += 1
    data = b"".join(parts)
    return EncodedBlock(data, count, len(data), zlib.crc32(data))


def chunks(data: bytes, chunk_size: int) -> list[bytes]:
    """``data`` cut into AppendBlock-sized pieces (at least one, possibly empty)."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
    return [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] or [b""]


def decode_events(data: bytes, event_count: int, total_bytes: int, crc: int) -> list[bytes]:
    """The block's event payloads; raises BlockEncodingError when anything does not match."""
    if len(data) != total_bytes:
        raise BlockEncodingError(
            f"block holds {len(data)} bytes but AppendBlockEnd declared total_bytes {total_bytes};"
            " a chunk was lost or duplicated: resend the whole block"
        )
    actual = zlib.crc32(data)
    if actual != crc:
        raise BlockEncodingError(
            f"block crc32 is {actual:#010x} but AppendBlockEnd declared {crc:#010x}; resend the whole block"
        )
    events: list[bytes] = []
    offset = 0
    view = memoryview(data)
    while offset < len(data):
        if offset + 4 > len(data):
            raise BlockEncodingError(f"event {len(events)} is cut off in its length header at byte {offset}")
        (size,) = _LEN.unpack_from(data, offset)
        offset += 4
        if offset + size > len(data):
            raise BlockEncodingError(
                f"event {len(events)} declares {size} bytes at byte {offset}"
                f" but the block ends at {len(data)}"
            )
        events.append(bytes(view[offset : offset + size]))
        offset += size
    if len(events) != event_count:
        raise BlockEncodingError(
            f"block encodes {len(events)} events but AppendBlockEnd declared event_count {event_count}"
        )
    return events
