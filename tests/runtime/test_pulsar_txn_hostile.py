"""Pulsar's transaction commands with hostile or careless input (issue 26), raw frames against a
coordinator pod and a store pod:

| input | answer |
|---|---|
| NEW_TXN on a store pod / for a coordinator id nobody hosts | NEW_TXN_RESPONSE error (not hosted) |
| NEW_TXN without a timeout | NEW_TXN_RESPONSE error |
| SEND or ACK in a transaction id nobody began (forged) | SEND_ERROR / ACK_RESPONSE TransactionNotFound; |
|   | nothing written |
| END_TXN of a forged id / a second END_TXN that contradicts the first | END_TXN_RESPONSE error |
| a SEND in a transaction to a partition the client never added | registered by the store itself, so |
|   | the end reaches it |
| SENDs of many transactions in one write | confirmed with the coordinator in a few requests, |
|   | each transaction keeps its own outcome |
| registrations that never reach a store (a client that | that connection's NEW_TXN is held until one |
|   adds partitions and never sends) | lands, its transaction ends or 1 s passed; other |
|   | connections' begins are answered at once |
"""

from __future__ import annotations

import pytest
from pulsar_wire import RawPulsar, T, command, metadata
from runtime_pods import ServePod, pod_gauge
from runtime_waits import wait_until_sync

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import encode_payload_command
from txnkeeper.server.pulsar_pacing import REGISTRATIONS_AHEAD

TOPIC = "persistent://public/default/txn-hostile"


def _new_txn(raw: RawPulsar, request_id: int, *, tc_id: int = 0, ttl_ms: int = 60_000) -> pulsar.BaseCommand:
    begin = command(T.NEW_TXN)
    begin.newTxn.request_id = request_id
    begin.newTxn.tc_id = tc_id
    begin.newTxn.txn_ttl_seconds = ttl_ms  # Pulsar's clients send milliseconds in this field
    raw.send(begin)
    return raw.expect(T.NEW_TXN_RESPONSE)


def _end(raw: RawPulsar, request_id: int, txn: tuple[int, int], action: int) -> pulsar.CommandEndTxnResponse:
    end = command(T.END_TXN)
    end.endTxn.request_id = request_id
    end.endTxn.txnid_most_bits, end.endTxn.txnid_least_bits = txn
    end.endTxn.txn_action = action  # type: ignore[assignment]
    raw.send(end)
    return raw.expect(T.END_TXN_RESPONSE).endTxnResponse


def _send(
    raw: RawPulsar, sequence_id: int, payload: bytes, txn: tuple[int, int] | None
) -> pulsar.BaseCommand:
    send = command(T.SEND)
    send.send.producer_id, send.send.sequence_id = 1, sequence_id
    if txn is not None:  # a plain send carries no transaction fields (Pulsar's clients leave them out)
        send.send.txnid_most_bits, send.send.txnid_least_bits = txn
    raw.send_bytes(encode_payload_command(send, metadata(sequence_id=sequence_id), payload))
    frame = raw.read()
    assert frame is not None
    return frame.command


def _store_session(store: ServePod) -> RawPulsar:
    raw = RawPulsar(store.listen)
    raw.handshake()
    producer = command(T.PRODUCER)
    producer.producer.topic, producer.producer.producer_id, producer.producer.request_id = TOPIC, 1, 1
    raw.send(producer)
    raw.expect(T.PRODUCER_SUCCESS)
    subscribe = command(T.SUBSCRIBE)
    sub = subscribe.subscribe
    sub.topic, sub.subscription, sub.consumer_id, sub.request_id = TOPIC, "audit", 1, 2
    sub.subType = pulsar.CommandSubscribe.Shared
    sub.initialPosition = pulsar.CommandSubscribe.Earliest
    raw.send(subscribe)
    raw.expect(T.SUCCESS)
    flow = command(T.FLOW)
    flow.flow.consumer_id, flow.flow.messagePermits = 1, 100
    raw.send(flow)
    return raw


