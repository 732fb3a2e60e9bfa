"""The protocol server: accepts connections and routes each command to a service handler.

A handler answers synchronously (returns a response command, or None for no response) or
asynchronously: it returns a future (completed by callbacks, no task) or a coroutine (run as a task).
An asynchronous result that is not a command is answered with Success, so handlers need no wrapper
coroutine just to turn "done" into a response. Every response goes back through the connection's
coalesced writes with the request id of its request.

The server enforces ``ConnectionLimits`` (protocol/limits.py): at most so many connections, so many
bytes of incomplete frames across all of them, so long for a started frame to complete and for an
idle connection without state to stay open.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, cast

from txnkeeper.errors import BadRequestError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.connection import SERVER_FLUSH_EVERY, FrameConnection
from txnkeeper.protocol.frames import FrameError
from txnkeeper.protocol.limits import (
    BAD_FRAME,
    IDLE,
    PENDING_BUDGET,
    SLOW_FRAME,
    TOO_MANY_CONNECTIONS,
    UNSENT_BUDGET,
    WRITE_HIGH_WATER,
    WRITE_TIMEOUT,
    ConnectionLimits,
    ServerStats,
)

log = logging.getLogger(__name__)
_CLOSE_GRACE_S = 5.0

Response = api.Command | None
HandlerResult = Response | Awaitable[object]


class Session(Protocol):
    """What a handler sees of the connection it serves (to push messages, to learn it closed)."""

    session_id: int

    def push(self, command: api.Command) -> None: ...

    @property
    def is_open(self) -> bool: ...


class CommandHandler(Protocol):
    """A service edge: answers one command; told when a session ends so it can release its state."""

    def handle(self, session: Session, body_name: str, command: api.Command) -> HandlerResult: ...

    def session_closed(self, session: Session) -> None: ...

    def session_holds_state(self, session: Session) -> bool:
        """True while closing the session would lose something (a subscribed consumer): then it is
        not closed for being idle."""
        ...


def _success() -> api.Command:
    # a fresh command each time: the request id is stamped into it
    command = api.Command()
    command.success.SetInParent()
    return command


def error_response(exc: BaseException) -> api.Command:
    command = api.Command()
    fill_error(command.error, exc)
    return command


def fill_error(error: api.Error, exc: BaseException) -> None:
    """Describe ``exc`` in ``error`` as the peer should see it (unexpected errors are logged here)."""
    if isinstance(exc, ServiceError):
        error.code = exc.code  # type: ignore[assignment]
        error.message = str(exc)
        return
    log.exception("request failed unexpectedly", exc_info=exc)
    error.code = api.UNKNOWN_ERROR
    error.message = f"{type(exc).__name__}: {exc}"


class ServerConnection(FrameConnection):
    """One accepted connection; a ``Session`` for the handler."""

    _next_id = 0

    def __init__(
        self,
        handler: CommandHandler,
        limits: ConnectionLimits,
        registry: set[ServerConnection],
        stats: ServerStats,
    ) -> None:
        super().__init__(limits.max_frame_size, SERVER_FLUSH_EVERY)
        ServerConnection._next_id += 1
        self.session_id = ServerConnection._next_id
        self._handler = handler
        self._registry = registry
        self._limits = limits
        self._stats = stats
        self._counted = 0  # this connection's bytes in stats.pending_bytes
        self.last_received = asyncio.get_running_loop().time()
        self.frame_started: float | None = None  # when the buffered partial frame began arriving
        self.in_flight = 0  # requests still being answered: a peer waiting for one is not idle
        # Since when the peer has left more than WRITE_HIGH_WATER unsent: its requests are not read.
        self.write_paused_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=WRITE_HIGH_WATER)
        super().connection_made(transport)

    def on_open(self) -> None:
        stats = self._stats
        if len(self._registry) >= self._limits.max_connections:
            stats.refused[TOO_MANY_CONNECTIONS] += 1
            log.warning(
                "refusing connection from %s: %d connections open (max_connections %d)",
                self.peer,
                len(self._registry),
                self._limits.max_connections,
            )
            self.refuse(
                api.RESOURCE_LIMIT,
                f"server has {len(self._registry)} connections open, its limit (max connections);"
                " retry later or use fewer connections",
            )
            return
        stats.accepted += 1
        self._registry.add(self)
        stats.open_connections = len(self._registry)

    def refuse(self, code: int, message: str) -> None:
        """Tell the peer why in an error frame (request id 0), then close."""
        self.send(api.Command(request_id=0, error=api.Error(code=code, message=message)))  # type: ignore[arg-type]
        self.close()

    def close_for(self, reason: str, code: int, message: str) -> None:
        if not self.is_open:
            return
        self._stats.closed[reason] += 1
        log.warning("closing connection from %s: %s", self.peer, message)
        self.refuse(code, message)
        self._uncount()
        # A peer that reads nothing would keep the socket (and its unsent bytes) forever: the error
        # frame gets a grace period, then the connection is cut.
        asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, self.abort)

    def abort_for(self, reason: str, message: str) -> None:
        """Cut a connection whose peer does not read: an error frame would never reach it."""
        if self._transport is None:
            return
        self._stats.closed[reason] += 1
        log.warning("aborting connection from %s: %s", self.peer, message)
        self._uncount()
        self.abort()

    # --- the peer not reading what it is sent -----------------------------------------------------
    def pause_writing(self) -> None:
        if self._transport is None or self._closing or self.write_paused_since is not None:
            return
        self.write_paused_since = asyncio.get_running_loop().time()
        self._stats.write_paused += 1
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self.write_paused_since is None:
            return
        self.write_paused_since = None
        self._stats.write_paused -= 1
        if self._transport is not None and not self._closing:
            self._transport.resume_reading()
            if self._decoder.buffered:
                # the frame's remaining bytes were not read because of this pause, not the peer
                self.frame_started = asyncio.get_running_loop().time()

    def _flush(self) -> None:
        super()._flush()
        transport = self._transport
        if transport is None or self._closing:
            return
        unsent = transport.get_write_buffer_size()
        if unsent > self._limits.max_unsent_bytes:
            self.abort_for(
                UNSENT_BUDGET,
                f"its peer left {unsent} bytes of answers and messages unread, over the limit of"
                f" {self._limits.max_unsent_bytes} (max unsent bytes); the client must read what it"
                " is sent",
            )

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        decoder = self._decoder
        before = decoder.buffered
        now = self._loop.time()
        self.last_received = now
        try:
            commands = decoder.feed(data)
        except FrameError as exc:
            self.close_for(BAD_FRAME, exc.code, str(exc))
            return
        after = decoder.buffered
        if after != self._counted:
            stats = self._stats
            stats.pending_bytes += after - self._counted
            self._counted = after
            if after and stats.pending_bytes > self._limits.max_pending_bytes:
                self.close_for(
                    PENDING_BUDGET,
                    api.RESOURCE_LIMIT,
                    f"incomplete frames across this server's connections would hold"
                    f" {stats.pending_bytes} bytes, over its limit of {self._limits.max_pending_bytes}"
                    " (max pending bytes); retry later",
                )
                return
        if not after:
            self.frame_started = None
        elif not before or commands:
            self.frame_started = now
        for command in commands:
            self.on_command(command)

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def _uncount(self) -> None:
        self._decoder.reset()
        self._stats.pending_bytes -= self._counted
        self._counted = 0

    def push(self, command: api.Command) -> None:
        self.send(command)

    def on_command(self, command: api.Command) -> None:
        request_id = command.request_id
        body = command.WhichOneof("body")
        assert body is not None
        try:
            result = self._handler.handle(self, body, command)
        except Exception as exc:
            self._reply(request_id, error_response(exc))
            return
        if result is None:
            return
        if isinstance(result, api.Command):
            self._reply(request_id, result)
            return
        if isinstance(result, asyncio.Future):
            future: asyncio.Future[Any] = result
        elif inspect.iscoroutine(result):
            future = self._loop.create_task(result)
        else:
            future = asyncio.ensure_future(result, loop=self._loop)
        self.in_flight += 1
        future.add_done_callback(partial(self._complete, request_id))

    def _complete(self, request_id: int, future: asyncio.Future[Any]) -> None:
        self.in_flight -= 1
        if future.cancelled():
            self._reply(request_id, error_response(ServiceError("request cancelled (server closing)")))
            return
        exc = future.exception()
        if exc is not None:
            self._reply(request_id, error_response(exc))
            return
        response = future.result()
        self._reply(request_id, response if isinstance(response, api.Command) else _success())

    def _reply(self, request_id: int, response: api.Command) -> None:
        response.request_id = request_id
        self.send(response)

    def on_lost(self, exc: Exception | None) -> None:
        self._uncount()
        if self.write_paused_since is not None:
            self.write_paused_since = None
            self._stats.write_paused -= 1
        if self in self._registry:
            self._registry.discard(self)
            self._stats.open_connections = len(self._registry)
        else:
            return  # refused at accept: the handler never saw it
        try:
            self._handler.session_closed(self)
        except Exception:
            log.exception("session cleanup failed")


class ProtocolServer:
    """Listens on one address; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, handler: CommandHandler, limits: ConnectionLimits | None = None) -> None:
        self._handler = handler
        self.limits = limits or ConnectionLimits()
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._connections: set[ServerConnection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], ServerConnection] = lambda: ServerConnection(  # noqa: E731
            self._handler, self.limits, self._connections, self.stats
        )
        self._server = await loop.create_server(factory, host, port, reuse_address=True)
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)

    @property
    def _sweep_interval(self) -> float:
        limits = self.limits
        shortest = min(limits.idle_timeout_s, limits.frame_timeout_s, limits.write_timeout_s)
        return min(1.0, max(0.05, shortest / 4))

    def _sweep(self) -> None:
        """Close connections whose started frame is overdue, and idle ones that hold nothing."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        limits = self.limits
        for conn in list(self._connections):
            paused = conn.write_paused_since
            if paused is not None:  # its requests are not being read: neither slow nor idle
                if now - paused > limits.write_timeout_s:
                    conn.abort_for(
                        WRITE_TIMEOUT,
                        f"its peer has not read its answers for {now - paused:.1f}s (write timeout"
                        f" {limits.write_timeout_s:g}s); the client must read what it is sent",
                    )
                continue
            started = conn.frame_started
            if started is not None and now - started > limits.frame_timeout_s:
                conn.close_for(
                    SLOW_FRAME,
                    api.RESOURCE_LIMIT,
                    f"a frame started {now - started:.1f}s ago is still incomplete"
                    f" ({conn.buffered} bytes so far; frame timeout {limits.frame_timeout_s:g}s)",
                )
            elif (
                now - conn.last_received > limits.idle_timeout_s
                and not conn.in_flight
                and not self._holds_state(conn)
            ):
                conn.close_for(
                    IDLE,
                    api.RESOURCE_LIMIT,
                    f"connection sent nothing for {now - conn.last_received:.1f}s"
                    f" (idle timeout {limits.idle_timeout_s:g}s); reconnect when needed",
                )
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)

    def _holds_state(self, conn: ServerConnection) -> bool:
        try:
            return self._handler.session_holds_state(conn)
        except Exception:
            log.exception("session state check failed")
            return True

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def require(condition: bool, message: str) -> None:
    """Reject a request whose fields make no sense, with a message naming the field."""
    if not condition:
        raise BadRequestError(message)
