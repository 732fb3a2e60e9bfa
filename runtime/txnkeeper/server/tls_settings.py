"""``txnkeeper serve``'s TLS settings (contracts §6 "TLS"): flags, TXNKEEPER_TLS_* env, the config's ``tls``.

A pod serves TLS once it is given a certificate file: by default on every listener (the client protocol
port, which carries txnkeeper's protocol and Pulsar's, so Pulsar clients use ``pulsar+ssl://``; the admin
API with /metrics; and its connections to other pods, which present the same certificate and verify the
peer against the CA file). The files are meant to be a mounted Kubernetes Secret (tls.crt, tls.key,
ca.crt): they are re-read while the pod runs (server/tls_reload.py). Flags win over env, env over the
config file's section, key by key; each value is checked by the declaration (contract/settings/tls.py).

Everything wrong is refused at start naming the file: missing or unreadable, not PEM, a key that does not
match the certificate, a certificate that has expired or is not valid yet (with its notAfter/notBefore).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.tls import TLS
from txnkeeper.contract.tls import (
    CERT_FILE_ENV,
    KEY_FILE_ENV,
    TlsServerSettings,
    TlsSettingsError,
    load_pair,
)
from txnkeeper.server.config import ConfigError, file_section

SECTION = TLS.name
CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "request": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    schema.add_flags(parser.add_argument_group("TLS (contracts §6; files are re-read while running)"), TLS)


def load(ns: argparse.Namespace, config: Path | None) -> schema.Loaded:
    """Each TLS setting on its own, from flags > env > the config's section (the declaration's checks)."""
    try:
        return schema.load(
            TLS,
            flags=vars(ns),
            environ=os.environ,
            file=file_section(config, SECTION),
            file_where=f"{config}: {SECTION}",
        )
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc


def settings(ns: argparse.Namespace, config: Path | None) -> TlsServerSettings | None:
    """The pod's TLS settings (None: plaintext), validated and its files checked (``check_files``)."""
    loaded = load(ns, config)
    values, sources = loaded.values, loaded.sources
    cert, key, ca = values["cert_file"], values["key_file"], values["ca_file"]
    if cert is None and key is None:
        # Flags and env that ask for TLS without a certificate are a mistake; the file's other keys
        # may sit in a shared config file of pods that have no certificate (as before).
        asked = [f for f in ("listeners", "client_auth", "admin_client_auth") if _flag_or_env(sources[f])]
        if ca is not None or asked:
            raise ConfigError(
                "TLS settings were given without a certificate: give --tls-cert-file and --tls-key-file"
                f" (env {CERT_FILE_ENV}, {KEY_FILE_ENV}, or {SECTION}.certFile/keyFile in the config)"
            )
        return None
    if cert is None or key is None:
        missing = "--tls-cert-file" if cert is None else "--tls-key-file"
        raise ConfigError(f"TLS needs both a certificate and its key: {missing} is missing")
    listeners = set(values["listeners"])
    client_auth = {"client": values["client_auth"], "admin": values["admin_client_auth"]}
    needs_ca = "peers" in listeners or any(
        client_auth[name] != "none" for name in ("client", "admin") if name in listeners
    )
    if needs_ca and ca is None:
        raise ConfigError(
            "TLS needs a CA file (--tls-ca-file, env TXNKEEPER_TLS_CA_FILE): pod-to-pod connections"
            " (listener peers) and client certificates are verified against it"
        )
    interval = float(values["reload_interval_s"])
    result = TlsServerSettings(cert, key, ca, frozenset(listeners), client_auth, interval)
    try:
        check_files(result)
    except TlsSettingsError as exc:
        raise ConfigError(f"TLS: {exc}") from exc
    return result


def _flag_or_env(source: str) -> bool:
    return source.startswith(("--", schema.ENV_PREFIX))


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
