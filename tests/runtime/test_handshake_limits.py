"""Connections that never complete a request cannot lock a pod's clients out (issue 25 item 11).

Before: 1,024 idle connections (the default ``--max-connections``) that sent nothing held every slot
for up to the 600 s idle timeout; every other client was refused. Now a connection counts as
*handshaking* until its first complete request: those have their own, smaller cap (the oldest is closed
to admit a new one), a short deadline, and every peer address has its own connection limit.
Real ``txnkeeper serve`` pods, real sockets.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
from runtime_pods import ServePod, pod_gauge
from runtime_waits import wait_until

from txnkeeper.client import Client
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import FrameDecoder, encode_frame
from txnkeeper.protocol.rpc import split_address

pytestmark = pytest.mark.timeout(300)
TOPIC = "persistent://t/ns/handshake"


def _refused(pod: ServePod) -> float:
    refused = "txnkeeper_server_refused_connections_total"
    reasons = ("max_connections", "max_connections_per_address")
    return sum(pod_gauge(pod, refused, f'reason="{why}"') for why in reasons)


def _idle(address: str, source: str = "127.0.0.1") -> socket.socket | None:
    """A connection that sends nothing (None: the server refused it at once)."""
    host, port = split_address(address)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    try:
        sock.connect((host, port))
    except OSError:
        sock.close()
        return None
    return sock


def _error_frame(sock: socket.socket, within: float) -> api.Command:
    """The error frame the server sent before closing ``sock``."""
    sock.settimeout(within)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    (command,) = FrameDecoder().feed(data)
    return command


async def _serves(pod: ServePod, what: bytes) -> None:
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        consumer = await client.subscribe(TOPIC, "legit")
        await (await client.create_producer(TOPIC)).send(what)
        message = await consumer.receive(timeout=20)
        assert message.data == what
        await consumer.acknowledge(message)


async def test_idle_connections_cannot_lock_other_clients_out(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store")  # default limits: 1,024 connections, 600 s idle timeout
    flood = [sock for sock in (_idle(store.listen) for _ in range(1_024)) if sock is not None]

    async def settled() -> bool:
        accepted = pod_gauge(store, "txnkeeper_server_accepted_connections_total")
        return accepted + _refused(store) >= len(flood)

    await wait_until(settled, 60, "the flood of idle connections to be accepted or refused")
    # A client from the same address as the flood still connects and works, at once (not after the
    # idle timeout), and again while the flood stays.
    await asyncio.wait_for(_serves(store, b"first"), 60)
    await asyncio.wait_for(_serves(store, b"second"), 60)
    # The flood holds at most the handshaking cap (64 by default) of the pod's connections.
    assert pod_gauge(store, "txnkeeper_server_handshaking_connections") <= 64
    evicted = pod_gauge(store, "txnkeeper_server_closed_connections_total", 'reason="handshake_evicted"')
    assert evicted + _refused(store) >= len(flood) - 64, (evicted, _refused(store))
    for sock in flood:
        sock.close()


async def test_a_connection_that_never_completes_a_request_is_closed_at_the_handshake_deadline(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=["--handshake-timeout", "1"])
    silent = _idle(store.listen)
    assert silent is not None
    half = _idle(store.listen)
    assert half is not None
    # A frame started, never completed. Its body starts with a protobuf tag (0x08): a first byte 0 would
    # make it a Pulsar frame (the port serves both wires, protocol/server.py ServerConnection).
    half.sendall(b"\x00\x00\x01\x00" + b"\x08" * 10)
    answered = _idle(store.listen)
    assert answered is not None
    answered.sendall(encode_frame(api.Command(request_id=1, produce=api.Produce(topic=TOPIC, payload=b"x"))))
    for sock in (silent, half):
        error = (await asyncio.to_thread(_error_frame, sock, 30)).error
        assert error.code == api.RESOURCE_LIMIT and "handshake timeout 1s" in error.message, error
    # A connection whose first request completed is past the handshake: only the idle timeout applies.
    answered.settimeout(10)
    receipt = FrameDecoder().feed(answered.recv(65536))
    assert receipt[0].WhichOneof("body") == "produce_receipt", receipt

    async def both_timed_out() -> bool:
        closed = pod_gauge(store, "txnkeeper_server_closed_connections_total", 'reason="handshake_timeout"')
        return closed >= 2

    await wait_until(both_timed_out, 20, "both handshakes to time out")
    answered.setblocking(False)
    with pytest.raises(BlockingIOError):
        answered.recv(1)  # nothing to read and not closed
    for sock in (silent, half, answered):
        sock.close()
    assert "handshake timeout" in store.log()


async def test_each_peer_address_has_its_own_connection_limit(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store", extra=["--max-connections-per-address", "4"])
    kept = [_idle(store.listen) for _ in range(4)]
    assert all(sock is not None for sock in kept)
    fifth = _idle(store.listen)
    assert fifth is not None
    error = (await asyncio.to_thread(_error_frame, fifth, 10)).error
    assert error.code == api.RESOURCE_LIMIT and "127.0.0.1" in error.message, error
    assert "max connections per address 4" in error.message, error
    # Another address is not affected.
    other = _idle(store.listen, source="127.0.0.2")
    assert other is not None
    other.sendall(encode_frame(api.Command(request_id=1, produce=api.Produce(topic=TOPIC, payload=b"x"))))
    other.settimeout(10)
    assert FrameDecoder().feed(other.recv(65536))[0].WhichOneof("body") == "produce_receipt"
    assert (
        pod_gauge(store, "txnkeeper_server_refused_connections_total", 'reason="max_connections_per_address"')
        == 1
    )
    for sock in [*kept, fifth, other]:
        if sock is not None:
            sock.close()
