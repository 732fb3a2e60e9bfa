"""Client side of a connection: pipelined requests matched to responses by request id.

Used by the client library and by coordinators ending transactions on stores. Many requests may be
in flight on one connection; each gets a future, resolved when its response frame arrives, failed
when an error frame or the loss of the connection says it cannot complete.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol

from txnkeeper.contract import tls as tls_contract
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.errors import (
    ConnectionClosedError,
    RequestTimeoutError,
    ServiceError,
    TlsHandshakeError,
    from_error_frame,
)
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.connection import CLIENT_FLUSH_EVERY, FrameConnection
from txnkeeper.protocol.frames import DEFAULT_MAX_FRAME_SIZE

SWEEP_INTERVAL = 0.25


class ClientTls(Protocol):
    """What a connection needs to speak TLS: the context for a new connection (the current one, where
    certificates rotate) and the settings it came from (the CA file an error names)."""

    @property
    def settings(self) -> TlsClientSettings: ...

    def client_context(self) -> ssl.SSLContext: ...


class StaticClientTls:
    """``ClientTls`` from settings read once (a client process; pods use their reloading source)."""

    def __init__(self, settings: TlsClientSettings) -> None:
        self._settings = settings
        self._context = settings.context()

    @property
    def settings(self) -> TlsClientSettings:
        return self._settings

    def client_context(self) -> ssl.SSLContext:
        return self._context


class RpcConnection(FrameConnection):
    """A connected client endpoint. Server pushes (request id 0) go to ``on_push``."""

    def __init__(
        self,
        on_push: Callable[[api.Command], None] | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        super().__init__(max_frame_size, CLIENT_FLUSH_EVERY)
        self._pending: dict[int, asyncio.Future[api.Command]] = {}
        # request id -> (deadline, request); checked by one periodic sweep instead of a timer per request
        self._deadlines: dict[int, tuple[float, api.Command]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._next_request_id = 1
        self._on_push = on_push
        self.address = "?"
        self.lost_reason: str | None = None
        # With TLS: turns a TLS failure seen after the handshake (TLS 1.3 servers refuse a missing
        # client certificate only then) into the sentence contract/tls.py gives it.
        self.tls_settings: TlsClientSettings | None = None

    def request(self, command: api.Command, timeout: float | None = None) -> asyncio.Future[api.Command]:
        """Send ``command``; the future resolves to the response command or fails with ServiceError
        (``RequestTimeoutError`` when ``timeout`` seconds pass without a response, to within ~0.25 s)."""
        loop = self._loop
        future: asyncio.Future[api.Command] = loop.create_future()
        if not self.is_open:
            future.set_exception(ConnectionClosedError(f"connection to {self.address} is closed"))
            return future
        request_id = self._next_request_id
        self._next_request_id += 1
        command.request_id = request_id
        self._pending[request_id] = future
        if timeout is not None:
            self._deadlines[request_id] = (loop.time() + timeout, command)
            if self._sweeper is None:
                self._sweeper = loop.call_later(SWEEP_INTERVAL, self._sweep)
        self.send(command)
        return future

    def _sweep(self) -> None:
        self._sweeper = None
        now = asyncio.get_running_loop().time()
        for request_id, (deadline, command) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[request_id]
                future = self._pending.pop(request_id, None)
                if future is not None and not future.done():
                    # The request's kind is named only here, not on every request's path.
                    what = command.WhichOneof("body")
                    future.set_exception(
                        RequestTimeoutError(f"no response from {self.address} to {what} in time")
                    )
        if self._deadlines and self.is_open:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)

    def notify(self, command: api.Command) -> None:
        """Send a command that gets no response (e.g. Flow)."""
        command.request_id = 0
        self.send(command)

    def on_command(self, command: api.Command) -> None:
        request_id = command.request_id
        if request_id == 0:
            if command.HasField("error"):
                self.lost_reason = command.error.message
            elif self._on_push is not None:
                self._on_push(command)
            return
        future = self._pending.pop(request_id, None)
        if self._deadlines:
            self._deadlines.pop(request_id, None)
        if future is None or future.done():
            return
        if command.HasField("error"):
            future.set_exception(from_error_frame(command.error))
        else:
            future.set_result(command)

    def on_lost(self, exc: Exception | None) -> None:
        reason = self.lost_reason or (str(exc) if exc else "closed")
        if exc is not None and self.tls_settings is not None and self.address != "?":
            host, port = split_address(self.address)
            described = tls_contract.describe(
                exc, host=host, port=port, settings=self.tls_settings, probe=False
            )
            reason = described or reason
        pending = self._pending
        self._pending = {}
        self._deadlines.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionClosedError(f"connection to {self.address} lost: {reason}"))


async def connect(
    address: str,
    on_push: Callable[[api.Command], None] | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    connect_timeout: float = 10.0,
    *,
    tls: ClientTls | None = None,
) -> RpcConnection:
    """Open a connection to ``host:port`` (over TLS with ``tls``: the server verified against its CA
    file and name; a refused certificate raises ``TlsHandshakeError`` saying which and why)."""
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    context = tls.client_context() if tls is not None else None
    server_hostname = None
    if tls is not None:
        server_hostname = tls.settings.server_hostname or host
    try:
        _, protocol = await asyncio.wait_for(
            loop.create_connection(
                lambda: RpcConnection(on_push, max_frame_size),
                host,
                port,
                ssl=context,
                server_hostname=server_hostname,
            ),
            connect_timeout,
        )
    except (OSError, TimeoutError) as exc:
        if tls is not None and isinstance(exc, ssl.SSLError):
            described = await asyncio.to_thread(
                tls_contract.describe, exc, host=host, port=port, settings=tls.settings
            )
            raise TlsHandshakeError(f"cannot connect to {address}: {described or exc}") from exc
        raise ConnectionClosedError(f"cannot connect to {address}: {exc}") from exc
    protocol.address = address
    if tls is not None:
        protocol.tls_settings = tls.settings
    return protocol


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def expect(response: api.Command, body: str) -> api.Command:
    """Check a response is the kind the request expects (a protocol bug otherwise)."""
    if response.WhichOneof("body") != body:
        raise ServiceError(f"expected {body} response, got {response.WhichOneof('body')}")
    return response
