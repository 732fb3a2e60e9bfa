"""Hostile input on the Pulsar port (issue 26): each case gets Pulsar's error answer or a closed
connection, nothing is written for a refused SEND, and the pod keeps serving a well-behaved client.

| input | answer |
|---|---|
| a command before CONNECT | ERROR, connection closed |
| a second CONNECT | ERROR, connection closed |
| a frame over the size limit (header only) | ERROR, closed at once (nothing allocated for it) |
| a truncated frame left incomplete | closed after the frame timeout |
| command size larger than the frame | ERROR, closed |
| bytes that do not parse as a command | ERROR, closed |
| an unknown command type / a type without its body / required fields missing | ERROR, closed |
| a command this server does not serve (CONSUMER_STATS) | ERROR NotAllowedError for its request id |
| SEEK for a consumer not open here, or naming both or neither of message id and time | ERROR for it |
| SEND with a wrong checksum | SEND_ERROR ChecksumError, nothing written |
| SEND for a producer not open here / metadata that does not parse | SEND_ERROR |
| SEND or ACK with a forged transaction id | SEND_ERROR / ACK_RESPONSE error, nothing written |
| a producer id or consumer id reused on one connection | ERROR for that request |
| FLOW for an unknown consumer | nothing (logged); the connection stays usable |
| an invalid topic name | ERROR |
| SEND whose metadata batches 0 or over 100,000 messages | SEND_ERROR, nothing written |
| ACK with an ack set wider than its batch (bits past it ignored) | ACK_RESPONSE |
| ACK with an ack set, of a message that does not exist | ACK_RESPONSE with an error |
| UNSUBSCRIBE for a consumer not open here | ERROR for its request |
| UNSUBSCRIBE with another consumer attached / forced / of a reader | ERROR (ConsumerBusy / NotAllowedError) |
| deduplicated producers: a SEND of a producer whose name a newer PRODUCER took | SEND_ERROR ProducerFenced |
| deduplicated producers: a SEND already written, sent again | SEND_RECEIPT of the first write, no write |
| deduplicated producers: sequence id past 2^63 - 1 / a name with a control character | SEND_ERROR / ERROR |
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pulsar_wire import RawPulsar, T, command, connect_command, frame_of_size, metadata, send_frame
from runtime_pods import ServePod

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import encode_payload_command

TOPIC = "persistent://public/default/hostile"


@pytest.fixture
def store(pods: Callable[..., ServePod]) -> ServePod:
    return pods("pas-0", "store", extra=["--frame-timeout", "1"])


def _producer(raw: RawPulsar, producer_id: int = 1, request_id: int = 1, topic: str = TOPIC) -> None:
    cmd = command(T.PRODUCER)
    cmd.producer.topic = topic
    cmd.producer.producer_id = producer_id
    cmd.producer.request_id = request_id
    raw.send(cmd)


def _subscribe(raw: RawPulsar, consumer_id: int, request_id: int) -> None:
    cmd = command(T.SUBSCRIBE)
    cmd.subscribe.topic = TOPIC
    cmd.subscribe.subscription = "audit"
    cmd.subscribe.subType = pulsar.CommandSubscribe.Shared
    cmd.subscribe.consumer_id = consumer_id
    cmd.subscribe.request_id = request_id
    cmd.subscribe.initialPosition = pulsar.CommandSubscribe.Earliest
    raw.send(cmd)


def _closed_with_error(raw: RawPulsar) -> str:
    frames = raw.read_until_closed()
    assert raw.closed
    errors = [f.error.message for f in frames if f.type == T.ERROR]
    assert errors, f"closed without saying why: {frames}"
    return errors[-1]


def test_commands_before_connect_and_a_second_connect_close_the_connection(store: ServePod) -> None:
    raw = RawPulsar(store.listen)
    ping = command(T.PING)
    ping.ping.SetInParent()
    raw.send(ping)
    assert "before CONNECT" in _closed_with_error(raw)

    raw = RawPulsar(store.listen)
    raw.handshake()
    raw.send(connect_command())
    assert "second CONNECT" in _closed_with_error(raw)


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("oversized", frame_of_size(64 * 1024 * 1024), "exceeds the maximum"),
        ("command size past the frame", b"\x00\x00\x00\x08\x00\x00\x00\x20abcd", "command size"),
        ("garbage command", b"\x00\x00\x00\x08\x00\x00\x00\x04\xff\xff\xff\xff", "does not parse"),
        ("unknown type", b"\x00\x00\x00\x07\x00\x00\x00\x03\x08\xe7\x07", "no type"),
        ("type without body", b"\x00\x00\x00\x06\x00\x00\x00\x02\x08\x06", "SEND lacks send"),
        ("required field missing", b"\x00\x00\x00\x08\x00\x00\x00\x04\x08\x02\x12\x00", "client_version"),
    ],
)
def test_malformed_frames_close_the_connection_with_a_reason(
    store: ServePod, name: str, data: bytes, why: str
) -> None:
    raw = RawPulsar(store.listen)
    raw.handshake()
    raw.send_bytes(data)
    assert why in _closed_with_error(raw), name


def test_a_truncated_frame_is_closed_after_the_frame_timeout(store: ServePod) -> None:
    raw = RawPulsar(store.listen)
    raw.handshake()
    raw.send_bytes(b"\x00\x00\x01\x00\x00\x00\x00\x10" + b"x" * 20)  # 256 bytes announced, 28 sent
    assert "incomplete" in _closed_with_error(raw)


def test_refused_requests_are_answered_and_the_connection_goes_on(store: ServePod) -> None:
    raw = RawPulsar(store.listen)
    raw.handshake()
    stats = command(T.CONSUMER_STATS)
    stats.consumerStats.consumer_id = 1
    stats.consumerStats.request_id = 7
    raw.send(stats)
    error = raw.expect(T.ERROR).error
    assert (error.request_id, error.error) == (7, pulsar.NotAllowedError)
    assert "CONSUMER_STATS" in error.message
    seek = command(T.SEEK)
    seek.seek.consumer_id = 1  # not open here
    seek.seek.request_id = 6
    seek.seek.message_publish_time = 0
    raw.send(seek)
    assert raw.expect(T.ERROR).error.request_id == 6

    _producer(raw, topic="persistent://public/default/bad\x00name", request_id=8)
    error = raw.expect(T.ERROR).error
    assert error.request_id == 8 and "topic" in error.message

    flow = command(T.FLOW)
    flow.flow.consumer_id = 99
    flow.flow.messagePermits = 10
    raw.send(flow)  # logged, not answered
    _producer(raw, request_id=9)
    assert raw.expect(T.PRODUCER_SUCCESS).producer_success.request_id == 9
    _producer(raw, request_id=10)  # the same producer id again
    assert raw.expect(T.ERROR).error.request_id == 10
    _subscribe(raw, consumer_id=5, request_id=11)
    assert raw.expect(T.SUCCESS).success.request_id == 11
    _subscribe(raw, consumer_id=5, request_id=12)
    assert raw.expect(T.ERROR).error.request_id == 12


def test_refused_sends_write_nothing_and_good_ones_are_delivered(store: ServePod) -> None:
    raw = RawPulsar(store.listen)
    raw.handshake()
    _producer(raw)
    raw.expect(T.PRODUCER_SUCCESS)

    raw.send_bytes(send_frame(1, 0, metadata(sequence_id=0), b"corrupt", corrupt=True))
    refused = raw.expect(T.SEND_ERROR).send_error
    assert (refused.sequence_id, refused.error) == (0, pulsar.ChecksumError)
    raw.send_bytes(send_frame(2, 1, metadata(sequence_id=1), b"no producer"))
    assert raw.expect(T.SEND_ERROR).send_error.producer_id == 2
    raw.send_bytes(send_frame(1, 2, b"\xff\xff\xff", b"bad metadata"))
    assert raw.expect(T.SEND_ERROR).send_error.sequence_id == 2
    forged = command(T.SEND)
    forged.send.producer_id, forged.send.sequence_id = 1, 3
    forged.send.txnid_most_bits, forged.send.txnid_least_bits = 0, 424242
    raw.send_bytes(encode_payload_command(forged, metadata(sequence_id=3), b"forged txn"))
    assert raw.expect(T.SEND_ERROR).send_error.sequence_id == 3
    raw.send_bytes(send_frame(1, 4, metadata(sequence_id=4), b"good"))
    receipt = raw.expect(T.SEND_RECEIPT).send_receipt
    assert receipt.sequence_id == 4

    _subscribe(raw, consumer_id=1, request_id=2)
    raw.expect(T.SUCCESS)
    flow = command(T.FLOW)
    flow.flow.consumer_id = 1
    flow.flow.messagePermits = 100
    raw.send(flow)
    message = raw.read()
    assert message is not None and message.command.type == T.MESSAGE
    assert message.payload == b"good"
    assert (message.command.message.message_id.ledgerId, message.command.message.message_id.entryId) == (
        receipt.message_id.ledgerId,
        receipt.message_id.entryId,
    )
    ack = command(T.ACK)
    ack.ack.consumer_id = 1
    ack.ack.ack_type = pulsar.CommandAck.Individual
    ack.ack.message_id.add(ledgerId=receipt.message_id.ledgerId, entryId=receipt.message_id.entryId)
    ack.ack.txnid_most_bits, ack.ack.txnid_least_bits = 0, 424242
    ack.ack.request_id = 3
    raw.send(ack)
    answer = raw.expect(T.ACK_RESPONSE).ackResponse
    assert answer.request_id == 3 and answer.HasField("error")
    with pytest.raises(TimeoutError):
        raw.read(1.0)  # only the one good message exists


def test_the_own_protocol_still_works_on_the_same_port(store: ServePod) -> None:
    import asyncio

    from txnkeeper.client import Client

    async def roundtrip() -> bytes:
        client = Client(coordinators=[], stores=[store.listen])
        try:
            producer = await client.create_producer("persistent://public/default/own")
            await producer.send(b"own wire")
            consumer = await client.subscribe("persistent://public/default/own", "s")
            message = await consumer.receive(10)
            return message.data
        finally:
            await client.close()

    assert asyncio.run(roundtrip()) == b"own wire"


def _unsubscribe(
    raw: RawPulsar, consumer_id: int, request_id: int, *, force: bool = False
) -> pulsar.CommandError:
    cmd = command(T.UNSUBSCRIBE)
    cmd.unsubscribe.consumer_id = consumer_id
    cmd.unsubscribe.request_id = request_id
    if force:
        cmd.unsubscribe.force = True
    raw.send(cmd)
    return raw.expect(T.ERROR).error


def test_hostile_batch_acks_and_unsubscribes_are_refused_and_the_subscription_stays(store: ServePod) -> None:
    raw = RawPulsar(store.listen)
    raw.handshake()
    _producer(raw)
    raw.expect(T.PRODUCER_SUCCESS)
    huge = pulsar.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=10**6
    )
    raw.send_bytes(send_frame(1, 0, huge.SerializeToString(), b"x"))
    assert "batches 1000000" in raw.expect(T.SEND_ERROR).send_error.message
    raw.send_bytes(send_frame(1, 1, metadata(sequence_id=1), b"kept"))
    receipt = raw.expect(T.SEND_RECEIPT).send_receipt

    _subscribe(raw, consumer_id=1, request_id=2)
    raw.expect(T.SUCCESS)
    _subscribe(raw, consumer_id=2, request_id=3)  # a second consumer of the same subscription
    raw.expect(T.SUCCESS)
    for request_id, (ledger, entry) in enumerate(
        [(receipt.message_id.ledgerId, receipt.message_id.entryId), (999, 0)], start=10
    ):
        ack = command(T.ACK)
        ack.ack.consumer_id = 1
        ack.ack.ack_type = pulsar.CommandAck.Individual
        ack.ack.message_id.add(ledgerId=ledger, entryId=entry, ack_set=[2**63 - 1, 5])
        ack.ack.request_id = request_id
        raw.send(ack)
        answer = raw.expect(T.ACK_RESPONSE).ackResponse
        assert answer.request_id == request_id
    # (an ack set for a one-message entry keeps only the bits of its one index: the first acked
    # nothing of it, since bit 0 is set; the second names an entry that does not exist)
    assert answer.HasField("error") and "does not exist" in answer.message

    error = _unsubscribe(raw, consumer_id=9, request_id=20)
    assert error.request_id == 20 and "not open" in error.message
    error = _unsubscribe(raw, consumer_id=1, request_id=21)
    assert (error.request_id, error.error) == (21, pulsar.ConsumerBusy) and "other consumer" in error.message
    error = _unsubscribe(raw, consumer_id=1, request_id=22, force=True)
    assert (error.request_id, error.error) == (22, pulsar.NotAllowedError)

    flow = command(T.FLOW)
    flow.flow.consumer_id = 1
    flow.flow.messagePermits = 10
    raw.send(flow)
    message = raw.read()
    assert message is not None and message.payload == b"kept"  # still subscribed, still unacknowledged


def test_seek_resets_the_cursor_closes_the_consumer_and_redelivers_from_the_message(store: ServePod) -> None:
    """What the clients rely on, on the wire: SEEK answers SUCCESS, the server closes the consumer
    (CLOSE_CONSUMER with no request of the client's), and once it subscribes again the first
    MESSAGE is the one sought, acknowledged or not (Pulsar's broker reads from there)."""
    raw = RawPulsar(store.listen)
    raw.handshake()
    _producer(raw)
    raw.expect(T.PRODUCER_SUCCESS)
    receipts = []
    for sequence in range(5):
        raw.send_bytes(send_frame(1, sequence, metadata(sequence_id=sequence), f"m{sequence}".encode()))
        receipts.append(raw.expect(T.SEND_RECEIPT).send_receipt.message_id)
    _subscribe(raw, consumer_id=1, request_id=2)
    raw.expect(T.SUCCESS)
    flow = command(T.FLOW)
    flow.flow.consumer_id = 1
    flow.flow.messagePermits = 100
    raw.send(flow)
    for sequence in range(5):
        message = raw.read()
        assert message is not None and message.payload == f"m{sequence}".encode()
        ack = command(T.ACK)
        ack.ack.consumer_id = 1
        ack.ack.ack_type = pulsar.CommandAck.Individual
        ack.ack.message_id.add(ledgerId=message.command.message.message_id.ledgerId,
                               entryId=message.command.message.message_id.entryId)  # fmt: skip
        raw.send(ack)
    seek = command(T.SEEK)
    seek.seek.consumer_id = 1
    seek.seek.request_id = 3
    seek.seek.message_id.ledgerId = receipts[2].ledgerId
    seek.seek.message_id.entryId = receipts[2].entryId
    raw.send(seek)
    answers = {raw.read().command.type for _ in range(2)}  # type: ignore[union-attr]
    assert answers == {T.CLOSE_CONSUMER, T.SUCCESS}
    _subscribe(raw, consumer_id=1, request_id=4)  # the id is free again: the server closed it
    raw.expect(T.SUCCESS)
    raw.send(flow)
    again = [raw.read() for _ in range(3)]
    assert [m.payload for m in again if m is not None] == [b"m2", b"m3", b"m4"]
    with pytest.raises(TimeoutError):
        raw.read(0.5)


def _named_producer(raw: RawPulsar, name: str, request_id: int = 1) -> pulsar.BaseCommand:
    cmd = command(T.PRODUCER)
    cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = TOPIC, 1, request_id
    cmd.producer.producer_name = name
    raw.send(cmd)
    answer = raw.read()
    assert answer is not None
    return answer.command


def _sent(raw: RawPulsar, sequence_id: int, payload: bytes) -> pulsar.BaseCommand:
    raw.send_bytes(send_frame(1, sequence_id, metadata(sequence_id=sequence_id), payload))
    answer = raw.read()
    assert answer is not None
    return answer.command


def test_deduplicated_producers_refuse_takeovers_and_numbers_past_int64(
    pods: Callable[..., ServePod],
) -> None:
    """With idempotent producers on, a producer's name is fenced like a writer id: the newest PRODUCER
    of a name takes it (the older one's sends are refused ProducerFenced, nothing written), a send
    already written is answered with its first write's message id and not written again, a sequence
    id past 2^63 - 1 is refused before anything is stored, and a name no writer id could be is refused."""
    store = pods("pas-0", "store", extra=["--srk-enabled", "true", "--release", "3.0.0"])
    older, newer, reader = RawPulsar(store.listen), RawPulsar(store.listen), RawPulsar(store.listen)
    for raw in (older, newer, reader):
        raw.handshake()
    assert _named_producer(older, "app").producer_success.last_sequence_id == -1
    first = _sent(older, 0, b"first")
    assert first.type == T.SEND_RECEIPT, first
    again = _sent(older, 0, b"first")  # a retransmission of a written send
    assert again.type == T.SEND_RECEIPT and again.send_receipt.message_id == first.send_receipt.message_id
    assert _named_producer(newer, "app").producer_success.last_sequence_id == 0
    fenced = _sent(older, 1, b"from the fenced producer")
    assert fenced.type == T.SEND_ERROR and fenced.send_error.error == pulsar.ProducerFenced, fenced
    too_large = _sent(newer, 2**63, b"past int64")
    assert too_large.type == T.SEND_ERROR and "2^63 - 1" in too_large.send_error.message, too_large
    assert _sent(newer, 1, b"second").type == T.SEND_RECEIPT
    bad_name = _named_producer(reader, "bad\nname", request_id=5)
    assert bad_name.type == T.ERROR and "producer name" in bad_name.error.message, bad_name
    _subscribe(reader, 1, 6)
    reader.expect(T.SUCCESS)
    flow = command(T.FLOW)
    flow.flow.consumer_id, flow.flow.messagePermits = 1, 10
    reader.send(flow)
    delivered = [reader.read() for _ in range(2)]
    assert [frame.payload for frame in delivered if frame is not None] == [b"first", b"second"]
    with pytest.raises(TimeoutError):
        reader.read(1.0)  # nothing else was written
