"""Real X.509 material for the TLS tests, made with ``cryptography``: CAs, server and client certificates
(valid, expired, for another host), written as PEM files the way a mounted Secret holds them."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from txnkeeper.contract import pki

_DAY = dt.timedelta(days=1)


@dataclass
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def serial(self) -> int:
        return self.cert.serial_number

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common: str = "txnkeeper test CA") -> Issued:
    """A CA as the operator and the fleet make theirs (contract/pki.py), valid a year."""
    ca = pki.new_ca(common, now=dt.datetime.now(dt.UTC), validity=365 * _DAY, organization=None)
    return Issued(ca.cert, ca.key)


def issue(
    ca: Issued,
    common: str = "pod",
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Issued:
    """A leaf certificate for ``hosts`` (IP addresses and DNS names), usable as server and client."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - _DAY)
        .not_valid_after(not_after or now + 90 * _DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def expired(ca: Issued) -> Issued:
    now = dt.datetime.now(dt.UTC)
    return issue(ca, "expired", not_before=now - 30 * _DAY, not_after=now - _DAY)


def write_bundle(path: Path, *cas: Issued) -> Path:
    """A CA bundle file holding every CA given (old + new during a rotation's overlap)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(ca.cert_pem for ca in cas))
    return path


def replace_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` as a new version of ``path`` in one step (as a Secret volume's symlink swap)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    tmp.replace(path)
