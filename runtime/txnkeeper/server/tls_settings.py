"""``txnkeeper serve``'s TLS settings (contracts §6 "TLS"): flags, TXNKEEPER_TLS_* env, the config's ``tls``.

A pod serves TLS once it is given a certificate file: by default on every listener (the client protocol
port, which carries txnkeeper's protocol and Pulsar's, so Pulsar clients use ``pulsar+ssl://``; the admin
API with /metrics; and its connections to other pods, which present the same certificate and verify the
peer against the CA file). The files are meant to be a mounted Kubernetes Secret (tls.crt, tls.key,
ca.crt): they are re-read while the pod runs (server/tls_reload.py). Flags win over env, env over the
config file's section, key by key.

Everything wrong is refused at start naming the file: missing or unreadable, not PEM, a key that does not
match the certificate, a certificate that has expired or is not valid yet (with its notAfter/notBefore).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from txnkeeper.contract.tls import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    DEFAULT_RELOAD_INTERVAL_S,
    KEY_FILE_ENV,
    LISTENERS,
    TlsServerSettings,
    TlsSettingsError,
    load_pair,
)
from txnkeeper.server.config import ConfigError, env, file_section

SECTION = "tls"
CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "request": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}
_KEYS = ("certFile", "keyFile", "caFile", "listeners", "clientAuth", "reloadIntervalSeconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (contracts §6; files are re-read while running)")
    group.add_argument(
        "--tls-cert-file",
        default=env("TLS_CERT_FILE"),
        help=f"PEM certificate (chain) of this pod; with it the listeners speak TLS (env {CERT_FILE_ENV})",
    )
    group.add_argument(
        "--tls-key-file", default=env("TLS_KEY_FILE"), help=f"its private key (env {KEY_FILE_ENV})"
    )
    group.add_argument(
        "--tls-ca-file",
        default=env("TLS_CA_FILE"),
        help="PEM CA bundle trusted for peers and client certificates; may hold several CAs (env"
        f" {CA_FILE_ENV})",
    )
    group.add_argument(
        "--tls-listeners",
        default=env("TLS_LISTENERS"),
        help="which of client,admin,peers use TLS (default all three once a certificate is given)",
    )
    group.add_argument(
        "--tls-client-auth",
        default=env("TLS_CLIENT_AUTH"),
        choices=tuple(CLIENT_AUTH_MODES),
        help="client protocol port: none, request or require a client certificate (default none)",
    )
    group.add_argument(
        "--tls-admin-client-auth",
        default=env("TLS_ADMIN_CLIENT_AUTH"),
        choices=tuple(CLIENT_AUTH_MODES),
        help="admin API port: none, request or require a client certificate (default none)",
    )
    group.add_argument(
        "--tls-reload-interval",
        type=float,
        default=env("TLS_RELOAD_INTERVAL"),
        help="seconds between checks of the TLS files for a rotation (default"
        f" {DEFAULT_RELOAD_INTERVAL_S:g})",
    )


def settings(ns: argparse.Namespace, config: Path | None) -> TlsServerSettings | None:
    """The pod's TLS settings (None: plaintext), validated and its files checked (``check_files``)."""
    section = _section(config)
    cert = ns.tls_cert_file or _text(section, "certFile", config)
    key = ns.tls_key_file or _text(section, "keyFile", config)
    ca = ns.tls_ca_file or _text(section, "caFile", config)
    if cert is None and key is None:
        if ca is not None or ns.tls_listeners or ns.tls_client_auth or ns.tls_admin_client_auth:
            raise ConfigError(
                "TLS settings were given without a certificate: give --tls-cert-file and --tls-key-file"
                f" (env {CERT_FILE_ENV}, {KEY_FILE_ENV}, or {SECTION}.certFile/keyFile in the config)"
            )
        return None
    if cert is None or key is None:
        missing = "--tls-cert-file" if cert is None else "--tls-key-file"
        raise ConfigError(f"TLS needs both a certificate and its key: {missing} is missing")
    listeners = _listeners(ns.tls_listeners, section, config)
    auth_doc = section.get("clientAuth", {}) if section else {}
    if not isinstance(auth_doc, dict) or set(auth_doc) - {"client", "admin"}:
        raise ConfigError(
            f"{config}: {SECTION}.clientAuth must be an object with keys client and/or admin,"
            f" got {auth_doc!r}"
        )
    client_auth = {
        "client": _mode(ns.tls_client_auth or auth_doc.get("client", "none"), "client"),
        "admin": _mode(ns.tls_admin_client_auth or auth_doc.get("admin", "none"), "admin"),
    }
    interval = ns.tls_reload_interval
    if interval is None:
        interval = section.get("reloadIntervalSeconds", DEFAULT_RELOAD_INTERVAL_S) if section else None
    interval = DEFAULT_RELOAD_INTERVAL_S if interval is None else interval
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0.05 <= interval <= 3600:
        raise ConfigError(
            f"TLS reload interval {interval!r} must be seconds between 0.05 and 3600 (default"
            f" {DEFAULT_RELOAD_INTERVAL_S:g})"
        )
    needs_ca = "peers" in listeners or any(
        client_auth[name] != "none" for name in ("client", "admin") if name in listeners
    )
    if needs_ca and ca is None:
        raise ConfigError(
            "TLS needs a CA file (--tls-ca-file, env TXNKEEPER_TLS_CA_FILE): pod-to-pod connections"
            " (listener peers) and client certificates are verified against it"
        )
    result = TlsServerSettings(cert, key, ca, frozenset(listeners), client_auth, float(interval))
    try:
        check_files(result)
    except TlsSettingsError as exc:
        raise ConfigError(f"TLS: {exc}") from exc
    return result


