"""One pipelined connection per server address, opened once however many callers race, reopened after
a loss. Clients reach coordinators and stores through it, and coordinators reach store pods the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import ClientTls, RpcConnection, connect


class ConnectionPool:
    """address -> live connection; pushes (consumer messages) go to the handler of that address."""

    def __init__(
        self,
        operation_timeout: float,
        on_connect: Callable[[RpcConnection], Awaitable[None]] | None = None,
        *,
        tls: ClientTls | None = None,
    ) -> None:
        """``tls``: every connection speaks TLS with the context it holds at the connect."""
        self._operation_timeout = operation_timeout
        self._tls = tls
        # Run on every new connection before any request uses it (a coordinator's handshake).
        self._on_connect = on_connect
        self._connections: dict[str, RpcConnection] = {}
        self._connecting: dict[str, asyncio.Future[RpcConnection]] = {}
        self._push_handlers: dict[str, Callable[[RpcConnection, api.Command], None]] = {}
        self._closed = False

    def on_push(self, address: str, handler: Callable[[RpcConnection, api.Command], None]) -> None:
        self._push_handlers[address] = handler

    async def get(self, address: str) -> RpcConnection:
        conn = self._connections.get(address)
        if conn is not None and conn.is_open:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[RpcConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            holder: list[RpcConnection] = []

            def push(command: api.Command) -> None:
                handler = self._push_handlers.get(address)
                if handler is not None and holder:
                    handler(holder[0], command)

            conn = await connect(address, push, tls=self._tls)
            holder.append(conn)
            if self._on_connect is not None:
                try:
                    await self._on_connect(conn)
                except BaseException:
                    conn.close()
                    raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._connecting[address]
        self._connections[address] = conn
        future.set_result(conn)
        return conn

    def request(self, address: str, command: api.Command) -> Awaitable[api.Command]:
        """Send ``command`` to ``address``; ``OperationTimeoutError`` after the operation timeout.

        A plain function: on a live connection the request is sent at the call and its future is
        returned, so callers need no coroutine (nor task) per request; only a (re)connect awaits.
        """
        conn = self._connections.get(address)
        if conn is not None and conn.is_open:
            return conn.request(command, self._operation_timeout)
        return self._connect_and_request(address, command)

    async def _connect_and_request(self, address: str, command: api.Command) -> api.Command:
        conn = await self.get(address)
        return await conn.request(command, self._operation_timeout)

    async def close(self) -> None:
        self._closed = True
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
