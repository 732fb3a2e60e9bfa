"""The client side of TLS: the settings and SSL contexts every txnkeeper client uses, and the errors it shows.

One module for all of them (the Python client, the CLI, the operator's admin client, the verifier's and
the Spark source's HTTP fetches, pod-to-pod connections) so that a user sees the same sentence whichever
tool failed: "certificate has expired (notAfter ...)", "hostname mismatch: certificate is for X, not Y",
"certificate is not signed by a trusted CA (CA file F)", "the server requires a client certificate".
OpenSSL's own text ("CERTIFICATE_VERIFY_FAILED", "tlsv13 alert certificate required") names none of
those plainly. It is in the contract package because the operator (which imports nothing else of the
runtime) reaches pods' admin APIs over HTTPS with it. It needs the standard library and ``cryptography``
(to read the expiry and names of a certificate the handshake refused), imported only where a refused
handshake is described: the verifier's executor code imports this module and must run on the stdlib.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import ssl
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the verifier's executor code is stdlib-only (shipping.py)
    from cryptography import x509

# The environment a process reads its client TLS settings from (the same names ``txnkeeper serve`` reads
# its own certificate from, so one mounted Secret serves a pod, a verifier Job and a CLI in the pod).
CA_FILE_ENV = "TXNKEEPER_TLS_CA_FILE"
CERT_FILE_ENV = "TXNKEEPER_TLS_CERT_FILE"
KEY_FILE_ENV = "TXNKEEPER_TLS_KEY_FILE"

# OpenSSL's X509_V_ERR_* codes of the failures a user can fix differently.
_NOT_YET_VALID = 9
_EXPIRED = 10
_SELF_SIGNED_LEAF = 18
_SELF_SIGNED_IN_CHAIN = 19
_NO_ISSUER = 20
_UNABLE_TO_VERIFY_LEAF = 21
_HOSTNAME_MISMATCH = 62
_IP_MISMATCH = 64
_UNTRUSTED = frozenset({_SELF_SIGNED_LEAF, _SELF_SIGNED_IN_CHAIN, _NO_ISSUER, _UNABLE_TO_VERIFY_LEAF, 2})
_DIAGNOSE_TIMEOUT_S = 3.0


# A pod's listeners that can speak TLS (``txnkeeper serve --tls-listeners``, contracts §6): the client
# protocol port (txnkeeper's protocol and Pulsar's: pulsar+ssl://), the admin API with /metrics, and the
# pod's own connections to other pods (mutual TLS: it presents its certificate).
LISTENERS = ("client", "admin", "peers")
CLIENT_AUTH = ("none", "request", "require")
DEFAULT_RELOAD_INTERVAL_S = 5.0


class TlsSettingsError(ValueError):
    """A TLS file is missing, unreadable or does not hold what it should."""


@dataclass(frozen=True, slots=True)
class TlsClientSettings:
    """How a client reaches TLS servers: ``ca_file`` (PEM, may hold several CAs: all are trusted) verifies
    the server; ``cert_file`` and ``key_file`` (both or neither) are presented where the server asks for a
    client certificate (mutual TLS); ``server_hostname`` replaces the host of the address in the check
    of the server's name (e.g. connecting to an IP whose certificate names the pod's DNS name)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsSettingsError(
                "give both a client certificate file and its key file, or neither (got "
                f"cert_file={self.cert_file!r}, key_file={self.key_file!r})"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsClientSettings | None:
        """The settings in TXNKEEPER_TLS_CA_FILE (+ _CERT_FILE, _KEY_FILE), or None without a CA file."""
        env = os.environ if environ is None else environ
        ca = env.get(CA_FILE_ENV) or None
        if ca is None:
            return None
        return cls(ca, env.get(CERT_FILE_ENV) or None, env.get(KEY_FILE_ENV) or None)

    def context(self) -> ssl.SSLContext:
        return client_context(self)


@dataclass(frozen=True, slots=True)
class TlsServerSettings:
    """A pod's TLS (server/tls_settings.py reads it): its certificate, key and CA bundle files, and
    which listeners use them.

    ``client_auth`` per server listener ("client", "admin"): none (no client certificate asked),
    request (asked and verified if sent), require (a client without one is refused at the handshake).
    """

    cert_file: str
    key_file: str
    ca_file: str | None
    listeners: frozenset[str] = frozenset(LISTENERS)
    client_auth: Mapping[str, str] = field(default_factory=lambda: {"client": "none", "admin": "none"})
    reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S

    def serves(self, listener: str) -> bool:
        return listener in self.listeners


def client_context(settings: TlsClientSettings) -> ssl.SSLContext:
    """A context that verifies servers against ``settings.ca_file`` (and their names) and presents the
    client certificate if one is given; TLS 1.2 at least. Refuses unreadable files naming them."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_trust(context, settings.ca_file)
    if settings.cert_file is not None and settings.key_file is not None:
        load_pair(context, settings.cert_file, settings.key_file)
    return context


def load_trust(context: ssl.SSLContext, ca_file: str) -> None:
    """Trust every CA in ``ca_file`` (old and new CA during a rotation's overlap)."""
    _readable(ca_file, "CA file")
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsSettingsError(f"CA file {ca_file} holds no usable PEM certificate: {exc}") from exc


def load_pair(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    _readable(cert_file, "certificate file")
    _readable(key_file, "private key file")
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TlsSettingsError(
                f"private key file {key_file} does not match certificate file {cert_file} (a half-written"
                " pair, or files from different certificates)"
            ) from exc
        raise TlsSettingsError(
            f"certificate file {cert_file} / private key file {key_file} are not a usable PEM certificate"
            f" and key: {exc.reason or exc}"
        ) from exc


def _readable(path: str, what: str) -> None:
    try:
        Path(path).read_bytes()
    except OSError as exc:
        raise TlsSettingsError(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc


# --- what went wrong, in words ---------------------------------------------------------------------


def describe(
    exc: BaseException, *, host: str, port: int, settings: TlsClientSettings | None, probe: bool = True
) -> str | None:
    """The sentence for a TLS failure reaching ``host:port``, or None when ``exc`` is no TLS failure.

    For an expired or wrong-host certificate the server's certificate is fetched again without
    verification (``probe``; a blocking connect of at most a few seconds) to name its expiry or names.
    """
    ca = settings.ca_file if settings is not None else "(system default)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code in (_EXPIRED, _NOT_YET_VALID, _HOSTNAME_MISMATCH, _IP_MISMATCH):
            cert = _peer_certificate(host, port, settings) if probe else None
            if code == _EXPIRED:
                after = f" (notAfter {_when(cert.not_valid_after_utc)})" if cert is not None else ""
                return f"server {host}:{port}: certificate has expired{after}"
            if code == _NOT_YET_VALID:
                before = f" (notBefore {_when(cert.not_valid_before_utc)})" if cert is not None else ""
                return f"server {host}:{port}: certificate is not yet valid{before}"
            names = ", ".join(certificate_names(cert)) if cert is not None else "other names"
            wanted = settings.server_hostname if settings and settings.server_hostname else host
            return f"server {host}:{port}: hostname mismatch: certificate is for {names}, not {wanted}"
        if code in _UNTRUSTED:
            return f"server {host}:{port}: certificate is not signed by a trusted CA (CA file {ca})"
        return f"server {host}:{port}: certificate refused: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).upper()
        if "CERTIFICATE_REQUIRED" in reason or "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason:
            return (
                f"server {host}:{port}: the server requires a client certificate (give a certificate and"
                " key signed by a CA the server trusts: --tls-cert-file/--tls-key-file or"
                f" {CERT_FILE_ENV}/{KEY_FILE_ENV})"
            )
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason or "CERTIFICATE_UNKNOWN" in reason:
            return f"server {host}:{port}: the server does not trust our client certificate ({exc.reason})"
        if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
            return f"server {host}:{port} does not speak TLS on this port (a plaintext port?): {exc.reason}"
        return f"server {host}:{port}: TLS failed: {exc.reason or exc}"
    return None


def certificate_names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses a certificate is for (its subject CN when it has no SANs)."""
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        common = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
        return [str(a.value) for a in common] or ["(no names)"]
    names: list[str] = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    names += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return names or ["(no names)"]


def _when(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _peer_certificate(host: str, port: int, settings: TlsClientSettings | None) -> x509.Certificate | None:
    """The server's certificate as it presents it, unverified (only to name what was wrong with it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if settings is not None and settings.cert_file and settings.key_file:
        # Without it the probe still sees the certificate of a server that requires one.
        with contextlib.suppress(OSError, ssl.SSLError):
            context.load_cert_chain(settings.cert_file, settings.key_file)
    try:
        with (
            socket.create_connection((host, port), timeout=_DIAGNOSE_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    if not der:
        return None
    from cryptography import x509

    return x509.load_der_x509_certificate(der)


# --- HTTPS with urllib (the CLI, the verifier's and the Spark source's fetches) ----------------------


def url_opener(settings: TlsClientSettings | None) -> urllib.request.OpenerDirector:
    """An opener without proxies (pods are reached directly) whose https:// URLs are verified against
    ``settings.ca_file`` (the system's CAs without settings), presenting its client certificate."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if settings is not None:
        handlers.append(urllib.request.HTTPSHandler(context=client_context(settings)))
    return urllib.request.build_opener(*handlers)


def describe_url_error(reason: object, url: str, settings: TlsClientSettings | None) -> str | None:
    """The TLS sentence for a urllib failure's ``reason`` reaching ``url`` (None: not a TLS failure)."""
    if not isinstance(reason, BaseException):
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or parts.hostname is None:
        return None
    return describe(reason, host=parts.hostname, port=parts.port or 443, settings=settings)
