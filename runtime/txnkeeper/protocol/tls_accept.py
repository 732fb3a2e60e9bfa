"""Server-side TLS: the current certificate for each new connection, and a log line for a failed handshake.

``loop.create_server(ssl=context)`` binds one SSLContext for the listener's life, and asyncio reports a
failed handshake only at debug level. Here the listener's protocol factory wraps each accepted socket in
the loop's TLS protocol (what ``ssl=`` uses: uvloop's, or asyncio's ``sslproto.SSLProtocol`` where client
certificates are checked, see ``tls_factory``) with the context its ``TlsSource`` holds at that moment: a
rotated certificate serves every connection opened after the rotation while those already open keep
theirs. A plaintext
client, a client without a certificate where one is required, or one that does not trust us is refused
at the handshake with one warning line (no traceback) and counted; the wire's own connection object only
sees connections that completed the handshake.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

log = logging.getLogger(__name__)


class TlsSource(Protocol):
    """Where a listener gets the SSL context for its next connection (server/tls_reload.py)."""

    def server_context(self, listener: str) -> ssl.SSLContext: ...

    def handshake_failed(self, listener: str) -> None: ...


def refusal_reason(exc: BaseException) -> str:
    """Why a server-side handshake failed, for the log line."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its client certificate was refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).upper()
        if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
            return "it sent no client certificate and this listener requires one"
        if "HTTP_REQUEST" in reason or "WRONG_VERSION_NUMBER" in reason or "UNKNOWN_PROTOCOL" in reason:
            return "it did not start a TLS handshake (a plaintext client on a TLS port?)"
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "CERTIFICATE_UNKNOWN" in reason:
            return f"it does not trust this server's certificate ({exc.reason})"
        return f"TLS handshake failed: {exc.reason or exc}"
    if isinstance(exc, TimeoutError):
        return "it did not complete the TLS handshake in time"
    return f"the connection ended during the TLS handshake ({type(exc).__name__}: {exc})"


class _Accepting(sslproto.SSLProtocol):
    """asyncio's own TLS protocol (what ``create_server(ssl=...)`` uses), remembering its peer for the
    log line of a refused handshake."""

    peer: object = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = transport.get_extra_info("peername")
        super().connection_made(transport)

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            # asyncio drops the connection without sending the TLS alert OpenSSL wrote: send it, so
            # the client learns why ("certificate required", "unknown CA") instead of a reset.
            self._process_outgoing()  # type: ignore[attr-defined]
        super()._on_handshake_complete(handshake_exc)


try:  # uvloop is a dependency except on Windows
    import uvloop.loop as _uv

    class _UvAccepting(_uv.SSLProtocol):  # type: ignore[misc,name-defined]
        peer: object = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.peer = transport.get_extra_info("peername")
            super().connection_made(transport)

    _UvLoop = _uv.Loop
except ImportError:
    _UvAccepting = None  # type: ignore[assignment,misc]
    _UvLoop = None  # type: ignore[assignment,misc]


def _handshake_done(
    source: TlsSource, listener: str, accepting: _Accepting, waiter: asyncio.Future[None]
) -> None:
    if waiter.cancelled():
        return
    exc = waiter.exception()
    if exc is None:
        return
    source.handshake_failed(listener)
    log.warning(
        "refusing %s connection from %s: %s", listener, _peer_text(accepting.peer), refusal_reason(exc)
    )


def _peer_text(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def tls_factory(
    inner: Callable[[], asyncio.Protocol], source: TlsSource, listener: str, handshake_timeout: float
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for ``loop.create_server`` that upgrades each connection to TLS first."""

    def accept() -> asyncio.Protocol:
        # Called by the loop for each accepted socket: the context is the one current right now.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        context = source.server_context(listener)
        # uvloop's TLS protocol (Cython; asyncio's is pure Python) drops a refused handshake without
        # its alert; where client certificates are checked the client must learn why it was refused,
        # so asyncio's (which sends it, _Accepting) serves there.
        uv = _UvAccepting is not None and isinstance(loop, _UvLoop) and context.verify_mode == ssl.CERT_NONE
        accepting = (_UvAccepting if uv else _Accepting)(
            loop,
            inner(),
            context,
            waiter,
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]  # stub says int
        )
        waiter.add_done_callback(partial(_handshake_done, source, listener, accepting))
        return cast(asyncio.Protocol, accepting)  # a BufferedProtocol: the loop takes either

    return accept
