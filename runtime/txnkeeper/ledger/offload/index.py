"""Pulsar's streaming offload index object (``${uuid}-index``, OffloadIndexBlockV2Impl), byte for byte.

Layout (big-endian):

    magic 0x3D1FB0BC (int32), index_len (int32, the whole object), data_object_length (int64),
    data_header_length (int64, =128)
    per ledger (written in ascending ledger id; any order is read, as Pulsar writes HashMap order):
        ledger_id (int64), index_entry_count (int32), ledger_metadata_len (int32),
        ledger_metadata (a serialized LedgerInfo protobuf, see ledgerinfo.py),
        index_entry_count x [first_entry_id (int64), part_id (int32), offset (int64)]

``offset`` is where the block starts in the data object (OffloadIndexBlockV2BuilderImpl sums the
previous blocks' lengths); part ids count from 1 as S3 multipart part numbers do. txnkeeper's per-block
CRC rides in the LedgerInfo's ``properties`` (Pulsar reads them as plain ledger properties), so the
index stays parseable by Pulsar.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from . import ledgerinfo
from .block import HEADER_SIZE
from .errors import OffloadFormatError
from .ledgerinfo import LedgerInfo

INDEX_MAGIC = 0x3D1FB0BC
_PREFIX = struct.Struct(">iiqq")  # magic, index_len, data_object_length, data_header_length
_LEDGER = struct.Struct(">qii")  # ledger_id, index_entry_count, ledger_metadata_len
_ENTRY = struct.Struct(">qiq")  # first_entry_id, part_id, offset


@dataclass(frozen=True)
class IndexEntry:
    """One block: where it starts in the data object and the first entry it holds."""

    ledger_id: int
    first_entry_id: int
    part_id: int
    offset: int


@dataclass(frozen=True)
class LedgerIndex:
    info: LedgerInfo
    entries: tuple[IndexEntry, ...]  # ascending first_entry_id


@dataclass(frozen=True)
class OffloadIndex:
    data_object_length: int
    data_header_length: int
    ledgers: tuple[LedgerIndex, ...]  # ascending ledger id

    def ledger(self, ledger_id: int) -> LedgerIndex | None:
        for led in self.ledgers:
            if led.info.ledger_id == ledger_id:
                return led
        return None

    def blocks(self) -> list[IndexEntry]:
        """Every block of the data object, in object order."""
        return sorted((e for led in self.ledgers for e in led.entries), key=lambda e: e.offset)

    @cached_property
    def _block_ends(self) -> dict[int, int]:
        # Computed once per (cached, immutable) index: a block ends where the next one starts.
        starts = [e.offset for e in self.blocks()]
        return dict(zip(starts, [*starts[1:], self.data_object_length], strict=True))

    def block_length(self, entry: IndexEntry) -> int:
        """A block ends where the next one starts, the last at the end of the data object."""
        return self._block_ends[entry.offset] - entry.offset


def encode(data_object_length: int, ledgers: Sequence[LedgerIndex]) -> bytes:
    body = bytearray()
    for led in sorted(ledgers, key=lambda x: x.info.ledger_id):
        meta = ledgerinfo.encode(led.info)
        body += _LEDGER.pack(led.info.ledger_id, len(led.entries), len(meta)) + meta
        for e in led.entries:
            body += _ENTRY.pack(e.first_entry_id, e.part_id, e.offset)
    index_len = _PREFIX.size + len(body)
    if index_len > 2**31 - 1:
        raise ValueError(f"index of {index_len} bytes does not fit Pulsar's int32 index_len")
    return _PREFIX.pack(INDEX_MAGIC, index_len, data_object_length, HEADER_SIZE) + bytes(body)


def decode(data: bytes) -> OffloadIndex:
    """Parse and check an index object; any inconsistency is an OffloadFormatError with its offset."""
    if len(data) < _PREFIX.size:
        raise OffloadFormatError(0, f"index needs at least {_PREFIX.size} bytes, only {len(data)} present")
    magic, index_len, data_len, header_len = _PREFIX.unpack_from(data, 0)
    if magic != INDEX_MAGIC:
        raise OffloadFormatError(
            0, f"index magic is 0x{magic & 0xFFFFFFFF:08X}, expected 0x{INDEX_MAGIC:08X}"
        )
    if index_len != len(data):
        raise OffloadFormatError(4, f"index says it is {index_len} bytes long, the object has {len(data)}")
    if header_len != HEADER_SIZE:
        raise OffloadFormatError(16, f"data header length is {header_len}, expected {HEADER_SIZE}")
    if data_len <= 0:
        raise OffloadFormatError(8, f"data object length {data_len} is not positive")
    pos = _PREFIX.size
    ledgers: list[LedgerIndex] = []
    while pos < len(data):
        if pos + _LEDGER.size > len(data):
            raise OffloadFormatError(pos, "index ends inside a ledger record")
        ledger_id, count, meta_len = _LEDGER.unpack_from(data, pos)
        # Pulsar writes ledgers in HashMap order, so any order is accepted; a repeat is not.
        if any(led.info.ledger_id == ledger_id for led in ledgers):
            raise OffloadFormatError(pos, f"ledger {ledger_id} appears twice")
        if count <= 0 or meta_len < 0:
            raise OffloadFormatError(
                pos + 8, f"ledger {ledger_id}: {count} blocks, metadata of {meta_len} bytes"
            )
        pos += _LEDGER.size
        if pos + meta_len + count * _ENTRY.size > len(data):
            raise OffloadFormatError(pos, f"ledger {ledger_id}'s record runs past the index end")
        try:
            info = ledgerinfo.decode(data[pos : pos + meta_len])
        except OffloadFormatError as exc:
            raise OffloadFormatError(
                pos + exc.offset, f"ledger {ledger_id} metadata: {exc.problem}"
            ) from None
        if info.ledger_id != ledger_id:
            raise OffloadFormatError(pos, f"ledger {ledger_id}'s metadata names ledger {info.ledger_id}")
        pos += meta_len
        entries: list[IndexEntry] = []
        for _ in range(count):
            first, part, offset = _ENTRY.unpack_from(data, pos)
            if part < 1 or offset < 0 or offset + HEADER_SIZE > data_len:
                raise OffloadFormatError(
                    pos, f"block entry (entry {first}, part {part}, offset {offset}) is invalid"
                )
            if entries and first <= entries[-1].first_entry_id:
                raise OffloadFormatError(pos, f"ledger {ledger_id}'s block entries are not ascending")
            entries.append(IndexEntry(ledger_id, first, part, offset))
            pos += _ENTRY.size
        ledgers.append(LedgerIndex(info, tuple(entries)))
    if not ledgers:
        raise OffloadFormatError(pos, "index lists no ledgers")
    offsets = sorted(e.offset for led in ledgers for e in led.entries)
    if offsets[0] != 0 or len(set(offsets)) != len(offsets):
        raise OffloadFormatError(_PREFIX.size, "block offsets do not tile the data object from 0")
    return OffloadIndex(data_len, header_len, tuple(sorted(ledgers, key=lambda x: x.info.ledger_id)))
