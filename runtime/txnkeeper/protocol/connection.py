"""One TCP connection speaking frames, with coalesced writes.

Why coalescing: with many pipelined requests, writing every response on its own costs a syscall
each; ``send`` only queues the frame and one callback per event-loop turn writes everything queued
in a single ``transport.write``. Reads are parsed in ``data_received`` without creating tasks.

Why the coalescing is capped (``flush_every``): a turn that queues hundreds of frames would hand
them to the peer only when the turn ends, so the peer idles while this process works and then this
process idles while the peer works through all of them: with three processes on two cores every
transaction moved in one convoy and each event loop was busy a third of the time. Writing every
``flush_every`` frames at once lets the peer start on the first ones while the rest are built; a
turn with fewer frames than that still costs one write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, Protocol, TypeVar, cast

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    FrameError,
    encode_error,
    encode_frame,
)

log = logging.getLogger(__name__)

# Frames written at once before a turn ends (see the module docstring). Measured at 256 transactions
# in flight (docs/performance.md, 2026-11-25): 32, 64 and 128 alike on a quiet machine (64 slightly
# ahead), 16 costs more writes than it gains. A turn of 64 frames or fewer is unchanged.
CLIENT_FLUSH_EVERY = 64
SERVER_FLUSH_EVERY = 64


CommandT = TypeVar("CommandT")


class Decoder(Protocol[CommandT]):
    """An incremental frame decoder: txnkeeper's own (frames.FrameDecoder) or Pulsar's
    (pulsar_frames.PulsarFrameDecoder). ``feed`` raises ``FrameError`` on bad input."""

    def feed(self, data: bytes) -> list[CommandT]: ...

    @property
    def buffered(self) -> int: ...

    def reset(self) -> None: ...


class WireConnection(asyncio.Protocol, Generic[CommandT]):
    """Base protocol of either wire: decode incoming frames into ``on_command``; ``send_frame``
    queues outgoing ones (coalesced, see the module docstring)."""

    def __init__(self, decoder: Decoder[CommandT], flush_every: int = 0) -> None:
        if flush_every < 0:
            raise ValueError(f"flush_every must be >= 0 (0: once per loop turn), got {flush_every}")
        self._decoder = decoder
        self._flush_every = flush_every
        self._transport: asyncio.Transport | None = None
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._closing = False
        # Kept: asyncio.get_running_loop() costs a getpid() system call per call on CPython 3.11,
        # and a connection lives on the loop that made it.
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.peer: str = "?"

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not an asyncio.Transport subclass on every loop (uvloop's is not).
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.on_open()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            commands = self._decoder.feed(data)
        except FrameError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.send_error_frame(exc.code, str(exc))
            self.close()
            return
        for command in commands:
            self.on_command(command)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._transport = None
        self._outgoing.clear()
        self._decoder.reset()
        if not self.closed.done():
            self.closed.set_result(None)
        self.on_lost(exc)

    # --- outgoing ----------------------------------------------------------------------------------
    def send_frame(self, frame: bytes) -> None:
        """Queue one encoded frame (``send`` for a caller that needs the frame's size first)."""
        outgoing = self._outgoing
        outgoing.append(frame)
        if len(outgoing) == self._flush_every:
            self._flush()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is None or not self._outgoing:
            return
        chunks = self._outgoing
        self._outgoing = []
        self._transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def close(self) -> None:
        """Flush what is queued, then close (the error frame of a refused connection gets out)."""
        if self._closing:
            return
        self._closing = True
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._closing

    # --- for subclasses ----------------------------------------------------------------------------
    def on_open(self) -> None:
        """Called once the transport is connected."""

    def on_command(self, command: CommandT) -> None:
        raise NotImplementedError

    def send_error_frame(self, code: int, message: str) -> None:
        """Queue the wire's connection-level error (``code``: txnkeeper's ErrorCode) for the peer."""
        raise NotImplementedError

    def on_lost(self, exc: Exception | None) -> None:
        """Called once when the connection is gone."""


class FrameConnection(WireConnection[api.Command]):
    """A connection speaking txnkeeper's own frames (``[uint32 length][Command]``)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, flush_every: int = 0) -> None:
        super().__init__(FrameDecoder(max_frame_size), flush_every)

    def send(self, command: api.Command) -> None:
        if self._transport is None:
            return
        self.send_frame(encode_frame(command))

    def send_error_frame(self, code: int, message: str) -> None:
        if self._transport is not None:
            self.send_frame(encode_error(code, message))
