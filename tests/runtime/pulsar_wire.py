"""A raw Pulsar-protocol connection for tests that must send what no real client would (hostile input)
or look at single frames: blocking socket, every read bounded by a deadline."""

from __future__ import annotations

import socket
import struct
import time

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import (
    PulsarFrame,
    PulsarFrameDecoder,
    encode_command,
    encode_payload_command,
)

T = pulsar.BaseCommand


def command(kind: int) -> pulsar.BaseCommand:
    return pulsar.BaseCommand(type=kind)  # type: ignore[arg-type]


def connect_command(protocol_version: int = 19, token: str | None = None) -> pulsar.BaseCommand:
    connect = command(T.CONNECT)
    connect.connect.client_version = "txnkeeper-tests"
    connect.connect.protocol_version = protocol_version
    if token is not None:
        connect.connect.auth_method_name = "token"
        connect.connect.auth_data = token.encode()
    return connect


def metadata(producer_name: str = "raw", sequence_id: int = 0, **fields: object) -> bytes:
    meta = pulsar.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id, publish_time=1)
    for name, value in fields.items():
        setattr(meta, name, value)
    return meta.SerializeToString()


class RawPulsar:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.timeout = timeout
        self._decoder = PulsarFrameDecoder()
        self._frames: list[PulsarFrame] = []
        self.closed = False

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, cmd: pulsar.BaseCommand) -> None:
        self.sock.sendall(encode_command(cmd))

    def handshake(self, token: str | None = None) -> pulsar.BaseCommand:
        self.send(connect_command(token=token))
        return self.expect(T.CONNECTED)

    def read(self, deadline_s: float | None = None) -> PulsarFrame | None:
        """The next frame, or None once the server closed the connection."""
        deadline = time.monotonic() + (deadline_s or self.timeout)
        while not self._frames:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the server in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    def expect(self, kind: int) -> pulsar.BaseCommand:
        frame = self.read()
        assert frame is not None, f"connection closed while waiting for {T.Type.Name(kind)}"  # type: ignore[arg-type]
        got = frame.command
        assert got.type == kind, f"expected {T.Type.Name(kind)}, got {got}"  # type: ignore[arg-type]
        return got

    def read_until_closed(self, deadline_s: float = 10.0) -> list[pulsar.BaseCommand]:
        """Every frame until the server closes the connection (within ``deadline_s``)."""
        frames: list[pulsar.BaseCommand] = []
        deadline = time.monotonic() + deadline_s
        while True:
            frame = self.read(max(0.01, deadline - time.monotonic()))
            if frame is None:
                return frames
            frames.append(frame.command)

    def close(self) -> None:
        self.sock.close()


def send_frame(
    producer_id: int, sequence_id: int, meta: bytes, payload: bytes, *, corrupt: bool = False
) -> bytes:
    """A SEND frame with its checksum (``corrupt``: one payload byte changed after the checksum)."""

    cmd = command(T.SEND)
    cmd.send.producer_id = producer_id
    cmd.send.sequence_id = sequence_id
    frame = bytearray(encode_payload_command(cmd, meta, payload))
    if corrupt:
        frame[-1] ^= 0xFF
    return bytes(frame)


def frame_of_size(total: int) -> bytes:
    """Only the first 8 bytes of a frame claiming ``total`` bytes (a size header, a command size)."""
    return struct.pack(">II", total, 4)


def free_port() -> int:
    """A port nothing listens on now (the pods of a test must know each other's before they start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def placement_flags(store_port: int, coordinator_port: int) -> list[str]:
    """Serve flags of one store pod and one coordinator pod that tell Pulsar clients where each is."""
    return [
        "--pulsar-urls",
        f"pulsar://127.0.0.1:{store_port}",
        "--pulsar-coordinator-urls",
        f"pulsar://127.0.0.1:{coordinator_port}",
    ]
