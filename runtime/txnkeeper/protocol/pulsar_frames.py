"""Pulsar's binary frame format, decoded incrementally and bounded before anything is allocated.

Why its own codec: Pulsar's clients speak ``[uint32 total size][uint32 command size][BaseCommand]``,
and a command that carries a message (SEND from a producer, MESSAGE to a consumer) is followed by
``[magic 0x0e01][uint32 CRC32C][uint32 metadata size][MessageMetadata][payload]``, the checksum
covering everything after itself (Pulsar's ``Commands.serializeCommandSendWithSize``). Clients older
than protocol v6 leave the magic and checksum out; a broker sending to a consumer that asked for it
may put ``[magic 0x0e02][uint32 size][BrokerEntryMetadata]`` first. All sizes are big-endian.

A frame that cannot be one (sizes that do not add up, a command that does not parse or lacks its
required fields) is a ``FrameError``: the connection is closed with a reason. A checksum that does
not match is not: Pulsar answers that SEND with ``ChecksumError`` and keeps the connection, so the
decoder reports it on the frame (``checksum_ok``) for the handler to refuse.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, cast

from crc32c import crc32c as _crc32c
from google.protobuf.message import DecodeError

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import FrameError

_SIZES = struct.Struct(">II")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
# Pulsar's default maxMessageSize (5 MiB) and the room its frames may take beyond a message of that
# size (Commands.MESSAGE_SIZE_FRAME_PADDING): what CONNECTED tells clients and what a frame may be.
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_PADDING = 10 * 1024


# Pulsar numbers each command's field in BaseCommand as its type.
_BODY_BY_TYPE = {
    number: field.name
    for number, field in pulsar.BaseCommand.DESCRIPTOR.fields_by_number.items()
    if number != 1
}


def crc32c(data: bytes | memoryview) -> int:
    return int(_crc32c(data))


class PulsarFrame(NamedTuple):
    """One decoded frame: the command, and for SEND/MESSAGE the metadata bytes (MessageMetadata,
    still serialized: it is stored and forwarded verbatim) and the payload."""

    command: pulsar.BaseCommand
    metadata: bytes = b""
    payload: bytes | memoryview = b""  # a read-only view of the bytes it arrived in (``feed``)
    checksum_ok: bool = True  # False: a checksum was present and did not match
    has_payload: bool = False


def encode_command(command: pulsar.BaseCommand) -> bytes:
    body = command.SerializeToString()
    return _SIZES.pack(len(body) + 4, len(body)) + body


def encode_payload_command(command: pulsar.BaseCommand, metadata: bytes, payload: bytes) -> bytes:
    """A command followed by a message (checksummed, as protocol v6+ peers expect)."""
    body = command.SerializeToString()
    checked = _U32.pack(len(metadata)) + metadata + payload
    total = 4 + len(body) + 2 + 4 + len(checked)
    return b"".join(
        (_SIZES.pack(total, len(body)), body, _U16.pack(MAGIC_CRC32C), _U32.pack(crc32c(checked)), checked)
    )


class PulsarFrameDecoder:
    """Accumulates bytes and yields whole ``PulsarFrame``s in arrival order."""

    __slots__ = ("_buffer", "_max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_MESSAGE_SIZE + FRAME_PADDING) -> None:
        if max_frame_size <= 0:
            raise ValueError(f"max frame size must be positive, got {max_frame_size}")
        self._buffer = bytearray()
        self._max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[PulsarFrame]:
        """Consume ``data``; return every frame now complete. Raises ``FrameError`` on bad input.

        The frames' payloads are views of the bytes they arrived in, not copies: a producer's batch
        (up to 128 KiB from Pulsar's clients) was copied five times between the socket and the
        ledger, and each copy of that size is a fresh mapping the C heap maps and unmaps. So bytes
        that frames were taken from are never changed again: what is left of them after the last
        whole frame moves to a new buffer.
        """
        source: bytes | bytearray
        if self._buffer:
            self._buffer += data
            source = self._buffer
        else:
            source = data
        frames: list[PulsarFrame] = []
        offset = 0
        end = len(source)
        view = memoryview(source).toreadonly()
        while end - offset >= 4:
            (total,) = _U32.unpack_from(source, offset)
            if total > self._max_frame_size:
                raise FrameError(
                    f"frame of {total} bytes exceeds the maximum of {self._max_frame_size}"
                    " (the max_message_size this server announced in CONNECTED, plus framing)",
                    api.FRAME_TOO_LARGE,
                )
            if total < 4:
                raise FrameError(
                    f"frame at byte {offset} declares {total} bytes, too few for its command size",
                    api.MALFORMED_FRAME,
                )
            start = offset + 4
            if end - start < total:
                break
            frames.append(_decode_frame(view[start : start + total], offset))
            offset = start + total
        if offset:
            self._buffer = bytearray(view[offset:])
        elif source is data:
            self._buffer = bytearray(data)
        else:
            view.release()  # nothing taken: the buffer grows in place on the next read
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def reset(self) -> None:
        self._buffer = bytearray()


def _malformed(offset: int, why: str) -> FrameError:
    return FrameError(f"frame at byte {offset} is not a Pulsar frame: {why}", api.MALFORMED_FRAME)


def _decode_frame(frame: memoryview, offset: int) -> PulsarFrame:
    """``frame``: the bytes after the total size."""
    (command_size,) = _U32.unpack_from(frame, 0)
    if command_size > len(frame) - 4:
        raise _malformed(offset, f"command size {command_size} exceeds the frame's {len(frame) - 4} bytes")
    command = pulsar.BaseCommand()
    try:
        command.ParseFromString(bytes(frame[4 : 4 + command_size]))
    except DecodeError as exc:
        raise _malformed(offset, f"the command does not parse ({exc})") from exc
    # Parsing does not check proto2's required fields: an unknown type reads as the enum's first
    # value (CONNECT), a SEND without its body as producer 0. Both are refused here.
    body = _BODY_BY_TYPE.get(command.type) if command.HasField("type") else None
    if body is None:
        raise _malformed(offset, "the command has no type this server knows")
    present = any(field.number == command.type for field, _ in command.ListFields())
    if not present or not command.IsInitialized():
        missing = ", ".join(cast(Any, command).FindInitializationErrors()) or body
        raise _malformed(offset, f"{pulsar.BaseCommand.Type.Name(command.type)} lacks {missing}")
    rest = 4 + command_size
    if rest == len(frame):
        return PulsarFrame(command)
    return _with_payload(command, frame, rest, offset)


def _with_payload(command: pulsar.BaseCommand, frame: memoryview, at: int, offset: int) -> PulsarFrame:
    size = len(frame)
    if size - at >= 2 and _U16.unpack_from(frame, at)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if size - at < 6:
            raise _malformed(offset, "broker entry metadata without its size")
        (skip,) = _U32.unpack_from(frame, at + 2)
        at += 6 + skip
        if at > size:
            raise _malformed(offset, "broker entry metadata runs past the frame")
    checksum_ok = True
    if size - at >= 2 and _U16.unpack_from(frame, at)[0] == MAGIC_CRC32C:
        if size - at < 6:
            raise _malformed(offset, "checksum magic without a checksum")
        (expected,) = _U32.unpack_from(frame, at + 2)
        at += 6
        checksum_ok = crc32c(frame[at:]) == expected
    if size - at < 4:
        raise _malformed(offset, "a payload without its metadata size")
    (metadata_size,) = _U32.unpack_from(frame, at)
    at += 4
    if metadata_size > size - at:
        raise _malformed(offset, f"metadata size {metadata_size} exceeds the {size - at} bytes left")
    metadata = bytes(frame[at : at + metadata_size])  # small, and kept: stored with the message
    return PulsarFrame(command, metadata, frame[at + metadata_size :], checksum_ok, True)