def test_transactions_are_refused_where_they_cannot_be_served(pulsar_pods: tuple[ServePod, ServePod]) -> None:
    coordinator, store = pulsar_pods
    on_store = RawPulsar(store.listen)
    on_store.handshake()
    assert _new_txn(on_store, 1).newTxnResponse.HasField("error")
    on_coordinator = RawPulsar(coordinator.listen)
    on_coordinator.handshake()
    answer = _new_txn(on_coordinator, 2, tc_id=5).newTxnResponse
    assert answer.error == pulsar.TransactionCoordinatorNotFound, answer
    answer = _new_txn(on_coordinator, 3, ttl_ms=0).newTxnResponse
    assert answer.HasField("error") and "timeout" in answer.message, answer
    forged = _end(on_coordinator, 4, (0, 987654), pulsar.COMMIT)
    assert forged.error == pulsar.TransactionNotFound, forged


def test_forged_transaction_ids_write_nothing(pulsar_pods: tuple[ServePod, ServePod]) -> None:
    _, store = pulsar_pods
    raw = _store_session(store)
    refused = _send(raw, 0, b"forged", (0, 987654))
    assert refused.type == T.SEND_ERROR and refused.send_error.error == pulsar.TransactionNotFound, refused
    refused = _send(raw, 1, b"forged", (3, 1))  # a coordinator id nobody hosts
    assert refused.type == T.SEND_ERROR, refused
    plain = _send(raw, 2, b"plain", None)
    assert plain.type == T.SEND_RECEIPT, plain
    message = raw.read()
    assert message is not None and message.payload == b"plain"
    ack = command(T.ACK)
    ack.ack.consumer_id, ack.ack.ack_type, ack.ack.request_id = 1, pulsar.CommandAck.Individual, 9
    ack.ack.message_id.add(
        ledgerId=message.command.message.message_id.ledgerId,
        entryId=message.command.message.message_id.entryId,
    )
    ack.ack.txnid_most_bits, ack.ack.txnid_least_bits = 0, 987654
    raw.send(ack)
    answer = raw.expect(T.ACK_RESPONSE).ackResponse
    assert answer.error == pulsar.TransactionNotFound, answer
    with pytest.raises(TimeoutError):
        raw.read(1.0)  # the forged sends were never written


def test_a_partition_the_client_never_added_still_gets_the_end(
    pulsar_pods: tuple[ServePod, ServePod],
) -> None:
    coordinator, store = pulsar_pods
    tc = RawPulsar(coordinator.listen)
    tc.handshake()
    raw = _store_session(store)
    begun = _new_txn(tc, 1).newTxnResponse
    aborted = (begun.txnid_most_bits, begun.txnid_least_bits)
    assert _send(raw, 0, b"never", aborted).type == T.SEND_RECEIPT  # no ADD_PARTITION_TO_TXN first
    assert not _end(tc, 2, aborted, pulsar.ABORT).HasField("error")
    begun = _new_txn(tc, 3).newTxnResponse
    committed = (begun.txnid_most_bits, begun.txnid_least_bits)
    assert _send(raw, 1, b"kept", committed).type == T.SEND_RECEIPT
    assert not _end(tc, 4, committed, pulsar.COMMIT).HasField("error")
    contradiction = _end(tc, 5, committed, pulsar.ABORT)
    assert contradiction.error == pulsar.InvalidTxnStatus, contradiction
    message = raw.read()
    assert message is not None and message.payload == b"kept"
    with pytest.raises(TimeoutError):
        raw.read(1.0)  # the aborted one is never delivered


