"""Connections that speak Pulsar's binary protocol, held to the same limits as txnkeeper's own.

Why here and not in the handler: what a Pulsar connection shares with an own-protocol one (the
connection caps, the budgets for incomplete frames and for unsent pushes, the idle, frame and write
timeouts) lives in ``BaseServerConnection``; this class adds only Pulsar's framing and how a failed
command is answered. Which command means what is the handler's (``server/pulsar_handler.py``).

``WireSniffer`` lets one port serve both wires: the fifth byte of a Pulsar frame is the high byte of
its command size (always 0: commands are far below 16 MiB), while an own-protocol frame's fifth byte
starts a protobuf field tag, which is never 0. It waits for five bytes (any real first frame has
them), then hands the socket to the connection of that wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, cast

from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.pulsar_frames import PulsarFrame, PulsarFrameDecoder, encode_command
from txnkeeper.protocol.server import BaseServerConnection, ConnectionBook, SessionHandler, as_future

log = logging.getLogger(__name__)

PulsarResult = bytes | None | Awaitable[bytes | None]
# CommandError needs a request id; a connection-level error answers no request. Pulsar's clients
# count request ids up from 0, so the highest id names none of theirs.
NO_REQUEST = 2**64 - 1

_SERVER_ERROR: dict[int, int] = {
    api.UNKNOWN_ERROR: pulsar.UnknownError,
    api.MALFORMED_FRAME: pulsar.NotAllowedError,
    api.FRAME_TOO_LARGE: pulsar.NotAllowedError,
    api.BAD_REQUEST: pulsar.NotAllowedError,
    api.TXN_NOT_FOUND: pulsar.TransactionNotFound,
    api.INVALID_TXN_STATUS: pulsar.InvalidTxnStatus,
    api.TXN_CONFLICT: pulsar.TransactionConflict,
    api.NOT_SERVED_HERE: pulsar.ServiceNotReady,
    api.UNAVAILABLE: pulsar.ServiceNotReady,
    api.CONSUMER_BUSY: pulsar.ConsumerBusy,
    api.SERVER_CLOSING: pulsar.ServiceNotReady,
    api.UNAUTHORIZED: pulsar.AuthorizationError,
    api.RESOURCE_LIMIT: pulsar.TooManyRequests,
    api.WRITER_FENCED: pulsar.ProducerFenced,
    api.TOO_MANY_WRITERS: pulsar.ProducerBusy,
    api.UNSUPPORTED_FEATURE: pulsar.NotAllowedError,
    api.DATA_UNREADABLE: pulsar.PersistenceError,
    api.BACKLOG_QUOTA_EXCEEDED: pulsar.ProducerBlockedQuotaExceededException,
}


def server_error(code: int) -> int:
    """Pulsar's ServerError for txnkeeper's ErrorCode ``code``."""
    return _SERVER_ERROR.get(code, pulsar.UnknownError)


def error_command(request_id: int, error: int, message: str) -> pulsar.BaseCommand:
    command = pulsar.BaseCommand(type=pulsar.BaseCommand.ERROR)
    command.error.request_id = request_id
    command.error.error = error  # type: ignore[assignment]
    command.error.message = message
    return command


class PulsarSession(Protocol):
    """What the Pulsar handler sees of a connection."""

    session_id: int
    peer_host: str

    def send_frame(self, frame: bytes) -> None: ...

    def push_frame(self, frame: bytes) -> None: ...

    def ready_for_push(self) -> bool: ...

    def request_began(self, size: int) -> None:
        """A request answered later than its command returns (a SEND, until its receipt) holds
        ``size`` bytes: counted against the connection's and the process's request budgets."""
        ...

    def request_ended(self, size: int) -> None: ...

    def close_for_protocol(self, message: str) -> None: ...

    @property
    def is_open(self) -> bool: ...


class PulsarHandler(SessionHandler, Protocol):
    def handle(self, session: PulsarSession, frame: PulsarFrame) -> PulsarResult:
        """Answer one frame: encoded response frame(s), None for no answer, or an awaitable of them."""
        ...

    def error_reply(self, frame: PulsarFrame, exc: BaseException) -> bytes | None:
        """The answer Pulsar's protocol gives to ``frame`` failing with ``exc`` (None: none)."""
        ...


class PulsarServerConnection(BaseServerConnection[PulsarFrame]):
    """One accepted connection speaking Pulsar's protocol; a ``PulsarSession`` for the handler."""

    def __init__(self, book: ConnectionBook, handler: PulsarHandler) -> None:
        super().__init__(book, PulsarFrameDecoder(book.limits.max_frame_size), handler)
        self._pulsar = handler

    def send_error_frame(self, code: int, message: str) -> None:
        if self._transport is not None:
            self.send_frame(encode_command(error_command(NO_REQUEST, server_error(code), message)))

    def close_for_protocol(self, message: str) -> None:
        """Close after a command the protocol does not allow here (before CONNECT, say)."""
        self.close_for("protocol", api.BAD_REQUEST, message)

    def on_command(self, command: PulsarFrame) -> None:
        try:
            result = self._pulsar.handle(self, command)
        except Exception as exc:
            self._answer_failure(command, exc)
            return
        if result is None:
            return
        if isinstance(result, bytes):
            self.send_frame(result)
            return
        future = as_future(self._loop, result)
        self.answer_later(future, frame_size(command), partial(self._answer, command))

    def _answer(self, frame: PulsarFrame, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._answer_failure(frame, ConnectionAbortedError("request cancelled (server closing)"))
            return
        exc = future.exception()
        if exc is not None:
            self._answer_failure(frame, exc)
            return
        answer = future.result()
        if answer is not None:
            self.send_frame(cast(bytes, answer))

    def _answer_failure(self, frame: PulsarFrame, exc: BaseException) -> None:
        try:
            reply = self._pulsar.error_reply(frame, exc)
        except Exception:
            log.exception("answering a failed Pulsar command failed; closing the connection")
            self.close_for("protocol", api.UNKNOWN_ERROR, "the server could not answer a command")
            return
        if reply is not None:
            self.send_frame(reply)


def frame_size(frame: PulsarFrame) -> int:
    """The bytes a request holds while it waits for its answer (its command and message)."""
    return frame.command.ByteSize() + len(frame.metadata) + len(frame.payload)


def pulsar_wire(handler: PulsarHandler) -> Callable[[ConnectionBook], BaseServerConnection[Any]]:
    """A ``ProtocolServer``'s ``other_wire``: Pulsar's protocol beside txnkeeper's own on one port."""
    return partial(PulsarServerConnection, handler=handler)
