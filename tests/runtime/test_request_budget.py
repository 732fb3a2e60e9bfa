"""A client that pipelines sends faster than they are written is held to the request budgets
(protocol/limits.py): per connection ``--max-requests-in-flight``, per process
``--max-total-request-bytes``. Past them the server stops reading the connection, so the unanswered
sends in its memory stay bounded; once the writes catch up every send is answered, in order, and
none is lost or refused.

Sends are kept unanswered for real: they are transactional, and the store confirms a transaction's
partition with its coordinator before the first write (docs/pulsar-protocol.md), so a coordinator
pod stopped with SIGSTOP holds every send until it is continued.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
from pulsar_wire import RawPulsar, T, command, free_port, metadata, placement_flags
from runtime_pods import ServePod, pod_gauge
from runtime_waits import wait_until_sync

from txnkeeper.protocol.pulsar_frames import encode_payload_command

TOPIC = "persistent://public/default/request-budget"


def _pods(pods: Callable[..., ServePod], store_flags: list[str]) -> tuple[ServePod, ServePod]:
    store_port, coordinator_port = free_port(), free_port()
    flags = placement_flags(store_port, coordinator_port)
    coordinator = pods("tc-0", "coordinator", extra=[*flags, "--listen", f"127.0.0.1:{coordinator_port}"])
    store = pods("pas-0", "store", extra=[*flags, "--listen", f"127.0.0.1:{store_port}", *store_flags])
    return coordinator, store


def _begin(coordinator: ServePod) -> tuple[int, int]:
    raw = RawPulsar(coordinator.listen)
    raw.handshake()
    begin = command(T.NEW_TXN)
    begin.newTxn.request_id, begin.newTxn.tc_id, begin.newTxn.txn_ttl_seconds = 1, 0, 120_000
    raw.send(begin)
    answer = raw.expect(T.NEW_TXN_RESPONSE).newTxnResponse
    assert not answer.HasField("error"), answer
    raw.close()
    return answer.txnid_most_bits, answer.txnid_least_bits


def _producer(store: ServePod, producer_id: int) -> RawPulsar:
    raw = RawPulsar(store.listen, timeout=60)
    raw.handshake()
    producer = command(T.PRODUCER)
    producer.producer.topic, producer.producer.request_id = TOPIC, 1
    producer.producer.producer_id = producer_id
    raw.send(producer)
    raw.expect(T.PRODUCER_SUCCESS)
    return raw


def _sends(producer_id: int, count: int, payload: bytes, txn: tuple[int, int]) -> list[bytes]:
    frames = []
    for sequence_id in range(count):
        send = command(T.SEND)
        send.send.producer_id, send.send.sequence_id = producer_id, sequence_id
        send.send.txnid_most_bits, send.send.txnid_least_bits = txn
        frames.append(encode_payload_command(send, metadata(sequence_id=sequence_id), payload))
    return frames


@pytest.fixture
def stopped() -> Iterator[list[ServePod]]:
    """Pods a test stopped with SIGSTOP: continued at the end whatever happened."""
    held: list[ServePod] = []
    yield held
    for pod in held:
        if pod.process is not None and pod.process.poll() is None:
            pod.process.send_signal(signal.SIGCONT)


class Budget(NamedTuple):
    name: str
    flags: list[str]
    connections: int
    sends: int  # per connection
    payload_bytes: int


@pytest.mark.parametrize(
    "case",
    [
        Budget("per connection", ["--max-requests-in-flight", "50"], 1, 1_000, 100),
        Budget("per process", ["--max-total-request-bytes", str(5 * 1024 * 1024)], 2, 500, 8 * 1024),
    ],
    ids=lambda case: case.name,
)
def test_pipelined_sends_are_held_to_the_request_budget_and_all_answered(
    pods: Callable[..., ServePod], stopped: list[ServePod], case: Budget
) -> None:
    budget, flags, connections, sends, payload_bytes = case
    coordinator, store = _pods(pods, flags)
    txn = _begin(coordinator)
    producers = [_producer(store, producer_id) for producer_id in range(1, connections + 1)]
    frames = [_sends(i, sends, b"x" * payload_bytes, txn) for i in range(1, connections + 1)]
    assert coordinator.process is not None
    coordinator.process.send_signal(signal.SIGSTOP)  # every send now waits for its partition's confirmation
    stopped.append(coordinator)
    # Pipelined from threads: once the server stops reading, a sender blocks in its kernel buffers.
    senders = [
        threading.Thread(target=raw.send_bytes, args=(b"".join(mine),), daemon=True)
        for raw, mine in zip(producers, frames, strict=True)
    ]
    for sender in senders:
        sender.start()
    total = connections * sends
    frame_bytes = len(frames[0][0])

    def held() -> bool:
        return pod_gauge(store, "txnkeeper_server_request_held_connections") >= 1 and (
            pod_gauge(store, "txnkeeper_server_request_bytes")
            >= (40 * frame_bytes if connections == 1 else 4 << 20)
        )

    wait_until_sync(held, 60, f"the store to stop reading past its {budget} request budget")
    in_memory = pod_gauge(store, "txnkeeper_server_request_bytes")
    if connections == 1:
        assert in_memory <= 50 * frame_bytes, (
            f"{in_memory / frame_bytes:.0f} sends held, over the budget of 50"
        )
    else:
        # the budget plus the one send that took it past, per connection
        assert in_memory <= 5 * 1024 * 1024 + connections * frame_bytes, in_memory
    assert in_memory < total * frame_bytes  # not everything was read
    coordinator.process.send_signal(signal.SIGCONT)
    stopped.clear()
    for sender in senders:
        sender.join(60)
        assert not sender.is_alive(), "the server never read the rest of the sends"
    for raw in producers:
        receipts = [raw.expect(T.SEND_RECEIPT).send_receipt.sequence_id for _ in range(sends)]
        assert receipts == list(range(sends))  # every send answered, in order, none refused
        raw.close()

    def released() -> bool:
        return (
            pod_gauge(store, "txnkeeper_server_request_held_connections") == 0
            and pod_gauge(store, "txnkeeper_server_request_bytes") == 0
        )

    wait_until_sync(released, 30, "the store's request budget to be free again")
    assert pod_gauge(store, "txnkeeper_topic_ongoing_transactions", f'topic="{TOPIC}"') == 1
