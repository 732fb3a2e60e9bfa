"""The Pulsar frame decoder hands out payloads as views of the bytes they arrived in (no copies), so
bytes that frames were taken from must never change afterwards: whatever way a stream is cut into
reads, every payload a feed returned still holds its own bytes after any number of later feeds."""

from __future__ import annotations

import os
import random

import pytest

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import PulsarFrame, PulsarFrameDecoder, encode_payload_command


def send_frame(sequence_id: int, payload: bytes) -> bytes:
    command = pulsar.BaseCommand(type=pulsar.BaseCommand.SEND)
    command.send.producer_id = 1
    command.send.sequence_id = sequence_id
    metadata = pulsar.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    return encode_payload_command(command, metadata.SerializeToString(), payload)


@pytest.mark.parametrize("seed", range(6))
def test_payloads_survive_every_later_read(seed: int) -> None:
    rng = random.Random(seed)
    payloads = [os.urandom(rng.choice([0, 1, 100, 5000, 140_000])) for _ in range(40)]
    stream = b"".join(send_frame(i, p) for i, p in enumerate(payloads))
    decoder = PulsarFrameDecoder()
    frames: list[PulsarFrame] = []
    at = 0
    while at < len(stream):
        cut = min(len(stream), at + rng.choice([1, 3, 4096, 65_536, 262_144]))
        frames.extend(decoder.feed(stream[at:cut]))
        at = cut
        # everything returned so far is still intact after this read
        for i, frame in enumerate(frames):
            assert frame.payload == payloads[i]
    assert [f.command.send.sequence_id for f in frames] == list(range(len(payloads)))
    assert all(f.checksum_ok for f in frames)
    assert decoder.buffered == 0


def test_a_bad_checksum_is_reported_on_the_frame_without_copying() -> None:
    good = send_frame(7, b"payload" * 100)
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF
    decoder = PulsarFrameDecoder()
    (frame,) = decoder.feed(bytes(damaged))
    assert not frame.checksum_ok
    assert isinstance(frame.payload, memoryview) and frame.payload.readonly
