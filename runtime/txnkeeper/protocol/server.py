"""The protocol server: accepts connections and routes each command to a service handler.

A handler answers synchronously (returns a response command, or None for no response) or
asynchronously: it returns a future (completed by callbacks, no task) or a coroutine (run as a task).
An asynchronous result that is not a command is answered with Success, so handlers need no wrapper
coroutine just to turn "done" into a response. Every response goes back through the connection's
coalesced writes with the request id of its request.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.connection import FrameConnection
from txnkeeper.protocol.errors import BadRequestError, ServiceError
from txnkeeper.protocol.frames import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger(__name__)

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

    def __init__(self, handler: CommandHandler, max_frame_size: int, registry: set[ServerConnection]) -> None:
        super().__init__(max_frame_size)
        ServerConnection._next_id += 1
        self.session_id = ServerConnection._next_id
        self._handler = handler
        self._registry = registry

    def on_open(self) -> None:
        self._registry.add(self)

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
            future = asyncio.get_running_loop().create_task(result)
        else:
            future = asyncio.ensure_future(result)
        future.add_done_callback(partial(self._complete, request_id))

    def _complete(self, request_id: int, future: asyncio.Future[Any]) -> None:
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
        self._registry.discard(self)
        try:
            self._handler.session_closed(self)
        except Exception:
            log.exception("session cleanup failed")


class ProtocolServer:
    """Listens on one address; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, handler: CommandHandler, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._handler = handler
        self._max_frame_size = max_frame_size
        self._server: asyncio.Server | None = None
        self._connections: set[ServerConnection] = set()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], ServerConnection] = lambda: ServerConnection(  # noqa: E731
            self._handler, self._max_frame_size, self._connections
        )
        self._server = await loop.create_server(factory, host, port, reuse_address=True)

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def close(self) -> None:
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
