"""What a partition's managed ledger holds: data records and transaction markers (PartitionEntry).

A marker is written when a transaction ends on the partition, so a replay after a crash knows the
outcome from the ledger itself: a transaction whose marker is durable is wholly resolved.
"""

from __future__ import annotations

from typing import NamedTuple

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.txnid import TxnID


class DecodedRecord(NamedTuple):
    """One partition entry: a message (``is_marker`` False) or a transaction marker.

    A named tuple, not a frozen dataclass: one is built for every entry dispatched or replayed, and
    a frozen dataclass's ``__init__`` (a Python-level setattr per field) cost four times as much.
    """

    is_marker: bool
    txn_id: TxnID | None
    payload: bytes = b""
    key: str = ""
    commit: bool = False  # markers only
    deadline_ms: int = 0  # markers only: the txn's timeout deadline, 0 if unknown
    # idempotent producer's send (messages) or single-routing-key block (markers); "" otherwise
    writer_id: str = ""
    first_number: int = -1  # a block's first event number; a send's sequence id
    last_number: int = -1
    # messages only: Pulsar's MessageMetadata of a message sent over Pulsar's protocol (b"" otherwise),
    # and the time the store wrote it
    metadata: bytes = b""
    publish_time_ms: int = 0


# The tags of PartitionEntry.data (field 1) and DataRecord.payload (field 1), both length-delimited.
_DATA_TAG = b"\x0a"
_PAYLOAD_TAG = b"\x0a"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_data(
    payload: bytes | memoryview,
    key: str,
    txn_id: TxnID | None,
    publish_time_ms: int,
    *,
    producer_name: str = "",
    sequence_id: int = 0,
    metadata: bytes = b"",
) -> bytes:
    """The entry of one message: exactly the bytes ``PartitionEntry(data=...).SerializeToString()``
    gives (the payload first, as field 1), assembled around the payload so that it is copied once.
    Through protobuf it was copied twice (into the field, then into the serialized entry), and a
    Pulsar producer's batch is up to 128 KiB: those copies were a fifth of a store's CPU under
    ``pulsar-perf produce``."""
    record = api.DataRecord()
    record.key = key
    record.publish_time_ms = publish_time_ms
    if metadata:
        record.pulsar_metadata = metadata
    if txn_id is not None:
        record.txn_id.most = txn_id.most
        record.txn_id.least = txn_id.least
    if producer_name:
        record.producer_name = producer_name
        record.sequence_id = sequence_id
    rest = record.SerializeToString()
    size = len(payload)
    if not size:  # proto3 leaves an empty bytes field out
        return _DATA_TAG + _varint(len(rest)) + rest
    payload_head = _PAYLOAD_TAG + _varint(size)
    return b"".join((_DATA_TAG, _varint(len(payload_head) + size + len(rest)), payload_head, payload, rest))


def encode_marker(
    txn_id: TxnID,
    commit: bool,
    deadline_ms: int = 0,
    block: tuple[str, int, int] | None = None,
) -> bytes:
    """``block``: (writer id, first, last event number) of a single-routing-key block's marker."""
    entry = api.PartitionEntry()
    marker = entry.marker
    marker.txn_id.most = txn_id.most
    marker.txn_id.least = txn_id.least
    marker.action = api.COMMIT if commit else api.ABORT
    if deadline_ms:
        marker.deadline_ms = deadline_ms
    if block is not None:
        marker.writer_id, marker.first_event_number, marker.last_event_number = block
    return entry.SerializeToString()


class CorruptRecordError(ValueError):
    """A partition entry is not a PartitionEntry (names the position)."""


def decode(data: bytes, topic: str, position: object) -> DecodedRecord:
    """Decode the entry at ``position`` of ``topic`` (named only in errors: formatting them for every
    dispatched entry was a measurable share of dispatch)."""
    entry = api.PartitionEntry()
    try:
        entry.ParseFromString(data)
    except Exception as exc:
        raise CorruptRecordError(f"entry {topic}@{position} is not a partition record: {exc}") from exc
    kind = entry.WhichOneof("body")
    if kind == "data":
        data_record = entry.data
        txn = (
            TxnID(data_record.txn_id.most, data_record.txn_id.least)
            if data_record.HasField("txn_id")
            else None
        )
        if data_record.producer_name:
            return DecodedRecord(
                False,
                txn,
                data_record.payload,
                data_record.key,
                writer_id=data_record.producer_name,
                first_number=data_record.sequence_id,
                last_number=data_record.sequence_id,
                metadata=data_record.pulsar_metadata,
                publish_time_ms=data_record.publish_time_ms,
            )
        return DecodedRecord(
            False,
            txn,
            data_record.payload,
            data_record.key,
            metadata=data_record.pulsar_metadata,
            publish_time_ms=data_record.publish_time_ms,
        )
    if kind == "marker":
        marker = entry.marker
        return DecodedRecord(
            True,
            TxnID(marker.txn_id.most, marker.txn_id.least),
            commit=marker.action == api.COMMIT,
            deadline_ms=marker.deadline_ms,
            writer_id=marker.writer_id,
            first_number=marker.first_event_number if marker.writer_id else -1,
            last_number=marker.last_event_number if marker.writer_id else -1,
        )
    raise CorruptRecordError(f"entry {topic}@{position} holds neither a message nor a marker")


def _message_record(data: bytes) -> api.DataRecord | None:
    """A message entry's record; None for a marker (or an entry that is not a partition record:
    dispatch refuses those, a time scan only passes them by)."""
    entry = api.PartitionEntry()
    try:
        entry.ParseFromString(data)
    except Exception:
        return None
    return entry.data if entry.WhichOneof("body") == "data" else None


def publish_time_ms(data: bytes) -> int | None:
    """A message entry's publish time (ms since the epoch) as the store wrote it; None for a marker."""
    record = _message_record(data)
    return None if record is None else record.publish_time_ms


def sent_time_ms(data: bytes) -> int | None:
    """A message entry's time as its producer sees it: the ``publish_time`` of Pulsar's
    MessageMetadata for a message sent over Pulsar's protocol (what its consumers read, and what
    Pulsar's seek by time compares), else the store's ``publish_time_ms``; None for a marker."""
    record = _message_record(data)
    if record is None:
        return None
    if record.pulsar_metadata:
        metadata = pulsar.MessageMetadata()
        try:
            metadata.ParseFromString(record.pulsar_metadata)
        except Exception:
            return record.publish_time_ms
        return metadata.publish_time
    return record.publish_time_ms


# Pulsar's producers batch at most a few thousand messages per entry (batchingMaxMessages, default
# 1,000); a larger count in stored metadata is refused rather than sized into ack sets.
MAX_BATCH_SIZE = 100_000


def batch_size_of(record: DecodedRecord) -> int:
    """How many messages a message entry holds: Pulsar's ``num_messages_in_batch`` for a message
    written over Pulsar's protocol, else 1."""
    if not record.metadata:
        return 1
    metadata = pulsar.MessageMetadata()
    try:
        metadata.ParseFromString(record.metadata)
    except Exception as exc:
        raise CorruptRecordError(f"a message's stored Pulsar metadata does not parse: {exc}") from exc
    size = metadata.num_messages_in_batch
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise CorruptRecordError(
            f"a message's stored Pulsar metadata says it batches {size} messages (1..{MAX_BATCH_SIZE})"
        )
    return size
