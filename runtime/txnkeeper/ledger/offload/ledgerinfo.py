"""Pulsar's ``ManagedLedgerInfo.LedgerInfo`` protobuf, hand-encoded for the PIP-76 index.

Pulsar's streaming index stores, per ledger, a serialized ``LedgerInfo`` (MLDataFormats.proto:
``ledgerId=1, entries=2, size=3, timestamp=4, offloadContext=5, properties=6`` with
``KeyValue{key=1, value=2}``). Encoding it by hand keeps the exact bytes under this module's control
(golden vectors in tests) without adding a generated module for a six-field message. The per-block CRC
that txnkeeper adds travels as ``properties`` entries, which Pulsar's parser reads as ordinary ledger
properties: an index written here stays readable by Pulsar's ``OffloadIndexBlockV2Impl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import OffloadFormatError

# Properties key prefix of the per-block CRC: f"{CRC_PROPERTY_PREFIX}{part_id}" -> 8 lowercase hex digits
# of the CRC-32 (zlib/IEEE) of the whole block (header, entries and padding).
CRC_PROPERTY_PREFIX = "txnkeeper.block.crc32.part-"

_WIRE_VARINT = 0
_WIRE_I64 = 1
_WIRE_LEN = 2
_WIRE_I32 = 5


@dataclass(frozen=True)
class LedgerInfo:
    """The fields of Pulsar's LedgerInfo that an offload index carries (offloadContext is not written)."""

    ledger_id: int
    entries: int | None = None
    size: int | None = None
    timestamp: int | None = None
    properties: tuple[tuple[str, str], ...] = field(default=())

    @property
    def last_entry_id(self) -> int | None:
        """Pulsar's CompatibleMetadata reads the ledger's last entry id as ``entries - 1``."""
        return None if self.entries is None else self.entries - 1

    def block_crcs(self) -> dict[int, int]:
        """The CRC-32 of each block (by part id) recorded in this ledger's properties."""
        out: dict[int, int] = {}
        for key, value in self.properties:
            if key.startswith(CRC_PROPERTY_PREFIX):
                suffix = key[len(CRC_PROPERTY_PREFIX) :]
                if not suffix.isdigit() or len(value) != 8:
                    raise OffloadFormatError(0, f"malformed CRC property {key}={value!r}")
                try:
                    out[int(suffix)] = int(value, 16)
                except ValueError:
                    raise OffloadFormatError(0, f"malformed CRC property {key}={value!r}") from None
        return out


def crc_property(part_id: int, crc: int) -> tuple[str, str]:
    return (f"{CRC_PROPERTY_PREFIX}{part_id}", f"{crc:08x}")


def _varint(value: int) -> bytes:
    # int64 fields encode negatives as their 64-bit two's complement (10 bytes), as protobuf-java does.
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, _WIRE_LEN) + _varint(len(payload)) + payload


def encode(info: LedgerInfo) -> bytes:
    """Serialize in field-number order, as protobuf-java's ``toByteArray`` does."""
    out = bytearray(_tag(1, _WIRE_VARINT) + _varint(info.ledger_id))
    for number, optional in ((2, info.entries), (3, info.size), (4, info.timestamp)):
        if optional is not None:
            out += _tag(number, _WIRE_VARINT) + _varint(optional)
    for key, value in info.properties:
        kv = _length_delimited(1, key.encode()) + _length_delimited(2, value.encode())
        out += _length_delimited(6, kv)
    return bytes(out)


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        result = 0
        shift = 0
        while True:
            if self.pos >= len(self.data):
                raise OffloadFormatError(self.pos, "LedgerInfo ends inside a varint")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 70:
                raise OffloadFormatError(self.pos, "LedgerInfo varint longer than 10 bytes")
        result &= (1 << 64) - 1
        return result - (1 << 64) if result >= 1 << 63 else result

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise OffloadFormatError(self.pos, f"LedgerInfo field of {n} bytes runs past its end")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def skip(self, wire: int) -> None:
        if wire == _WIRE_VARINT:
            self.varint()
        elif wire == _WIRE_I64:
            self.take(8)
        elif wire == _WIRE_LEN:
            self.take(self.varint())
        elif wire == _WIRE_I32:
            self.take(4)
        else:
            raise OffloadFormatError(self.pos, f"LedgerInfo has an unsupported wire type {wire}")


def _decode_key_value(data: bytes) -> tuple[str, str]:
    cur = _Cursor(data)
    key = value = None
    while cur.pos < len(data):
        tag = cur.varint()
        number, wire = tag >> 3, tag & 7
        if number in (1, 2) and wire == _WIRE_LEN:
            raw = cur.take(cur.varint())
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                raise OffloadFormatError(cur.pos, "LedgerInfo property is not UTF-8") from None
            if number == 1:
                key = text
            else:
                value = text
        else:
            cur.skip(wire)
    if key is None or value is None:
        raise OffloadFormatError(0, "LedgerInfo property lacks its required key or value")
    return key, value


def decode(data: bytes) -> LedgerInfo:
    """Parse a LedgerInfo; unknown fields (offloadContext, later additions) are skipped like protobuf does."""
    cur = _Cursor(data)
    ints: dict[int, int] = {}
    props: list[tuple[str, str]] = []
    while cur.pos < len(data):
        start = cur.pos
        tag = cur.varint()
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise OffloadFormatError(start, "LedgerInfo has a field number 0")
        if number in (1, 2, 3, 4) and wire == _WIRE_VARINT:
            ints[number] = cur.varint()
        elif number == 6 and wire == _WIRE_LEN:
            props.append(_decode_key_value(cur.take(cur.varint())))
        else:
            cur.skip(wire)
    if 1 not in ints:
        raise OffloadFormatError(0, "LedgerInfo lacks its required ledgerId")
    return LedgerInfo(
        ledger_id=ints[1],
        entries=ints.get(2),
        size=ints.get(3),
        timestamp=ints.get(4),
        properties=tuple(props),
    )
