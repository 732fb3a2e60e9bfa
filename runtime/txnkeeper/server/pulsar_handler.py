"""Pulsar's binary protocol on a pod: what unmodified Pulsar clients send, served by the topics (store
pods) and the transaction coordinators (coordinator pods, through server/pulsar_coordinator.py).

Why a handler of its own beside ``PodHandler``: Pulsar's commands differ in shape (a producer and a
consumer are opened by id and then addressed by it; receipts name the producer's sequence id; a
message carries Pulsar's MessageMetadata, kept verbatim with it), but they act on the same
``TopicService``: a message sent by a Pulsar producer is read by txnkeeper's own consumers and the
other way round (docs/pulsar-protocol.md).

Every command is checked before it acts (docs/pulsar-protocol.md, "Hostile input"): nothing but
CONNECT before CONNECT, ids unique per connection, names by the one topic-name rule, a SEND whose
checksum does not match its bytes is refused with ChecksumError and nothing is written. What is not
served yet is answered with Pulsar's NotAllowedError and a message saying so, never left unanswered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from google.protobuf.message import DecodeError

from txnkeeper import __version__
from txnkeeper.errors import BadRequestError, NotServedHereError, UnavailableError
from txnkeeper.ledger.ackset import full_mask, words_to_mask
from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.auth import UnauthorizedError
from txnkeeper.protocol.clientauth import ClientTokenKey
from txnkeeper.protocol.pulsar_frames import (
    DEFAULT_MAX_MESSAGE_SIZE,
    PulsarFrame,
    encode_command,
)
from txnkeeper.protocol.pulsar_server import (
    NO_REQUEST,
    PulsarResult,
    PulsarSession,
    error_command,
    frame_size,
)
from txnkeeper.server.pulsar_common import (
    MAX_PERMITS,
    SCHEMA_BYTES,
    SCHEMA_STRING,
    SERVER_PROTOCOL_VERSION,
    ChecksumError,
    NotAllowedError,
    T,
    log_failure,
    new_command,
    pulsar_error,
    success,
)
from txnkeeper.server.pulsar_consumers import LATEST_POSITION, NO_POSITION, PulsarConsumer, reader_start
from txnkeeper.server.pulsar_coordinator import (
    PulsarCoordinators,
    response_error,
)
from txnkeeper.server.pulsar_placement import PulsarPlacement, coordinator_partition, tls_url
from txnkeeper.server.pulsar_sends import (
    Deduplication,
    Producer,
    Send,
    Write,
    check_schema,
    publish,
    publish_deduplicated,
    publish_registered,
    succeeded,
    txn_of,
)
from txnkeeper.server.pulsar_txns import TxnRegistrations
from txnkeeper.topic.ports import IndexAck
from txnkeeper.topic.records import MAX_BATCH_SIZE
from txnkeeper.topic.service import TopicService, validate_name
from txnkeeper.topic.writers import validate_writer_id, writer_key
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)


@dataclass
class _Connection:
    """What the handler keeps per Pulsar connection."""

    protocol_version: int = -1  # -1: CONNECT not received yet
    principal: str = ""
    producers: dict[int, Producer] = field(default_factory=dict)
    consumers: dict[int, PulsarConsumer] = field(default_factory=dict)


class PulsarPodHandler:
    """The ``PulsarHandler`` of a pod: a store pod serves producers and consumers, a coordinator pod
    transactions; lookups on any pod name the pod that serves the topic or coordinator."""

    def __init__(
        self,
        topics: TopicService | None,
        coordinators: PulsarCoordinators,
        placement: PulsarPlacement,
        own_url: Callable[[], str],
        *,
        store_url_of: Callable[[str], str | None] | None = None,
        registrations: TxnRegistrations | None = None,
        client_key: ClientTokenKey | None = None,
        pod_name: str = "txnkeeper",
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        """``own_url``: this pod's Pulsar URL (lookups answer it when no URLs are configured);
        ``registrations``: how a store pod confirms a transaction's partitions with its coordinator."""
        self._topics = topics
        self._coordinators = coordinators
        self._placement = placement
        self._own_url = own_url
        # The owner's URL by the pod's placement record (docs/contracts.md §12); None: the flags' rule.
        self._store_url_of = store_url_of or (lambda _topic: None)
        self._registrations = registrations
        self._client_key = client_key
        self._pod_name = pod_name
        self._max_message_size = max_message_size
        self._connections: dict[int, _Connection] = {}
        self._producer_names = itertools.count()
        self._routes: dict[int, Callable[[PulsarSession, _Connection, PulsarFrame], PulsarResult]] = {
            T.PING: self._ping,
            T.PONG: self._pong,
            T.PARTITIONED_METADATA: self._partitioned_metadata,
            T.LOOKUP: self._lookup,
            T.PRODUCER: self._producer,
            T.SEND: self._send,
            T.CLOSE_PRODUCER: self._close_producer,
            T.SUBSCRIBE: self._subscribe,
            T.FLOW: self._flow,
            T.ACK: self._ack,
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._redeliver,
            T.CLOSE_CONSUMER: self._close_consumer,
            T.UNSUBSCRIBE: self._unsubscribe,
            T.SEEK: self._seek,
            T.GET_LAST_MESSAGE_ID: self._last_message_id,
            T.TC_CLIENT_CONNECT_REQUEST: self._tc_connect,
            T.NEW_TXN: self._new_txn,
            T.ADD_PARTITION_TO_TXN: self._add_partitions,
            T.ADD_SUBSCRIPTION_TO_TXN: self._add_subscriptions,
            T.END_TXN: self._end_txn,
        }

    # --- PulsarHandler -------------------------------------------------------------------------------
    def handle(self, session: PulsarSession, frame: PulsarFrame) -> PulsarResult:
        command = frame.command
        connection = self._connections.get(session.session_id)
        if command.type == T.CONNECT:
            return self._connect(session, connection, command.connect)
        if connection is None:
            session.close_for_protocol(
                f"{T.Type.Name(command.type) if command.type in T.Type.values() else command.type}"
                " before CONNECT: a Pulsar connection starts with CONNECT"
            )
            return None
        route = self._routes.get(command.type)
        if route is None:
            raise NotAllowedError(_unsupported(command.type))
        return route(session, connection, frame)

    def error_reply(self, frame: PulsarFrame, exc: BaseException) -> bytes | None:
        error, message = pulsar_error(exc)
        command = frame.command
        kind = command.type
        if kind == T.SEND:
            answer = new_command(T.SEND_ERROR)
            answer.send_error.producer_id = command.send.producer_id
            answer.send_error.sequence_id = command.send.sequence_id
            answer.send_error.error = error  # type: ignore[assignment]
            answer.send_error.message = message
            return encode_command(answer)
        if kind == T.PARTITIONED_METADATA:
            answer = new_command(T.PARTITIONED_METADATA_RESPONSE)
            response = answer.partitionMetadataResponse
            response.request_id = command.partitionMetadata.request_id
            response.response = pulsar.CommandPartitionedTopicMetadataResponse.Failed
            response.error = error  # type: ignore[assignment]
            response.message = message
            return encode_command(answer)
        if kind == T.LOOKUP:
            answer = new_command(T.LOOKUP_RESPONSE)
            lookup = answer.lookupTopicResponse
            lookup.request_id = command.lookupTopic.request_id
            lookup.response = pulsar.CommandLookupTopicResponse.Failed
            lookup.error = error  # type: ignore[assignment]
            lookup.message = message
            return encode_command(answer)
        transactional = _txn_response(command, error, message)
        if transactional is not None:
            return transactional
        if kind == T.ACK:
            if not command.ack.HasField("request_id"):
                log.warning("a Pulsar ack without a request id failed: %s", message)
                return None
            answer = new_command(T.ACK_RESPONSE)
            ack_response = answer.ackResponse
            ack_response.consumer_id = command.ack.consumer_id
            ack_response.request_id = command.ack.request_id
            ack_response.error = error  # type: ignore[assignment]
            ack_response.message = message
            return encode_command(answer)
        request_id = _request_id(command)
        if request_id is None:  # FLOW, PING...: nothing to answer; the failure is logged
            log.warning("Pulsar %s failed: %s", T.Type.Name(kind), message)
            return None
        return encode_command(error_command(request_id, error, message))

    def session_closed(self, session: PulsarSession) -> None:
        self._coordinators.session_closed(session.session_id)
        connection = self._connections.pop(session.session_id, None)
        if connection is None:
            return
        for consumer in connection.consumers.values():
            self._release(consumer)
        for producer in connection.producers.values():
            if producer.deduplication is not None:
                producer.deduplication.end()

    def topics_closed(self, topics: set[str]) -> None:
        """These topics were closed here (their shard is fenced for a move or served elsewhere):
        CLOSE_PRODUCER / CLOSE_CONSUMER to their clients, as Pulsar's broker does when it unloads a
        bundle; the clients look the topic up again and reconnect to its owner."""
        for connection in self._connections.values():
            for producer_id, producer in list(connection.producers.items()):
                if producer.topic not in topics:
                    continue
                del connection.producers[producer_id]
                if producer.deduplication is not None:
                    producer.deduplication.end()
                command = new_command(T.CLOSE_PRODUCER)
                command.close_producer.producer_id = producer_id
                command.close_producer.request_id = NO_REQUEST
                producer.session.push_frame(encode_command(command))
            for consumer in list(connection.consumers.values()):
                if consumer.topic in topics:
                    consumer.subscription.remove_consumer(consumer.consumer_id)
                    consumer.detach()  # CLOSE_CONSUMER, and the connection forgets it

    def _release(self, consumer: PulsarConsumer) -> None:
        consumer.subscription.remove_consumer(consumer.consumer_id)
        self._close_reader(consumer)

    def _close_reader(self, consumer: PulsarConsumer) -> None:
        """A reader's subscription is its own: it goes with its consumer."""
        if consumer.reader and self._topics is not None:
            closing = asyncio.ensure_future(self._topics.close_reader(consumer.subscription))
            closing.add_done_callback(partial(log_failure, f"closing a reader of {consumer.topic}"))

    def session_holds_state(self, session: PulsarSession) -> bool:
        connection = self._connections.get(session.session_id)
        return connection is not None and bool(connection.consumers or connection.producers)

    def session_writable(self, session: PulsarSession) -> None:
        connection = self._connections.get(session.session_id)
        if connection is not None:
            for consumer in connection.consumers.values():
                consumer.subscription.notify()

    # --- connection ------------------------------------------------------------------------------
    def _connect(
        self, session: PulsarSession, connection: _Connection | None, body: pulsar.CommandConnect
    ) -> PulsarResult:
        if connection is not None:
            session.close_for_protocol("a second CONNECT on one connection")
            return None
        principal = ""
        if self._client_key is not None:
            if body.auth_method_name != "token" or not body.auth_data:
                answer = error_command(
                    0,
                    pulsar.AuthenticationError,
                    "this server authenticates clients with tokens: configure the client with"
                    " AuthenticationToken (auth method 'token')",
                )
                session.send_frame(encode_command(answer))
                session.close_for_protocol("CONNECT without a token")
                return None
            try:
                token = body.auth_data.decode("utf-8", "replace")
                principal = self._client_key.principal_of(token, time.time())
            except UnauthorizedError as exc:
                session.send_frame(encode_command(error_command(0, pulsar.AuthenticationError, str(exc))))
                session.close_for_protocol(f"CONNECT with a token that does not check: {exc}")
                return None
        version = min(max(body.protocol_version, 0), SERVER_PROTOCOL_VERSION)
        self._connections[session.session_id] = _Connection(version, principal)
        answer = new_command(T.CONNECTED)
        answer.connected.server_version = f"txnkeeper-{__version__}"
        answer.connected.protocol_version = version
        answer.connected.max_message_size = self._max_message_size
        answer.connected.feature_flags.SetInParent()
        return encode_command(answer)

    def _ping(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        return encode_command(new_command(T.PONG))

    def _pong(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        return None

    # --- lookup ----------------------------------------------------------------------------------
    def _partitioned_metadata(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        body = frame.command.partitionMetadata
        validate_name("topic", body.topic)
        answer = new_command(T.PARTITIONED_METADATA_RESPONSE)
        response = answer.partitionMetadataResponse
        response.request_id = body.request_id
        # One partition per transaction coordinator for the coordinator-assign topic (Pulsar's
        # clients find coordinator c as its partition c), the configured count for partitioned topics.
        response.partitions = self._placement.partitions(body.topic)
        response.response = pulsar.CommandPartitionedTopicMetadataResponse.Success
        return encode_command(answer)

    def _lookup(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.lookupTopic
        validate_name("topic", body.topic)
        answer = new_command(T.LOOKUP_RESPONSE)
        response = answer.lookupTopicResponse
        response.request_id = body.request_id
        coordinator = coordinator_partition(body.topic)
        if coordinator is not None:
            response.brokerServiceUrl = self._coordinators.owner_url(
                coordinator
            ) or self._placement.coordinator_url(coordinator, self._own_url())
        else:
            placed = self._store_url_of(body.topic)
            response.brokerServiceUrl = placed or self._placement.store_url(body.topic, self._own_url())
        # The same pod for clients on TLS (pulsar+ssl://): one port serves both (contracts §6 "TLS").
        response.brokerServiceUrlTls = tls_url(response.brokerServiceUrl)
        response.response = pulsar.CommandLookupTopicResponse.Connect
        response.authoritative = True
        return encode_command(answer)

    # --- producers -------------------------------------------------------------------------------
    def _store(self) -> TopicService:
        if self._topics is None:
            raise NotServedHereError("this pod serves no topics (role coordinator): look the topic up first")
        if not self._topics.recovered:
            raise UnavailableError("store is still recovering")
        return self._topics

    def _topic(self, topic: str) -> None:
        """Refuse a name no producer or consumer may use (a partitioned topic's base name), and a topic
        this pod does not serve now (NOT_SERVED_HERE: ServiceNotReady, the client looks it up again)."""
        validate_name("topic", topic)
        if self._topics is not None:
            self._topics.check_served(topic)
        if self._placement.partitioned.get(topic):
            raise NotAllowedError(
                f"{topic} is a partitioned topic: produce to and consume from its partitions"
                f" ({topic}-partition-0 ..); Pulsar's clients do that by themselves"
            )

    def _producer(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.producer
        topics = self._store()
        self._topic(body.topic)
        if body.producer_id in connection.producers:
            raise BadRequestError(f"producer id {body.producer_id} is already open on this connection")
        if body.producer_access_mode != pulsar.Shared:
            raise NotAllowedError(
                f"producer access mode {pulsar.ProducerAccessMode.Name(body.producer_access_mode)} is not"
                " served: use Shared (the default)"
            )
        check_schema(body)
        name = body.producer_name or f"{self._pod_name}-{next(self._producer_names)}"
        if topics.single_key.enabled:
            validate_writer_id(name, "producer name")
            return self._deduplicated_producer(session, connection, body, name, topics)
        connection.producers[body.producer_id] = Producer(session, body.producer_id, body.topic, name)
        return _producer_success(body.request_id, name, -1)

    async def _deduplicated_producer(
        self,
        session: PulsarSession,
        connection: _Connection,
        body: pulsar.CommandProducer,
        name: str,
        topics: TopicService,
    ) -> bytes:
        """A producer on a store with idempotent producers: its name's session in the writer table
        (fencing older producers of the name) and the name's last durable sequence id."""
        key = writer_key(connection.principal, name)
        partition = await topics.partition(body.topic)
        await topics.register_topic(body.topic)
        epoch, last = await partition.open_session(key, "pulsar")
        deduplication = Deduplication(key, epoch, partition.writers)
        if not session.is_open or body.producer_id in connection.producers:
            deduplication.end()
            raise BadRequestError(f"producer id {body.producer_id} is already open on this connection")
        connection.producers[body.producer_id] = Producer(
            session, body.producer_id, body.topic, name, deduplication=deduplication
        )
        return _producer_success(body.request_id, name, last)

    def _send(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.send
        producer = connection.producers.get(body.producer_id)
        if producer is None:
            raise BadRequestError(f"producer {body.producer_id} is not open on this connection")
        if not frame.has_payload:
            raise BadRequestError("SEND without a message: a SEND carries its metadata and payload")
        if not frame.checksum_ok:
            raise ChecksumError("the message's CRC32C does not match its bytes; nothing was written")
        if body.marker:
            raise NotAllowedError("marker messages are written by brokers, not producers")
        metadata = pulsar.MessageMetadata()
        try:
            metadata.ParseFromString(frame.metadata)
        except DecodeError as exc:
            raise BadRequestError(f"the SEND's MessageMetadata does not parse: {exc}") from exc
        if not 1 <= metadata.num_messages_in_batch <= MAX_BATCH_SIZE:
            raise BadRequestError(
                f"the SEND's MessageMetadata batches {metadata.num_messages_in_batch} messages: a batch"
                f" holds 1 to {MAX_BATCH_SIZE}"
            )
        topics = self._store()
        txn = txn_of(body.txnid_most_bits, body.txnid_least_bits, body.HasField("txnid_most_bits"))
        registered = None if txn is None else self._registration(txn, producer.topic, "")
        send = Send(body.sequence_id, body.highest_sequence_id, frame_size(frame))
        producer.sends.append(send)
        session.request_began(send.size)
        key = metadata.partition_key if metadata.HasField("partition_key") else ""
        write = Write(topics, producer, send, (frame.payload, key, frame.metadata), txn)
        if txn is None and producer.deduplication is not None:
            publish_deduplicated(write, producer.deduplication)
            return None
        if registered is None or (isinstance(registered, asyncio.Future) and succeeded(registered)):
            try:
                publish(write)
            except BaseException:
                producer.sends.remove(send)
                session.request_ended(send.size)
                raise
            return None
        # The write waits for the coordinator's confirmation; the receipt keeps its place in order.
        asyncio.ensure_future(registered).add_done_callback(partial(publish_registered, write))
        return None

    def _registration(self, txn: TxnID, topic: str, subscription: str) -> Awaitable[None]:
        if self._registrations is None:
            raise NotServedHereError("this pod serves no topics (role coordinator)")
        return self._registrations.ensure(txn, topic, subscription)

    def _close_producer(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        body = frame.command.close_producer
        producer = connection.producers.pop(body.producer_id, None)
        if producer is not None and producer.deduplication is not None:
            producer.deduplication.end()
        return success(body.request_id)

    # --- consumers -------------------------------------------------------------------------------
    def _subscribe(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.subscribe
        topics = self._store()
        self._topic(body.topic)
        validate_name("subscription", body.subscription)
        if body.consumer_id in connection.consumers:
            raise BadRequestError(f"consumer id {body.consumer_id} is already open on this connection")
        if body.HasField("keySharedMeta") and body.keySharedMeta.keySharedMode == pulsar.STICKY:
            raise NotAllowedError(
                "Key_Shared in STICKY mode (hash ranges chosen by the consumer) is not served: use the"
                " default AUTO_SPLIT"
            )
        if body.start_message_rollback_duration_sec:
            raise NotAllowedError("a start message rollback duration is not served")
        if body.durable and body.HasField("start_message_id"):
            raise NotAllowedError("a start message id is served for readers (non-durable subscriptions) only")
        if body.HasField("schema") and body.schema.type not in (SCHEMA_BYTES, SCHEMA_STRING):
            raise NotAllowedError("schemas other than bytes and string are not served")
        return self._subscribe_async(session, connection, topics, body)

    async def _subscribe_async(
        self,
        session: PulsarSession,
        connection: _Connection,
        topics: TopicService,
        body: pulsar.CommandSubscribe,
    ) -> bytes | None:
        from_latest = body.initialPosition == pulsar.CommandSubscribe.Latest
        if body.durable:
            subscription = await topics.subscription(body.topic, body.subscription, from_latest=from_latest)
        else:
            after, latest = reader_start(body, from_latest)
            subscription = await topics.open_reader(body.topic, body.subscription, after, from_latest=latest)
        if not session.is_open or body.consumer_id in connection.consumers:
            if not body.durable:
                await topics.close_reader(subscription)
            if not session.is_open:
                return None
            raise BadRequestError(f"consumer id {body.consumer_id} is already open on this connection")
        consumer = PulsarConsumer(session, body.consumer_id, body.topic, subscription)
        consumer.reader = not body.durable
        mode = pulsar.CommandSubscribe.SubType.Name(body.subType)
        subscription.add_consumer(consumer, 0, mode=mode, priority=body.priority_level)
        consumer.on_detach = partial(self._detached, connection)
        connection.consumers[body.consumer_id] = consumer
        return success(body.request_id)

    def _consumer(self, connection: _Connection, consumer_id: int) -> PulsarConsumer:
        consumer = connection.consumers.get(consumer_id)
        if consumer is None:
            raise BadRequestError(f"consumer {consumer_id} is not open on this connection")
        return consumer

    def _flow(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.flow
        consumer = self._consumer(connection, body.consumer_id)
        consumer.subscription.flow(consumer.consumer_id, min(body.messagePermits, MAX_PERMITS))
        return None

    def _ack(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.ack
        consumer = self._consumer(connection, body.consumer_id)
        if not body.message_id:
            raise BadRequestError("ACK names no message")
        cumulative = body.ack_type == pulsar.CommandAck.Cumulative
        txn = txn_of(body.txnid_most_bits, body.txnid_least_bits, body.HasField("txnid_most_bits"))
        ids = list(body.message_id)
        if any(m.ack_set for m in ids):
            if cumulative and txn is not None:
                raise NotAllowedError(
                    "a transactional cumulative ack of one message of a batch is not served: acknowledge"
                    " it individually, or cumulatively its whole entry"
                )
            done: Awaitable[None] = self._index_ack(consumer, ids, cumulative, txn)
        else:
            positions = [Position(m.ledgerId, m.entryId) for m in ids]
            if txn is not None:
                done = self._txn_ack(consumer, positions, cumulative, txn, [])
            else:
                done = consumer.subscription.ack(positions, cumulative, None)
        if not body.HasField("request_id"):
            acked = asyncio.ensure_future(done)
            acked.add_done_callback(partial(log_failure, f"a Pulsar consumer's ack on {consumer.topic}"))
            return None
        return self._ack_response(done, body.consumer_id, body.request_id)

    async def _txn_ack(
        self,
        consumer: PulsarConsumer,
        positions: list[Position],
        cumulative: bool,
        txn: TxnID,
        index_acks: list[IndexAck],
    ) -> None:
        subscription = consumer.subscription
        await self._registration(txn, consumer.topic, subscription.name)
        self._store().check_fence(consumer.topic, subscription.name, txn)
        await subscription.ack(positions, cumulative, txn, index_acks)

    async def _index_ack(
        self,
        consumer: PulsarConsumer,
        ids: list[pulsar.MessageIdData],
        cumulative: bool,
        txn: TxnID | None,
    ) -> None:
        """An ack naming messages of batches by ack set (set bits: the indexes it leaves)."""
        subscription = consumer.subscription
        positions: list[Position] = []
        index_acks: list[IndexAck] = []
        for message_id in ids:
            position = Position(message_id.ledgerId, message_id.entryId)
            if not message_id.ack_set:
                positions.append(position)
                continue
            size = await subscription.batch_size(position)
            try:
                acked = full_mask(size) & ~words_to_mask(message_id.ack_set, size)
            except ValueError as exc:
                raise BadRequestError(f"the ack set of message {position}: {exc}") from None
            if cumulative:
                # Everything before the entry, and of it the indexes the ack set clears.
                if position.entry_id > 0:
                    await subscription.ack([Position(position.ledger_id, position.entry_id - 1)], True, None)
                cumulative = False
            if acked == full_mask(size):
                positions.append(position)
            elif acked:
                index_acks.append(IndexAck(position, acked, size))
        if txn is not None:
            await self._txn_ack(consumer, positions, False, txn, index_acks)
        elif positions or index_acks:
            await subscription.ack(positions, False, None, index_acks)

    # --- transactions (coordinator pods) ---------------------------------------------------------
    def _tc_connect(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        return self._coordinators.tc_client_connect(frame.command.tcClientConnectRequest)

    def _new_txn(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        return self._coordinators.new_txn(frame.command.newTxn, connection.principal, session.session_id)

    def _add_partitions(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        return self._coordinators.add_partitions(
            frame.command.addPartitionToTxn, connection.principal, session.session_id
        )

    def _add_subscriptions(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        return self._coordinators.add_subscriptions(
            frame.command.addSubscriptionToTxn, connection.principal, session.session_id
        )

    def _end_txn(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        return self._coordinators.end_txn(frame.command.endTxn, connection.principal)

    @staticmethod
    async def _ack_response(done: Awaitable[None], consumer_id: int, request_id: int) -> bytes:
        await done
        answer = new_command(T.ACK_RESPONSE)
        answer.ackResponse.consumer_id = consumer_id
        answer.ackResponse.request_id = request_id
        return encode_command(answer)

    def _redeliver(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.redeliverUnacknowledgedMessages
        consumer = self._consumer(connection, body.consumer_id)
        if body.message_ids:
            positions = [Position(m.ledgerId, m.entryId) for m in body.message_ids]
            consumer.subscription.redeliver(consumer.consumer_id, positions)
        else:
            consumer.subscription.redeliver_unacknowledged(consumer.consumer_id)
        return None

    def _seek(self, session: PulsarSession, connection: _Connection, frame: PulsarFrame) -> PulsarResult:
        body = frame.command.seek
        consumer = self._consumer(connection, body.consumer_id)
        if body.HasField("message_id") == body.HasField("message_publish_time"):
            raise BadRequestError("SEEK names either a message id or a publish time")
        return self._seek_async(consumer, body)

    async def _seek_async(self, consumer: PulsarConsumer, body: pulsar.CommandSeek) -> bytes:
        topics = self._store()
        if body.HasField("message_publish_time"):
            target = await topics.seek_target(consumer.topic, publish_time_ms=body.message_publish_time)
        else:
            message = body.message_id
            if message.ledgerId == NO_POSITION:  # MessageId.earliest
                target = await topics.seek_target(consumer.topic)
            else:
                # MessageId.latest (Long.MAX_VALUE) lies past every entry: the seek goes to the end.
                position = Position(min(message.ledgerId, LATEST_POSITION), message.entryId)
                target = await topics.seek_target(consumer.topic, message=position)
        await consumer.subscription.reset(target)
        return success(body.request_id)

    def _detached(self, connection: _Connection, consumer: PulsarConsumer) -> None:
        """A subscription reset dropped ``consumer`` (its client was told to subscribe again)."""
        if connection.consumers.get(consumer.client_consumer_id) is consumer:
            del connection.consumers[consumer.client_consumer_id]
        self._close_reader(consumer)

    def _unsubscribe(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        body = frame.command.unsubscribe
        consumer = self._consumer(connection, body.consumer_id)
        if consumer.reader:
            raise NotAllowedError("a reader (non-durable subscription) has nothing to unsubscribe: close it")
        if body.force:
            raise NotAllowedError(
                "a forced unsubscribe (which disconnects the other consumers) is not served: close"
                " them, then unsubscribe"
            )
        return self._unsubscribe_async(connection, consumer, body.request_id)

    async def _unsubscribe_async(
        self, connection: _Connection, consumer: PulsarConsumer, request_id: int
    ) -> bytes:
        subscription = consumer.subscription
        await self._store().unsubscribe(consumer.topic, subscription.name, consumer.consumer_id)
        # Pulsar closes the consumer with its subscription.
        connection.consumers.pop(consumer.client_consumer_id, None)
        return success(request_id)

    def _close_consumer(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        body = frame.command.close_consumer
        consumer = connection.consumers.pop(body.consumer_id, None)
        if consumer is not None:
            self._release(consumer)
        return success(body.request_id)

    def _last_message_id(
        self, session: PulsarSession, connection: _Connection, frame: PulsarFrame
    ) -> PulsarResult:
        body = frame.command.getLastMessageId
        consumer = self._consumer(connection, body.consumer_id)
        return self._last_message_answer(consumer, body.request_id)

    async def _last_message_answer(self, consumer: PulsarConsumer, request_id: int) -> bytes:
        last = await self._store().last_message_position(consumer.topic)
        answer = new_command(T.GET_LAST_MESSAGE_ID_RESPONSE)
        response = answer.getLastMessageIdResponse
        response.request_id = request_id
        response.last_message_id.ledgerId = last.ledger_id if last is not None else NO_POSITION
        response.last_message_id.entryId = last.entry_id if last is not None else NO_POSITION
        mark_delete = consumer.subscription.mark_delete_position()
        if mark_delete is not None and mark_delete.entry_id >= 0:
            response.consumer_mark_delete_position.ledgerId = mark_delete.ledger_id
            response.consumer_mark_delete_position.entryId = mark_delete.entry_id
        return encode_command(answer)


def _producer_success(request_id: int, name: str, last_sequence_id: int) -> bytes:
    answer = new_command(T.PRODUCER_SUCCESS)
    success = answer.producer_success
    success.request_id = request_id
    success.producer_name = name
    success.last_sequence_id = last_sequence_id
    success.producer_ready = True
    # Pulsar's brokers always send it (empty: no schema registered); older Java clients (4.0)
    # read it unconditionally and drop the connection without it.
    success.schema_version = b""
    return encode_command(answer)


def _txn_response(command: pulsar.BaseCommand, error: int, message: str) -> bytes | None:
    """The failure answer of a transaction command (its own response type), or None for others."""
    kind = command.type
    if kind == T.NEW_TXN:
        request_id, txn = command.newTxn.request_id, (0, 0)
    elif kind == T.TC_CLIENT_CONNECT_REQUEST:
        request_id, txn = command.tcClientConnectRequest.request_id, (0, 0)
    elif kind == T.ADD_PARTITION_TO_TXN:
        body = command.addPartitionToTxn
        request_id, txn = body.request_id, (body.txnid_most_bits, body.txnid_least_bits)
    elif kind == T.ADD_SUBSCRIPTION_TO_TXN:
        subs = command.addSubscriptionToTxn
        request_id, txn = subs.request_id, (subs.txnid_most_bits, subs.txnid_least_bits)
    elif kind == T.END_TXN:
        end = command.endTxn
        request_id, txn = end.request_id, (end.txnid_most_bits, end.txnid_least_bits)
    else:
        return None
    return response_error(kind, request_id, txn, error, message)


def _request_id(command: pulsar.BaseCommand) -> int | None:
    """The request id a failed command is answered under, if it has one."""
    kind = command.type
    if kind not in T.Type.values():
        return None
    for descriptor, value in command.ListFields():
        if descriptor.name in ("type",):
            continue
        if hasattr(value, "request_id") and value.HasField("request_id"):
            return int(value.request_id)
    return None


def _unsupported(kind: int) -> str:
    name = T.Type.Name(kind) if kind in T.Type.values() else f"command type {kind}"  # type: ignore[arg-type]
    return f"{name} is not served by txnkeeper (docs/pulsar-protocol.md lists what is)"
