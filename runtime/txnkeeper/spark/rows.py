"""Turning a topic's stored entries into the data source's rows, as a consumer would see the topic.

Why one module: the rule of what a reader may see is the transaction buffer's (``topic.subscription``
dispatch): markers are never messages; a message of an aborted transaction is never returned; a
message of an open transaction is not readable yet, and neither is anything after it (the planner
never reads past the max read position, so such a message here means the picture changed under the
reader: refused, never guessed). A Pulsar batch (an entry holding ``num_messages_in_batch`` messages)
is split into one row per message with its batch index (after undoing the producer's compression,
codecs.py); a message sent without batching has batch index -1, as Pulsar's MessageId. Pure
functions, used by the executors and by the offload audit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.spark.codecs import CompressedPayloadError, decompress
from txnkeeper.topic.records import CorruptRecordError, DecodedRecord, decode
from txnkeeper.txnid import TxnID

SCHEMA = (
    "topic STRING, partition INT, ledgerId BIGINT, entryId BIGINT, batchIndex INT, "
    "publishTime TIMESTAMP, producerName STRING, key STRING, properties MAP<STRING, STRING>, "
    "payload BINARY, txnId STRING, txnState STRING"
)
_BATCH_SIZE = struct.Struct(">I")
Row = tuple[object, ...]


class TopicDataError(ValueError):
    """An entry cannot be turned into rows (names topic and position); no row of it is returned."""


@dataclass(frozen=True, slots=True)
class Visibility:
    """What the read may show: ``aborted``/``open`` transactions as the store's buffer had them."""

    aborted: frozenset[TxnID]
    open: frozenset[TxnID]
    committed_only: bool = True
    min_publish_ms: int | None = None
    max_publish_ms: int | None = None

    def state(self, txn: TxnID | None) -> str | None:
        if txn is None:
            return None
        if txn in self.aborted:
            return "aborted"
        return "open" if txn in self.open else "committed"


@lru_cache(maxsize=1024)
def partition_index(topic: str) -> int:
    """Pulsar's partition index of a partitioned topic's partition (``...-partition-N``), else -1."""
    head, sep, tail = topic.rpartition("-partition-")
    return int(tail) if sep and head and tail.isascii() and tail.isdecimal() else -1


def entry_rows(topic: str, ledger_id: int, entry_id: int, data: bytes, vis: Visibility) -> Iterator[Row]:
    """The rows of one stored entry (none for a marker or an invisible message)."""
    where = f"{topic}@{ledger_id}:{entry_id}"
    try:
        record = decode(data, topic, f"{ledger_id}:{entry_id}")
    except CorruptRecordError as exc:
        raise TopicDataError(f"{exc}; no row of it was returned") from exc
    if record.is_marker:
        return
    state = vis.state(record.txn_id)
    if vis.committed_only and state == "aborted":
        return
    if vis.committed_only and state == "open":
        raise TopicDataError(
            f"entry {where} belongs to transaction {record.txn_id}, open when the read was planned, yet lies "
            "before the planned max read position: the topic changed under the read; run it again"
        )
    txn = str(record.txn_id) if record.txn_id is not None else None
    # A message sent over txnkeeper's own protocol is one message: a tuple, not a generator, for it.
    messages: Iterable[_Message] = (
        ((-1, record.publish_time_ms, record.writer_id or None, record.key or None, {}, record.payload),)
        if not record.metadata
        else _messages(record, where)
    )
    base = (topic, partition_index(topic), ledger_id, entry_id)
    for batch_index, publish_ms, producer, key, properties, payload in messages:
        if vis.min_publish_ms is not None and publish_ms < vis.min_publish_ms:
            continue
        if vis.max_publish_ms is not None and publish_ms > vis.max_publish_ms:
            continue
        yield (
            *base,
            batch_index,
            _publish_time(publish_ms),
            producer,
            key,
            properties,
            payload,
            txn,
            state,
        )


# Messages written in the same millisecond share it (a batch always does): one datetime for them.
@lru_cache(maxsize=4096)
def _publish_time(publish_ms: int) -> datetime:
    return datetime.fromtimestamp(publish_ms / 1000, UTC)


_Message = tuple[int, int, str | None, str | None, dict[str, str], bytes]


def _messages(record: DecodedRecord, where: str) -> Iterator[_Message]:
    """The messages of an entry sent over Pulsar's protocol (one, or a batch's)."""
    meta = pulsar.MessageMetadata()
    try:
        meta.ParseFromString(record.metadata)
    except Exception as exc:
        raise TopicDataError(f"entry {where}: its Pulsar metadata does not parse: {exc}") from exc
    properties = {kv.key: kv.value for kv in meta.properties}
    key = meta.partition_key or record.key or None
    producer = meta.producer_name or record.writer_id or None
    try:
        payload = decompress(record.payload, meta, where)
    except CompressedPayloadError as exc:
        raise TopicDataError(str(exc)) from None
    if not meta.HasField("num_messages_in_batch"):
        yield (-1, meta.publish_time, producer, key, properties, payload)
        return
    yield from _batch(payload, meta, producer, where)


def _batch(
    payload: bytes, meta: pulsar.MessageMetadata, producer: str | None, where: str
) -> Iterator[_Message]:
    view = memoryview(payload)
    pos = 0
    count = meta.num_messages_in_batch
    for index in range(count):
        if len(payload) - pos < _BATCH_SIZE.size:
            raise TopicDataError(f"entry {where}: batch ends inside message {index} of {count}")
        (size,) = _BATCH_SIZE.unpack_from(payload, pos)
        pos += _BATCH_SIZE.size
        single = pulsar.SingleMessageMetadata()
        try:
            single.ParseFromString(bytes(view[pos : pos + size]))
        except Exception as exc:
            raise TopicDataError(f"entry {where}: metadata of batch message {index} does not parse") from exc
        pos += size
        end = pos + single.payload_size
        if size == 0 or end > len(payload):
            raise TopicDataError(f"entry {where}: batch message {index} of {count} runs past the entry")
        properties = {kv.key: kv.value for kv in single.properties}
        key = single.partition_key or None
        yield (index, meta.publish_time, producer, key, properties, bytes(view[pos:end]))
        pos = end
    if pos != len(payload):
        raise TopicDataError(f"entry {where}: {len(payload) - pos} bytes follow the batch's {count} messages")
