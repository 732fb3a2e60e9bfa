"""How one port tells txnkeeper's own wire from Pulsar's by a connection's first bytes
(protocol/server.py ``_wire_of``): every valid first frame of either wire is told at once, invalid
own-protocol frames stay with the own decoder (which says what is wrong), and nothing that a real
client sends first is left waiting for bytes that will not come."""

from __future__ import annotations

import struct

import pytest
from pulsar_wire import connect_command

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import encode_frame
from txnkeeper.protocol.pulsar_frames import encode_command
from txnkeeper.protocol.server import _wire_of

MAX = 5 * 1024 * 1024


@pytest.mark.parametrize(
    ("first", "wire"),
    [
        (encode_command(connect_command()), "other"),
        (encode_command(connect_command(token="t" * 3000)), "other"),
        (encode_frame(api.Command(request_id=1, auth_challenge=api.AuthChallenge())), "own"),
        (encode_frame(api.Command(request_id=1, produce=api.Produce(topic="t", payload=b"x" * 100))), "own"),
        (struct.pack(">I", 0), "own"),  # an empty frame: the own decoder refuses it
        (struct.pack(">I", 1 << 30), "own"),  # oversized: refused by the own decoder at once
        (struct.pack(">I", 1000) + b"\x00" * 10, "own"),  # zeros, not a Pulsar command size
        (struct.pack(">I", 1000) + b"\x08" * 10, "own"),
        (b"\x00\x00", None),
        (struct.pack(">I", 100), None),
        (struct.pack(">I", 100) + b"\x00\x00", None),
    ],
)
def test_first_bytes_tell_the_wire(first: bytes, wire: str | None) -> None:
    assert _wire_of(first, MAX) == wire


def test_every_prefix_of_a_real_first_frame_waits_or_agrees() -> None:
    for frame, wire in (
        (encode_command(connect_command()), "other"),
        (encode_frame(api.Command(request_id=1, auth_challenge=api.AuthChallenge())), "own"),
    ):
        for cut in range(len(frame) + 1):
            assert _wire_of(frame[:cut], MAX) in (None, wire)
        assert _wire_of(frame, MAX) == wire
