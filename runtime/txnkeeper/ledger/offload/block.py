"""Pulsar's streaming data block (PIP-76), byte for byte, plus txnkeeper's per-block CRC.

Layout (big-endian, as Java's DataOutput writes; StreamingDataBlockHeaderImpl, BufferedOffloadStream):

    header (128 bytes): magic 0x26A66D32 (int32), header_len (int64, =128), block_len (int64),
                        first_entry_id (int64), ledger_id (int64), zero padding to 128
    entries:            [entry_len int32][entry_id int64][entry bytes], consecutive entry ids
    padding:            0xFE 0xDC 0xDE 0xAD repeated (restarting at the first padding byte) to block_len

A block holds entries of one ledger. Its length is ``max(maxBlockSize, 128 + 12*n + payload)``, as in
Pulsar's ``calculateBlockSize``. The padding's first byte (0xFE) makes the next "entry length" negative,
which is how a reader knows the entries ended. The CRC (zlib CRC-32 over the whole block) is not in the
block: it is recorded in the index (see ``ledgerinfo.CRC_PROPERTY_PREFIX``), so blocks stay Pulsar's.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import OffloadFormatError

BLOCK_MAGIC = 0x26A66D32
HEADER_SIZE = 128
ENTRY_HEADER_SIZE = 4 + 8
PADDING = bytes((0xFE, 0xDC, 0xDE, 0xAD))
MAX_ENTRY_SIZE = 2**31 - 1

_HEADER = struct.Struct(">iqqqq")  # magic, header_len, block_len, first_entry_id, ledger_id
_ENTRY_HEADER = struct.Struct(">iq")  # entry_len, entry_id


@dataclass(frozen=True)
class BlockHeader:
    header_len: int
    block_len: int
    first_entry_id: int
    ledger_id: int


@dataclass(frozen=True)
class DecodedBlock:
    header: BlockHeader
    entries: tuple[tuple[int, bytes], ...]  # (entry_id, data)
    data_end: int  # offset in the block where padding starts


def block_size_for(max_block_size: int, entry_count: int, payload_bytes: int) -> int:
    """Pulsar's BufferedOffloadStream.calculateBlockSize: blocks are at least maxBlockSize long."""
    return max(max_block_size, HEADER_SIZE + entry_count * ENTRY_HEADER_SIZE + payload_bytes)


def padding(length: int) -> bytes:
    reps, rest = divmod(length, len(PADDING))
    return PADDING * reps + PADDING[:rest]


def encode_header(header: BlockHeader) -> bytes:
    packed = _HEADER.pack(
        BLOCK_MAGIC, header.header_len, header.block_len, header.first_entry_id, header.ledger_id
    )
    return packed + bytes(HEADER_SIZE - len(packed))


def encode_block(ledger_id: int, entries: Sequence[tuple[int, bytes]], max_block_size: int) -> bytes:
    """One block of ``entries`` ((entry_id, data), consecutive ids) of ``ledger_id``."""
    if not entries:
        raise ValueError("a block holds at least one entry")
    payload = sum(len(data) for _, data in entries)
    block_len = block_size_for(max_block_size, len(entries), payload)
    out = bytearray(encode_header(BlockHeader(HEADER_SIZE, block_len, entries[0][0], ledger_id)))
    for entry_id, data in entries:
        out += _ENTRY_HEADER.pack(len(data), entry_id)
        out += data
    out += padding(block_len - len(out))
    return bytes(out)


def frame_entry(out: bytearray, entry_id: int, data: bytes | memoryview) -> None:
    """Append one entry in block framing (``[entry_len][entry_id][data]``) to ``out``."""
    out += _ENTRY_HEADER.pack(len(data), entry_id)
    out += data