def _section(config: Path | None) -> dict[str, Any]:
    section = file_section(config, SECTION)
    if section is None:
        return {}
    unknown = sorted(set(section) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{config}: {SECTION} has unknown keys {unknown}; known: {', '.join(_KEYS)}")
    return section


def _text(section: dict[str, Any], key: str, config: Path | None) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{config}: {SECTION}.{key} must be a file path, got {value!r}")
    return value


def _listeners(flag: str | None, section: dict[str, Any], config: Path | None) -> set[str]:
    if flag is not None:
        names = [part.strip() for part in flag.split(",") if part.strip()]
        source = f"--tls-listeners (env TXNKEEPER_TLS_LISTENERS) {flag!r}"
    elif "listeners" in section:
        raw = section["listeners"]
        if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
            raise ConfigError(f"{config}: {SECTION}.listeners must be a list of names, got {raw!r}")
        names = list(raw)
        source = f"{config}: {SECTION}.listeners"
    else:
        return set(LISTENERS)
    unknown = sorted(set(names) - set(LISTENERS))
    if unknown or not names:
        raise ConfigError(f"{source}: give one or more of {', '.join(LISTENERS)} (unknown: {unknown})")
    return set(names)


def _mode(value: object, listener: str) -> str:
    if value not in CLIENT_AUTH_MODES:
        raise ConfigError(
            f"TLS client auth of the {listener} listener is {value!r}: give none, request or require"
        )
    return str(value)


# --- the files ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One consistent read of the certificate, key and CA files (what a context is built from)."""

    cert: bytes
    key: bytes
    ca: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(b"\0".join((self.cert, self.key, self.ca))).hexdigest()


def read_files(config: TlsServerSettings) -> TlsFiles:
    """Read the three files (through Kubernetes' ``..data`` symlink: each read sees a whole version)."""
    return TlsFiles(
        _read(config.cert_file, "certificate file"),
        _read(config.key_file, "private key file"),
        _read(config.ca_file, "CA file") if config.ca_file is not None else b"",
    )


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsSettingsError(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc


def leaf_certificate(config: TlsServerSettings, files: TlsFiles) -> x509.Certificate:
    """The pod's own certificate (the first of the chain file), refused unless valid right now."""
    try:
        chain = x509.load_pem_x509_certificates(files.cert)
    except ValueError as exc:
        raise TlsSettingsError(
            f"certificate file {config.cert_file} holds no PEM certificate: {exc}"
        ) from exc
    leaf = chain[0]
    now = dt.datetime.now(dt.UTC)
    if leaf.not_valid_after_utc <= now:
        raise TlsSettingsError(
            f"certificate file {config.cert_file}: certificate has expired (notAfter"
            f" {leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC); mount a renewed certificate"
        )
    if leaf.not_valid_before_utc > now:
        raise TlsSettingsError(
            f"certificate file {config.cert_file}: certificate is not valid yet (notBefore"
            f" {leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC); check the clock or the issuer"
        )
    return leaf


def ca_count(config: TlsServerSettings, files: TlsFiles) -> int:
    if config.ca_file is None:
        return 0
    try:
        return len(x509.load_pem_x509_certificates(files.ca))
    except ValueError as exc:
        raise TlsSettingsError(f"CA file {config.ca_file} holds no PEM certificate: {exc}") from exc


@dataclass(frozen=True, slots=True)
class TlsContexts:
    """The SSL contexts built from one read of the files, per listener, and what they hold."""

    files: TlsFiles
    certificate: x509.Certificate
    cas: int
    server: Mapping[str, ssl.SSLContext]  # "client", "admin"
    peer: ssl.SSLContext  # pod-to-pod client side: presents the certificate, verifies against the CAs


def build_contexts(config: TlsServerSettings, files: TlsFiles) -> TlsContexts:
    """Every context from ``files``; raises ``TlsSettingsError`` naming the file that is wrong."""
    certificate = leaf_certificate(config, files)
    cas = ca_count(config, files)
    ca_text = files.ca.decode("ascii", errors="replace") if config.ca_file is not None else None
    # ssl loads a key pair only from files: this read's bytes go to a private directory first, so the
    # pair checked is the pair served even when the mounted files change meanwhile.
    with tempfile.TemporaryDirectory(prefix="txnkeeper-tls-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(files.cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(files.key)
        server = {
            name: _server_context(config, name, str(cert_path), str(key_path), ca_text)
            for name in ("client", "admin")
        }
        peer = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        peer.minimum_version = ssl.TLSVersion.TLSv1_2
        if ca_text is not None:
            peer.load_verify_locations(cadata=ca_text)
        peer.load_cert_chain(str(cert_path), str(key_path))
    return TlsContexts(files, certificate, cas, server, peer)


def _server_context(
    config: TlsServerSettings, listener: str, cert_path: str, key_path: str, ca_text: str | None
) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        load_pair(context, cert_path, key_path)
    except TlsSettingsError as exc:
        text = str(exc).replace(cert_path, config.cert_file).replace(key_path, config.key_file)
        raise TlsSettingsError(text) from exc
    if ca_text is not None:
        try:
            context.load_verify_locations(cadata=ca_text)
        except ssl.SSLError as exc:
            raise TlsSettingsError(f"CA file {config.ca_file} is not a usable PEM bundle: {exc}") from exc
    context.verify_mode = CLIENT_AUTH_MODES[config.client_auth.get(listener, "none")]
    return context


def check_files(config: TlsServerSettings) -> None:
    """Refuse a start whose files are unusable (the same checks a reload makes)."""
    build_contexts(config, read_files(config))
