"""HTTPS between admin APIs: a move's target pulling from its source, a mover calling the verbs.

A pod that serves TLS reaches another pod's admin API the way it reaches its store peers: over https,
presenting its own certificate (mutual TLS) and verifying the other pod against its CA bundle. The
context comes from the pod's ``ClientTls`` (server/tls_reload.py keeps it current, so a rotated
certificate or CA bundle is used by the next pull without a restart); a CLI passes a static one. One
module so that every such caller turns a refused handshake into the sentence contract/tls.py gives
("the server does not trust our client certificate", "certificate is not signed by a trusted CA (CA
file ...)") instead of aiohttp's ``ClientConnectorCertificateError`` or an OpenSSL alert name.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.parse

import aiohttp

from txnkeeper.contract import tls as tls_contract
from txnkeeper.protocol.rpc import ClientTls

_PROBE_TIMEOUT_S = 3.0


class AdminHttps:
    """What one caller's admin requests use for ``ssl=`` and how their TLS failures read."""

    def __init__(self, tls: ClientTls | None) -> None:
        """``tls``: the caller's certificate and CA bundle; without it https:// URLs are verified
        against the system's CAs and no client certificate is presented."""
        self._tls = tls

    def ssl_for(self, url: str) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl=`` for ``url``: the current context for https:// (read per request, so a
        rotation takes effect at the next connection), aiohttp's default otherwise."""
        if self._tls is None or not url.startswith("https://"):
            return True
        return self._tls.client_context()

    async def explain(self, exc: BaseException, url: str) -> str:
        """What went wrong reaching ``url``: the TLS sentence when ``exc`` is (or wraps) a TLS
        failure, else aiohttp's own text. An expired or wrong-host certificate is fetched again to
        name its dates or names (a short blocking connect, off the event loop)."""
        cause = tls_failure(exc)
        parts = urllib.parse.urlsplit(url)
        if parts.hostname is None or parts.scheme != "https":
            return str(exc) or type(exc).__name__
        host, port = parts.hostname, parts.port or 443
        connected = not isinstance(exc, aiohttp.ClientConnectorError)  # else nothing to probe
        if cause is None and connected and isinstance(exc, OSError | aiohttp.ServerDisconnectedError):
            # Under TLS 1.3 a server refuses a client certificate after the client's handshake is
            # done: the alert may be read only after aiohttp failed to write the request, which it
            # reports as a plain connection error. One more handshake and read finds the alert.
            cause = await asyncio.to_thread(_refusal_after_handshake, host, port, self.ssl_for(url))
        if cause is None:
            return str(exc) or type(exc).__name__
        settings = self._tls.settings if self._tls is not None else None
        described = await asyncio.to_thread(
            tls_contract.describe,
            cause,
            host=host,
            port=port,
            settings=settings,
        )
        return described or str(exc)


def _refusal_after_handshake(host: str, port: int, context: ssl.SSLContext | bool) -> ssl.SSLError | None:
    """The TLS error a fresh connection to ``host:port`` meets in its handshake or first exchange
    (None: it met none; blocking, a few seconds at most)."""
    if not isinstance(context, ssl.SSLContext):
        context = ssl.create_default_context()
    try:
        with (
            socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=host) as tls,
        ):
            tls.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            tls.recv(1)
    except ssl.SSLError as err:
        return err
    except OSError:
        return None
    return None


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The ssl module's error inside an aiohttp one: a refused server certificate
    (``certificate_error``), a handshake alert (``os_error``), or an alert read after a TLS 1.3
    handshake, which aiohttp raises as a connection error caused by it."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return current
        for name in ("certificate_error", "os_error"):
            inner = getattr(current, name, None)
            if isinstance(inner, BaseException):
                pending.append(inner)
        pending.extend([current.__cause__, current.__context__])
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    return None