def test_many_transactions_sends_are_confirmed_in_a_few_requests(
    pulsar_pods: tuple[ServePod, ServePod],
) -> None:
    """Transactional SENDs of 24 transactions in one write: the store confirms their registrations
    with the coordinator in one request per loop turn, not one each, and each keeps its outcome."""
    coordinator, store = pulsar_pods
    tc = RawPulsar(coordinator.listen)
    tc.handshake()
    raw = _store_session(store)
    txns = []
    for request_id in range(1, 25):
        begun = _new_txn(tc, request_id).newTxnResponse
        txns.append((begun.txnid_most_bits, begun.txnid_least_bits))
    frames = b""
    for sequence_id, txn in enumerate(txns):
        send = command(T.SEND)
        send.send.producer_id, send.send.sequence_id = 1, sequence_id
        send.send.txnid_most_bits, send.send.txnid_least_bits = txn
        payload = f"m{sequence_id}".encode()
        frames += encode_payload_command(send, metadata(sequence_id=sequence_id), payload)
    raw.send_bytes(frames)
    receipts = [raw.expect(T.SEND_RECEIPT).send_receipt.sequence_id for _ in txns]
    assert receipts == list(range(24))
    requests = pod_gauge(store, "txnkeeper_pulsar_registration_requests_total")
    assert pod_gauge(store, "txnkeeper_pulsar_registration_confirmations_total") == 24
    assert 1 <= requests <= 4, requests  # one per loop turn that read some of the frames
    for request_id, txn in enumerate(txns, start=100):
        assert not _end(tc, request_id, txn, pulsar.COMMIT if txn[1] % 2 else pulsar.ABORT).HasField("error")
    committed = {f"m{i}".encode() for i, txn in enumerate(txns) if txn[1] % 2}
    delivered = set()
    for _ in committed:
        message = raw.read()
        assert message is not None
        delivered.add(message.payload)
    assert delivered == committed
    with pytest.raises(TimeoutError):
        raw.read(1.0)  # the aborted ones are never delivered


def _add_partitions(raw: RawPulsar, request_id: int, txn: tuple[int, int], count: int) -> None:
    add = command(T.ADD_PARTITION_TO_TXN)
    body = add.addPartitionToTxn
    body.request_id = request_id
    body.txnid_most_bits, body.txnid_least_bits = txn
    body.partitions.extend(f"{TOPIC}-paced-{request_id}-{i}" for i in range(count))
    raw.send(add)
    assert not raw.expect(T.ADD_PARTITION_TO_TXN_RESPONSE).addPartitionToTxnResponse.HasField("error")


def test_begins_wait_while_a_connections_registrations_have_not_reached_a_store(
    pulsar_pods: tuple[ServePod, ServePod],
) -> None:
    """server/pulsar_pacing.py: a client that registered REGISTRATIONS_AHEAD partitions and sent
    nothing has its next begin held; it is answered once its transaction ends (or after the hold's
    bound: a store that is down or a client that never sends slows that client, never stops it), and
    another connection is not held meanwhile."""
    coordinator, _ = pulsar_pods
    hoarder = RawPulsar(coordinator.listen)
    hoarder.handshake()
    begun = _new_txn(hoarder, 1).newTxnResponse
    txn = (begun.txnid_most_bits, begun.txnid_least_bits)
    _add_partitions(hoarder, 2, txn, REGISTRATIONS_AHEAD)
    assert pod_gauge(coordinator, "txnkeeper_pulsar_unconfirmed_registrations") == REGISTRATIONS_AHEAD
    begin = command(T.NEW_TXN)
    begin.newTxn.request_id, begin.newTxn.tc_id, begin.newTxn.txn_ttl_seconds = 3, 0, 60_000
    hoarder.send(begin)
    wait_until_sync(
        lambda: pod_gauge(coordinator, "txnkeeper_pulsar_held_begins_total") == 1, 10, "the begin held"
    )
    other = RawPulsar(coordinator.listen)
    other.handshake()
    assert not _new_txn(other, 1).newTxnResponse.HasField("error")  # not paced by the hoarder
    end = command(T.END_TXN)
    end.endTxn.request_id = 4
    end.endTxn.txnid_most_bits, end.endTxn.txnid_least_bits = txn
    end.endTxn.txn_action = pulsar.ABORT
    hoarder.send(end)
    answers = [hoarder.read() for _ in range(2)]  # either order: the hold's bound may come first
    assert {a.command.type for a in answers if a is not None} == {T.END_TXN_RESPONSE, T.NEW_TXN_RESPONSE}
    assert all(not a.command.newTxnResponse.HasField("error") for a in answers if a is not None)
    assert pod_gauge(coordinator, "txnkeeper_pulsar_unconfirmed_registrations") == 0
    # Registrations that never land and a transaction that never ends: the hold's bound answers it.
    begun = _new_txn(hoarder, 5).newTxnResponse
    assert not begun.HasField("error")
    _add_partitions(hoarder, 6, (begun.txnid_most_bits, begun.txnid_least_bits), REGISTRATIONS_AHEAD)
    assert not _new_txn(hoarder, 7).newTxnResponse.HasField("error")
    assert pod_gauge(coordinator, "txnkeeper_pulsar_held_begins_total") == 2
