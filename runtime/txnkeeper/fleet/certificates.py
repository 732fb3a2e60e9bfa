"""The local fleet's certificates: its own CA and one leaf per process, laid out as mounted Secrets.

Why: the fleet is run like the operator runs a resource (issue 28: TLS on every listener, pod-to-pod
mutual TLS), so it plays the operator's certificate manager too. Everything lives in the run
directory's ``tls/``: ``ca.crt`` (the trust bundle every process and client reads: the current CA,
and the previous one while a rotation overlaps), ``ca.key`` (the CA's key, owner-only: the fleet issues
leaves for members it adds later), and per process ``<name>/tls.crt`` + ``tls.key`` (hosts
``127.0.0.1`` and ``localhost``, usable as server and client certificate), plus ``fleet/`` (the
fleet's own client certificate, as the operator's ``txnkeeper-operator-client-tls``). Material comes
from txnkeeper.contract.pki, the operator's issuer; files are replaced in one rename each (the key
before the certificate), as a Secret volume's symlink swap does, and the processes re-read them
(server/tls_reload.py).

The fleet's own clients (admin calls, the load's client library, the scaling driver) share one SSL
context: rotation.py adds a new CA to it and swaps its client certificate in place, so the clients
made at start follow a CA rotation. A context cannot forget a CA, so they trust a retired CA until
the fleet stops; the processes, which re-read ``ca.crt``, drop it exactly.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from txnkeeper.contract import pki
from txnkeeper.contract.tls import CA_FILE_ENV, CERT_FILE_ENV, KEY_FILE_ENV, TlsClientSettings

HOSTS = ("127.0.0.1", "localhost")
CA_VALIDITY = dt.timedelta(days=365)
LEAF_VALIDITY = dt.timedelta(days=90)
# Processes check their files this often: a rotation step is seen within about a second.
RELOAD_INTERVAL_S = 1.0
CLIENT_NAME = "fleet"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def replace_file(path: Path, data: bytes, *, private: bool = False) -> None:
    """``path`` holds ``data`` after one rename (a reader sees the old or the new file, never half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


@dataclass(frozen=True, slots=True)
class LeafFiles:
    """One process's certificate and key files."""

    cert_file: Path
    key_file: Path


class FleetCertificates:
    """The fleet's CA, trust bundle and leaves under ``directory``; see the module docstring."""

    def __init__(self, directory: Path, ca: pki.Issued, trusted: Sequence[x509.Certificate]) -> None:
        self.directory = directory
        self.ca = ca
        self.trusted = list(trusted)
        self._context: ssl.SSLContext | None = None

    @classmethod
    def create(cls, directory: Path, *, name: str = "txnkeeper local fleet CA") -> FleetCertificates:
        """A new CA and the fleet's client certificate, written to ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        ca = pki.new_ca(name, now=now(), validity=CA_VALIDITY)
        certificates = cls(directory, ca, [ca.cert])
        certificates.write_ca()
        certificates.write_bundle()
        certificates.issue_client()
        return certificates

    # --- paths ------------------------------------------------------------------------------------------
    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key_file(self) -> Path:
        return self.directory / "ca.key"

    def leaf(self, name: str) -> LeafFiles:
        return LeafFiles(self.directory / name / "tls.crt", self.directory / name / "tls.key")

    # --- writing ----------------------------------------------------------------------------------------
    def write_ca(self) -> None:
        replace_file(self.ca_key_file, self.ca.key_pem, private=True)

    def write_bundle(self) -> None:
        replace_file(self.ca_file, pki.bundle_pem(self.trusted))

    def issue_leaf(self, name: str, *, server: bool = True) -> pki.Issued:
        """A new leaf for ``name`` from the current CA, in place of the one it has (if any)."""
        issued = pki.issue(
            self.ca,
            name,
            hosts=HOSTS if server else (),
            now=now(),
            validity=LEAF_VALIDITY,
            server=server,
        )
        files = self.leaf(name)
        files.cert_file.parent.mkdir(parents=True, exist_ok=True)
        # The key first: a process that reads between the two renames sees a pair that does not
        # match, refuses it once and keeps serving what it has (tls_reload.py), then takes the pair.
        replace_file(files.key_file, issued.key_pem, private=True)
        replace_file(files.cert_file, issued.cert_pem)
        return issued

    def issue_client(self) -> pki.Issued:
        issued = self.issue_leaf(CLIENT_NAME, server=False)
        if self._context is not None:
            files = self.leaf(CLIENT_NAME)
            self._context.load_cert_chain(str(files.cert_file), str(files.key_file))
        return issued

    def ensure_leaf(self, name: str) -> LeafFiles:
        """``name``'s files, issued now if it has none (a member added by a scale-out)."""
        files = self.leaf(name)
        if not files.cert_file.is_file() or not files.key_file.is_file():
            self.issue_leaf(name)
        return files

    def trust(self, certs: Sequence[x509.Certificate]) -> None:
        """The bundle becomes ``certs``; the fleet's clients add any CA new to them."""
        self.trusted = list(certs)
        self.write_bundle()
        if self._context is not None:
            self._context.load_verify_locations(cadata=pki.bundle_pem(self.trusted).decode("ascii"))

    # --- what processes and clients are given -----------------------------------------------------------
    def serve_flags(self, name: str) -> list[str]:
        """``txnkeeper serve``'s TLS flags for process ``name``: every listener; the admin port asks
        for a client certificate (request, as pods run: probes present none, other pods and the fleet
        do), the client port does not."""
        files = self.ensure_leaf(name)
        return [
            "--tls-cert-file",
            str(files.cert_file),
            "--tls-key-file",
            str(files.key_file),
            "--tls-ca-file",
            str(self.ca_file),
            "--tls-admin-client-auth",
            "request",
            "--tls-reload-interval",
            f"{RELOAD_INTERVAL_S:g}",
        ]

    @property
    def settings(self) -> TlsClientSettings:
        files = self.leaf(CLIENT_NAME)
        return TlsClientSettings(str(self.ca_file), str(files.cert_file), str(files.key_file))

    def client_context(self) -> ssl.SSLContext:
        """The one context of the fleet's clients (kept current by ``trust`` and ``issue_client``)."""
        if self._context is None:
            self._context = self.settings.context()
        return self._context

    def env(self) -> dict[str, str]:
        """TXNKEEPER_TLS_* for a child process of the fleet (the verifier): verify pods, present the
        fleet's client certificate."""
        files = self.leaf(CLIENT_NAME)
        return {
            CA_FILE_ENV: str(self.ca_file),
            CERT_FILE_ENV: str(files.cert_file),
            KEY_FILE_ENV: str(files.key_file),
        }