def assemble_block(
    ledger_id: int, first_entry_id: int, framed: bytes | bytearray, max_block_size: int
) -> bytes:
    """The block whose entries ``framed`` holds already framed (``frame_entry``): header, entries,
    padding; byte for byte what ``encode_block`` makes of the same entries, with no per-entry work, so
    a streaming writer frames entries as they arrive and keeps no per-entry objects alive (a block is
    thousands of entries; holding them as tuples made the cyclic GC stall the event loop)."""
    if not framed:
        raise ValueError("a block holds at least one entry")
    block_len = max(max_block_size, HEADER_SIZE + len(framed))
    header = encode_header(BlockHeader(HEADER_SIZE, block_len, first_entry_id, ledger_id))
    return b"".join((header, framed, padding(block_len - HEADER_SIZE - len(framed))))


def block_crc(block: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(block) & 0xFFFFFFFF


def seal_block(ledger_id: int, first_entry_id: int, block: bytearray, max_block_size: int) -> int:
    """Complete, in place, a block whose entries were framed after HEADER_SIZE reserved bytes: header
    and padding written, as ``assemble_block`` makes it; returns its CRC. No copy of the entries (a
    multi-MiB memcpy holds the GIL for its whole length); zlib releases the GIL while it CRCs."""
    block_len = max(max_block_size, len(block))
    block[:HEADER_SIZE] = encode_header(BlockHeader(HEADER_SIZE, block_len, first_entry_id, ledger_id))
    block += padding(block_len - len(block))
    return block_crc(block)


def decode_header(data: bytes | memoryview) -> BlockHeader:
    if len(data) < HEADER_SIZE:
        raise OffloadFormatError(0, f"block header needs {HEADER_SIZE} bytes, only {len(data)} present")
    magic, header_len, block_len, first_entry_id, ledger_id = _HEADER.unpack_from(data, 0)
    if magic != BLOCK_MAGIC:
        raise OffloadFormatError(
            0, f"block magic is 0x{magic & 0xFFFFFFFF:08X}, expected 0x{BLOCK_MAGIC:08X}"
        )
    if header_len != HEADER_SIZE:
        raise OffloadFormatError(4, f"block header length is {header_len}, expected {HEADER_SIZE}")
    if block_len < HEADER_SIZE:
        raise OffloadFormatError(12, f"block length {block_len} is shorter than its header")
    if first_entry_id < 0 or ledger_id < 0:
        raise OffloadFormatError(
            20, f"negative ids in block header (ledger {ledger_id}, entry {first_entry_id})"
        )
    return BlockHeader(header_len, block_len, first_entry_id, ledger_id)


def decode_block(data: bytes | memoryview) -> DecodedBlock:
    """Decode a whole block; any deviation (framing, ids, padding) is an OffloadFormatError at its offset."""
    view = memoryview(data)
    header = decode_header(view)
    if header.block_len != len(view):
        raise OffloadFormatError(12, f"block header says {header.block_len} bytes, the block has {len(view)}")
    pos = header.header_len
    entries: list[tuple[int, bytes]] = []
    expected_id = header.first_entry_id
    while pos + ENTRY_HEADER_SIZE <= len(view):
        entry_len, entry_id = _ENTRY_HEADER.unpack_from(view, pos)
        if entry_len < 0:
            break  # the padding's 0xFE start reads as a negative length: entries ended
        if entry_id != expected_id:
            raise OffloadFormatError(pos + 4, f"entry id {entry_id} where {expected_id} was expected")
        if pos + ENTRY_HEADER_SIZE + entry_len > len(view):
            raise OffloadFormatError(pos, f"entry {entry_id} of {entry_len} bytes runs past the block end")
        start = pos + ENTRY_HEADER_SIZE
        entries.append((entry_id, bytes(view[start : start + entry_len])))
        pos = start + entry_len
        expected_id += 1
    if not entries:
        raise OffloadFormatError(header.header_len, "block holds no entries")
    tail = bytes(view[pos:])  # bytes compare with memcmp; a memoryview compares item by item
    if tail != padding(len(tail)):
        bad = next(i for i in range(len(tail)) if tail[i] != PADDING[i % len(PADDING)])
        raise OffloadFormatError(pos + bad, "block padding is not the 0xFEDCDEAD pattern")
    return DecodedBlock(header, tuple(entries), pos)
