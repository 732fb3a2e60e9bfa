"""The PIP-160 batched entry format, byte-compatible with Pulsar, and the record codecs of both logs.

A batched entry is ``0E 01`` (magic) ``00 01`` (version 1) followed by a serialized
``Batched*Entry`` whose only field (1) repeats the records. Anything not starting with the magic is
one unbatched record (the old format); one ledger holds both kinds. No record can start with ``0E``:
that byte would be field 1 with wire type 6, which protobuf does not have, so the peek is unambiguous.

Encoding is the hot path of the buffered writer, so batches are built by joining records that were
serialized once, each framed as tag ``0x0A`` + varint length + bytes: exactly what protobuf itself
emits for a repeated message field 1 (the tests prove byte equality).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, EncodeError, Message

from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pb import TransactionPendingAck_pb2 as pa

BATCH_MAGIC = 0x0E01
BATCH_VERSION = 1
BATCH_HEADER = struct.pack(">HH", BATCH_MAGIC, BATCH_VERSION)
BATCH_HEADER_SIZE = len(BATCH_HEADER)
_MAGIC_BYTES = BATCH_HEADER[:2]
# Field 1, wire type 2 (length-delimited): the tag of every record inside a batch message.
_RECORD_TAG = 0x0A
# The smallest framed record: tag + one-byte length (+ zero-length body).
MIN_FRAMED_RECORD_SIZE = 2

R = TypeVar("R", bound=Message)


class EntryDecodeError(ValueError):
    """An entry's bytes are not a record (or batch of records) of the expected log."""


class UnknownBatchVersionError(EntryDecodeError):
    """An entry carries the batch magic but a version this build cannot read."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"batched entry has version {version}, but this build reads batch version {BATCH_VERSION} only;"
            " upgrade txnkeeper to a release that knows this version before reading this log"
        )
        self.version = version


class RecordEncodeError(ValueError):
    """A record cannot be serialized (typically a required protobuf field is missing)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Frame prefixes (tag + varint length) for every length a typical record has, built once.
FRAME_PREFIX_CACHE_LIMIT = 1 << 14
FRAME_PREFIXES: tuple[bytes, ...] = tuple(
    bytes((_RECORD_TAG,)) + _varint(n) for n in range(FRAME_PREFIX_CACHE_LIMIT)
)


def frame_prefix(size: int) -> bytes:
    """Tag 0x0A and the varint length that precede a record of ``size`` bytes inside a batch."""
    if size < FRAME_PREFIX_CACHE_LIMIT:
        return FRAME_PREFIXES[size]
    return bytes((_RECORD_TAG,)) + _varint(size)


def frame_record(serialized: bytes) -> bytes:
    """Return ``serialized`` as protobuf encodes it inside a batch: tag 0x0A, varint length, bytes."""
    return frame_prefix(len(serialized)) + serialized


def encode_framed(framed: Iterable[bytes]) -> bytes:
    """Join records already passed through :func:`frame_record` into one batched entry."""
    return BATCH_HEADER + b"".join(framed)


def encode_batch(records: Iterable[Message | bytes]) -> bytes:
    """Encode records (messages, or their serialized bytes) as one PIP-160 batched entry."""
    return encode_framed(frame_record(r if isinstance(r, bytes) else serialize_record(r)) for r in records)


def serialize_record(record: Message) -> bytes:
    """Serialize ``record``, turning protobuf's terse failure into one that says what to fix."""
    try:
        return record.SerializeToString()
    except EncodeError as exc:
        raise RecordEncodeError(
            f"cannot serialize {type(record).__name__}: {exc}; set every required field before writing"
        ) from exc


def is_batched(data: bytes | bytearray | memoryview) -> bool:
    """True if ``data`` starts with the batch magic (whatever its version)."""
    return bytes(data[:2]) == _MAGIC_BYTES


def batch_version(data: bytes | bytearray | memoryview) -> int | None:
    """The batch version of a batched entry, ``None`` for an unbatched one."""
    if not is_batched(data):
        return None
    if len(data) < BATCH_HEADER_SIZE:
        raise EntryDecodeError(
            f"entry of {len(data)} bytes starts with the batch magic but is shorter than the"
            f" {BATCH_HEADER_SIZE}-byte batch header: the entry is truncated or corrupt"
        )
    version: int = struct.unpack_from(">H", data, 2)[0]
    return version


@dataclass(frozen=True, slots=True)
class DecodedEntry(Generic[R]):
    """The records of one ledger entry; ``batched`` says which format the entry used."""

    batched: bool
    records: list[R]

    @property
    def batch_size(self) -> int:
        """Records in the batch, 0 for an unbatched entry (as WritePosition reports it)."""
        return len(self.records) if self.batched else 0


class RecordCodec(Generic[R]):
    """How one log's records and batches are (de)serialized: a record type and its batch message."""

    def __init__(self, kind: str, record_type: type[R], batch_type: type[Message], batch_field: str) -> None:
        self.kind = kind
        self.record_type = record_type
        self.batch_type = batch_type
        self.batch_field = batch_field

    def serialize(self, record: R) -> bytes:
        """Serialize one record (the unbatched entry format)."""
        if not isinstance(record, self.record_type):
            raise TypeError(
                f"the {self.kind} log stores {self.record_type.__name__} records, not {type(record).__name__}"
            )
        return serialize_record(record)

    def parse_record(self, data: bytes) -> R:
        """Parse one unbatched record."""
        try:
            return self.record_type.FromString(data)
        except DecodeError as exc:
            raise EntryDecodeError(
                f"entry of {len(data)} bytes is not a valid {self.record_type.__name__}"
                f" ({exc}); is this really a {self.kind} log?"
            ) from exc

    def decode_entry(self, data: bytes) -> DecodedEntry[R]:
        """Decode a ledger entry of either format (peek the magic, check the version)."""
        version = batch_version(data)
        if version is None:
            return DecodedEntry(batched=False, records=[self.parse_record(data)])
        if version != BATCH_VERSION:
            raise UnknownBatchVersionError(version)
        try:
            batch = self.batch_type.FromString(data[BATCH_HEADER_SIZE:])
        except DecodeError as exc:
            raise EntryDecodeError(
                f"batched entry of {len(data)} bytes is not a valid {self.batch_type.__name__}"
                f" ({exc}); the entry is corrupt or from another log"
            ) from exc
        records: list[R] = list(getattr(batch, self.batch_field))
        return DecodedEntry(batched=True, records=records)

    def encode_batch(self, records: Sequence[R]) -> bytes:
        """Encode records of this log as one batched entry."""
        return encode_framed(frame_record(self.serialize(r)) for r in records)


TXN_LOG_CODEC: RecordCodec[tm.TransactionMetadataEntry] = RecordCodec(
    "txnlog", tm.TransactionMetadataEntry, tm.BatchedTransactionMetadataEntry, "transaction_logs"
)
PENDING_ACK_CODEC: RecordCodec[pa.PendingAckMetadataEntry] = RecordCodec(
    "pendingack", pa.PendingAckMetadataEntry, pa.BatchedPendingAckMetadataEntry, "pending_ack_logs"
)


def decode_entry(data: bytes, codec: RecordCodec[R]) -> DecodedEntry[R]:
    """Decode a ledger entry of ``codec``'s log (module-level spelling of ``codec.decode_entry``)."""
    return codec.decode_entry(data)
