"""How a connection coalesces outgoing frames: one write per loop turn, and one per ``flush_every``
frames within a turn, always in order (protocol/connection.py)."""

from __future__ import annotations

import asyncio

import pytest

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.connection import FrameConnection
from txnkeeper.protocol.frames import FrameDecoder


class RecordingTransport(asyncio.Transport):
    """Keeps every write as one chunk (a socket would merge them; the count is what is tested)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def _connected(flush_every: int) -> tuple[FrameConnection, RecordingTransport]:
    connection = FrameConnection(flush_every=flush_every)
    transport = RecordingTransport()
    connection.connection_made(transport)
    return connection, transport


def _command(request_id: int) -> api.Command:
    return api.Command(request_id=request_id, flow=api.Flow(consumer_id=1, permits=request_id))


async def _next_turns() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def _decoded(writes: list[bytes]) -> list[int]:
    return [c.request_id for c in FrameDecoder().feed(b"".join(writes))]


async def test_frames_of_one_turn_go_out_in_one_write_without_a_cap() -> None:
    connection, transport = _connected(flush_every=0)
    for request_id in range(1, 101):
        connection.send(_command(request_id))
    assert transport.writes == []  # nothing before the turn ends
    await _next_turns()
    assert len(transport.writes) == 1
    assert _decoded(transport.writes) == list(range(1, 101))


async def test_a_capped_turn_writes_every_flush_every_frames_and_the_rest_at_its_end() -> None:
    connection, transport = _connected(flush_every=32)
    for request_id in range(1, 71):
        connection.send(_command(request_id))
    # 64 frames are already with the peer while the turn goes on
    assert [len(FrameDecoder().feed(w)) for w in transport.writes] == [32, 32]
    await _next_turns()
    assert [len(FrameDecoder().feed(w)) for w in transport.writes] == [32, 32, 6]
    assert _decoded(transport.writes) == list(range(1, 71))


async def test_a_turn_under_the_cap_costs_one_write() -> None:
    connection, transport = _connected(flush_every=32)
    for request_id in range(1, 6):
        connection.send(_command(request_id))
    await _next_turns()
    assert len(transport.writes) == 1
    assert _decoded(transport.writes) == [1, 2, 3, 4, 5]


async def test_a_negative_cap_is_refused_with_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"flush_every must be >= 0 \(0: once per loop turn\), got -1"):
        FrameConnection(flush_every=-1)
