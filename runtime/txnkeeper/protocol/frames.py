"""Frame codec: ``[uint32 big-endian length][Command protobuf]``, decoded incrementally.

Why a hand-rolled codec: TCP delivers byte streams, so one read may hold many frames (pipelining) or
part of one; the decoder buffers, bounds every frame by a maximum size before allocating for it, and
reports malformed input as a ``FrameError`` so the connection (and only it) can be refused.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from txnkeeper.pb import txnkeeper_api_pb2 as api

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024


class FrameError(Exception):
    """The peer sent bytes that are not a valid frame; the connection must be closed."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def encode_frame(command: api.Command) -> bytes:
    body = command.SerializeToString()
    return HEADER.pack(len(body)) + body


def encode_error(code: int, message: str) -> bytes:
    """A connection-level error frame (request id 0): why the connection is refused or closed."""
    return encode_frame(api.Command(request_id=0, error=api.Error(code=code, message=message)))  # type: ignore[arg-type]


class FrameDecoder:
    """Accumulates bytes and yields whole commands in arrival order."""

    __slots__ = ("_buffer", "_max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size <= 0:
            raise ValueError(f"max frame size must be positive, got {max_frame_size}")
        self._buffer = bytearray()
        self._max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[api.Command]:
        """Consume ``data``; return every command now complete. Raises ``FrameError`` on bad input."""
        buffer = self._buffer
        buffer += data
        commands: list[api.Command] = []
        offset = 0
        end = len(buffer)
        max_size = self._max_frame_size
        unpack_from = HEADER.unpack_from
        # Each frame is copied once, out of a view of the buffer (a bytearray slice copied twice); the view
        # is released before the consumed bytes are cut off, which a live export would forbid.
        with memoryview(buffer) as view:
            while end - offset >= 4:
                (length,) = unpack_from(buffer, offset)
                if length > max_size:
                    raise FrameError(
                        f"frame of {length} bytes exceeds the maximum of {max_size}", api.FRAME_TOO_LARGE
                    )
                start = offset + 4
                if end - start < length:
                    break
                command = api.Command()
                try:
                    command.ParseFromString(bytes(view[start : start + length]))
                except DecodeError as exc:
                    message = f"frame at byte {offset} is not a Command: {exc}"
                    raise FrameError(message, api.MALFORMED_FRAME) from exc
                if command.WhichOneof("body") is None:
                    raise FrameError(f"frame at byte {offset} carries no command", api.MALFORMED_FRAME)
                commands.append(command)
                offset = start + length
        if offset:
            del buffer[:offset]
        return commands

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def reset(self) -> None:
        """Drop whatever is buffered (a closed connection's partial frame)."""
        self._buffer = bytearray()
