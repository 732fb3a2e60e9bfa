"""Pulsar producers on a store pod: a SEND becomes a write, its receipt goes out in send order.

Why its own module: a send has a small pipeline of its own (a transactional one first waits for the
coordinator's confirmation of its partition, server/pulsar_txns.py), and Pulsar's producers match
each receipt with their oldest pending send, so receipts are released strictly in order.

Deduplication (Pulsar's broker-side deduplication) is the store's idempotent producers: on a store
with them enabled, a producer's name is a session of the topic's writer table (the newest producer of
a name fences the older ones, PRODUCER_SUCCESS carries the name's last durable sequence id) and each
plain SEND is written once per (name, sequence id): a SEND whose sequence id (a batch's highest) is not
above the last written one is answered as Pulsar's broker answers a duplicate, without a write.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from txnkeeper.errors import UnavailableError
from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import encode_command
from txnkeeper.protocol.pulsar_server import PulsarSession
from txnkeeper.server.pulsar_common import (
    SCHEMA_BYTES,
    SCHEMA_STRING,
    NotAllowedError,
    T,
    new_command,
    pulsar_error,
)
from txnkeeper.topic.partition import BlockResult
from txnkeeper.topic.service import TopicService
from txnkeeper.topic.writers import WriterTable
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)


@dataclass
class Send:
    """A SEND waiting for its write: receipts go out in the order the sends came (Pulsar's producers
    match each receipt with their oldest pending send)."""

    sequence_id: int
    highest_sequence_id: int
    size: int  # bytes counted against the connection's request budget until the receipt goes out
    position: Position | None = None
    failure: BaseException | None = None
    done: bool = False
    duplicate: bool = False  # deduplicated: not written again (position: the first write's, if known)


@dataclass(frozen=True)
class Deduplication:
    """A producer's session of its name in the topic's writer table (the store's idempotent producers)."""

    key: str  # the writer table's key: the name, qualified by the connection's principal
    epoch: int
    writers: WriterTable

    def end(self) -> None:
        """The producer closed: a session that never wrote is forgotten (it holds no writer slot)."""
        self.writers.end_session(self.key, self.epoch)


@dataclass
class Producer:
    session: PulsarSession
    producer_id: int
    topic: str
    name: str
    sends: deque[Send] = field(default_factory=deque)
    deduplication: Deduplication | None = None


def txn_of(most: int, least: int, present: bool) -> TxnID | None:
    return TxnID(most, least) if present or most or least else None


def succeeded(future: asyncio.Future[None]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


class Write(NamedTuple):
    """A SEND to be written: where, what (payload, key, Pulsar metadata), in which transaction."""

    topics: TopicService
    producer: Producer
    send: Send
    message: tuple[bytes | memoryview, str, bytes]
    txn: TxnID | None


def publish(write: Write) -> None:
    payload, key, metadata = write.message
    notify = partial(written, write.producer, write.send)
    write.topics.publish_notify(write.producer.topic, payload, key, write.txn, notify, metadata=metadata)


def publish_deduplicated(write: Write, deduplication: Deduplication) -> None:
    """A plain SEND of a deduplicated producer: written unless its sequence id (a batch's highest)
    was written already."""
    payload, key, metadata = write.message
    send = write.send
    done = asyncio.ensure_future(
        write.topics.publish_idempotent(
            write.producer.topic,
            payload,
            key,
            deduplication.key,
            max(send.sequence_id, send.highest_sequence_id),
            epoch=deduplication.epoch,
            metadata=metadata,
        )
    )
    done.add_done_callback(partial(deduplicated_written, write.producer, send))


def deduplicated_written(producer: Producer, send: Send, done: asyncio.Future[BlockResult]) -> None:
    if done.cancelled():
        written(producer, send, None, UnavailableError("the server is closing"))
        return
    failure = done.exception()
    if failure is not None:
        written(producer, send, None, failure)
        return
    result = done.result()
    send.duplicate = result.duplicate
    written(producer, send, result.first_message_id, None)


def publish_registered(write: Write, registered: asyncio.Future[None]) -> None:
    """A transactional SEND whose registration the coordinator answered: written now, or failed."""
    try:
        if registered.cancelled():
            raise UnavailableError("the server is closing")
        failure = registered.exception()
        if failure is not None:
            raise failure
        publish(write)
    except Exception as exc:
        written(write.producer, write.send, None, exc)


def written(producer: Producer, send: Send, position: Position | None, failure: BaseException | None) -> None:
    send.position, send.failure, send.done = position, failure, True
    sends = producer.sends
    session = producer.session
    while sends and sends[0].done:
        head = sends.popleft()
        if session.is_open:
            session.send_frame(receipt(producer.producer_id, head))
        # After the receipt: room in the request budget handles held commands at once, and their
        # answers must not overtake it.
        session.request_ended(head.size)


# The message id Pulsar's broker answers a duplicate send with (-1:-1; the fields are uint64).
NO_MESSAGE_ID = 2**64 - 1


def receipt(producer_id: int, send: Send) -> bytes:
    if send.position is None and not send.duplicate:
        failure = send.failure or UnavailableError("the message was not written")
        error, message = pulsar_error(failure)
        answer = new_command(T.SEND_ERROR)
        answer.send_error.producer_id = producer_id
        answer.send_error.sequence_id = send.sequence_id
        answer.send_error.error = error  # type: ignore[assignment]
        answer.send_error.message = message
        return encode_command(answer)
    answer = new_command(T.SEND_RECEIPT)
    receipt = answer.send_receipt
    receipt.producer_id = producer_id
    receipt.sequence_id = send.sequence_id
    if send.highest_sequence_id:
        receipt.highest_sequence_id = send.highest_sequence_id
    if send.position is None:  # a duplicate whose first write is not remembered
        receipt.message_id.ledgerId = receipt.message_id.entryId = NO_MESSAGE_ID
    else:
        receipt.message_id.ledgerId = send.position.ledger_id
        receipt.message_id.entryId = send.position.entry_id
    return encode_command(answer)


def check_schema(body: pulsar.CommandProducer) -> None:
    if body.HasField("schema") and body.schema.type not in (SCHEMA_BYTES, SCHEMA_STRING):
        raise NotAllowedError(
            f"schema type {pulsar.Schema.Type.Name(body.schema.type)} is not served: only bytes and"
            " string (the schema registry is not implemented)"
        )
