"""Pulsar consumers on a store pod: MESSAGE frames for a subscription's deliveries, the metadata of
messages written by txnkeeper's own protocol, and where a reader starts."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import encode_command, encode_payload_command
from txnkeeper.protocol.pulsar_server import NO_REQUEST, PulsarSession
from txnkeeper.server.pulsar_common import T, new_command
from txnkeeper.topic.records import DecodedRecord
from txnkeeper.topic.subscription import Subscription

log = logging.getLogger(__name__)


class PulsarConsumer:
    """A Pulsar consumer as a subscription sees it: MESSAGE frames over its connection."""

    __slots__ = (
        "_session",
        "client_consumer_id",
        "consumer_id",
        "on_detach",
        "reader",
        "subscription",
        "topic",
    )
    _ids = itertools.count(1 << 40)  # apart from PodHandler's endpoints, which share subscriptions

    def __init__(
        self, session: PulsarSession, client_consumer_id: int, topic: str, subscription: Subscription
    ) -> None:
        self._session = session
        self.consumer_id = next(PulsarConsumer._ids)
        self.client_consumer_id = client_consumer_id
        self.topic = topic
        self.subscription = subscription
        self.reader = False  # a non-durable subscription of its own, closed with the consumer
        # Called when the subscription drops it (detach): its connection forgets it.
        self.on_detach: Callable[[PulsarConsumer], None] | None = None

    @property
    def ready(self) -> bool:
        return self._session.ready_for_push()

    def deliver(
        self,
        position: Position,
        record: DecodedRecord,
        redelivery_count: int,
        ack_set: list[int] | None = None,
    ) -> None:
        command = new_command(T.MESSAGE)
        message = command.message
        message.consumer_id = self.client_consumer_id
        message.message_id.ledgerId = position.ledger_id
        message.message_id.entryId = position.entry_id
        if redelivery_count:
            message.redelivery_count = redelivery_count
        if ack_set is not None:
            message.ack_set.extend(ack_set)
        metadata = record.metadata or metadata_of(record)
        self._session.push_frame(encode_payload_command(command, metadata, record.payload))

    def detach(self) -> bool:
        # As Pulsar's broker after resetting a cursor: CLOSE_CONSUMER (no request of the client's),
        # and the client subscribes again, from the new position.
        command = new_command(T.CLOSE_CONSUMER)
        command.close_consumer.consumer_id = self.client_consumer_id
        command.close_consumer.request_id = NO_REQUEST
        self._session.push_frame(encode_command(command))
        if self.on_detach is not None:
            self.on_detach(self)
        return True

    def read_failed(self, after: Position | None, message: str) -> None:
        # Pulsar's protocol has no push for "the next entries cannot be read": the consumer waits
        # (nothing wrong is served) and the pod's log, metrics and offload status say why.
        log.warning("Pulsar consumer %d of %s: %s", self.client_consumer_id, self.topic, message)


def metadata_of(record: DecodedRecord) -> bytes:
    """MessageMetadata for a message written by txnkeeper's own protocol (it has none stored)."""
    metadata = pulsar.MessageMetadata()
    metadata.producer_name = record.writer_id or "txnkeeper"
    metadata.sequence_id = max(record.first_number, 0)
    metadata.publish_time = record.publish_time_ms
    if record.key:
        metadata.partition_key = record.key
    return metadata.SerializeToString()


# MessageIdData's uint64 fields carry Java's longs: -1 (MessageId.earliest, "no message") wraps to
# 2^64-1, Long.MAX_VALUE (MessageId.latest) is 2^63-1.
NO_POSITION = 2**64 - 1


LATEST_POSITION = 2**63 - 1


def reader_start(body: pulsar.CommandSubscribe, from_latest: bool) -> tuple[Position | None, bool]:
    """Where a reader starts: (deliver what comes after this position, or from the first entry when
    None; or from the latest entry on)."""
    if not body.HasField("start_message_id"):
        return None, from_latest
    start = body.start_message_id
    if start.ledgerId == NO_POSITION:
        return None, False
    if start.ledgerId >= LATEST_POSITION:
        return None, True
    # A batch's message: its entry again (the client skips the messages before it); else after it.
    entry = start.entryId - 1 if start.batch_index >= 0 else start.entryId
    return Position(start.ledgerId, entry), False
