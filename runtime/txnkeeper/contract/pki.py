"""Issuing the X.509 material txnkeeper runs on: a CA, and server/client certificates signed by it.

Two users make certificates: the operator, which runs its own CA per namespace and issues each
resource's pod certificate and its own client certificate (issue 28: Strimzi's cluster CA), and the local
fleet (`make demo`, tests), which does the same for processes on one machine. One module so that both
make the same material: P-256 keys, SHA-256 signatures, a CA with ``pathlen:0``, leaves usable for
both server and client authentication (pods present their certificate to each other: mutual TLS), and
PEM as Kubernetes TLS Secrets hold it (``tls.crt``, ``tls.key``, ``ca.crt``). It is in the contract package
because the operator may import nothing else of the runtime; it needs ``cryptography``, which the
runtime and the operator both depend on (the verifier's executor code never imports this module).

Every function takes ``now`` so that what it issues is decided by its caller (the operator's pure
certificate engine plans "renew at notAfter - renewBefore" from the same clock it passes here).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Certificates are back-dated this much: a node whose clock is a little behind the issuer's must not
# refuse a certificate as "not valid yet" in the first minutes after it was issued.
CLOCK_SKEW = dt.timedelta(minutes=5)


class PkiError(ValueError):
    """Material that cannot be used (not PEM, a key that does not match, not a CA); the text says which."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

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
    def not_after(self) -> dt.datetime:
        return self.cert.not_valid_after_utc

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate, hex: how status, Events and pods name one certificate."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _name(common_name: str, organization: str | None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization[:64]))
    return x509.Name(attributes)


def new_ca(
    common_name: str, *, now: dt.datetime, validity: dt.timedelta, organization: str | None = "txnkeeper"
) -> Issued:
    """A self-signed CA that may sign leaves only (``pathlen:0``)."""
    if validity <= dt.timedelta(0):
        raise PkiError(f"CA validity must be positive, got {validity}")
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name, organization)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def _general_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: Issued,
    common_name: str,
    *,
    hosts: Sequence[str] = (),
    now: dt.datetime,
    validity: dt.timedelta,
    server: bool = True,
    client: bool = True,
    organization: str | None = "txnkeeper",
) -> Issued:
    """A leaf signed by ``ca`` for ``hosts`` (DNS names, wildcards like ``*.svc-headless.ns.svc``, or IP
    addresses), usable for server and/or client authentication. Never valid past the CA: a leaf that
    outlived its CA would fail every handshake while looking fine on its own."""
    if not (server or client):
        raise PkiError("a certificate must be usable for server or client authentication (or both)")
    if server and not hosts:
        raise PkiError(f"a server certificate needs at least one host name ({common_name!r} has none)")
    if validity <= dt.timedelta(0):
        raise PkiError(f"certificate validity must be positive, got {validity}")
    not_after = min(now + validity, ca.not_after)
    if not_after <= now:
        raise PkiError(
            f"the CA {ca.cert.subject.rfc4514_string()} expired at {ca.not_after.isoformat()}:"
            " renew it before issuing from it"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - CLOCK_SKEW, ca.cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def load_issued(cert_pem: bytes, key_pem: bytes, *, what: str) -> Issued:
    """The certificate (first of the PEM) and its key; ``what`` names them in errors (e.g. a Secret)."""
    certs = load_bundle(cert_pem, what=what)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError(f"{what}: the private key is not an unencrypted PEM key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{what}: the private key is a {type(key).__name__}, expected an EC (P-256) key")
    if key.public_key().public_numbers() != certs[0].public_key().public_numbers():  # type: ignore[union-attr]
        raise PkiError(f"{what}: the private key does not belong to the certificate")
    return Issued(certs[0], key)


def load_bundle(pem: bytes, *, what: str) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order; at least one."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise PkiError(f"{what}: not a PEM certificate bundle ({exc})") from None
    if not certs:
        raise PkiError(f"{what}: holds no certificate")
    return certs


def bundle_pem(certs: Iterable[x509.Certificate]) -> bytes:
    """A CA bundle (``ca.crt``): during a CA rotation it holds the new and the old CA, both trusted.
    Duplicates are dropped, order kept."""
    seen: set[str] = set()
    out: list[bytes] = []
    for cert in certs:
        mark = fingerprint(cert)
        if mark not in seen:
            seen.add(mark)
            out.append(cert.public_bytes(serialization.Encoding.PEM))
    return b"".join(out)


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca``'s key signed ``cert`` (the chain check a handshake makes, without the clock)."""
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def hosts_of(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses a certificate is for (its subjectAltName)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    hosts: list[str] = list(san.get_values_for_type(x509.DNSName))
    hosts.extend(str(address) for address in san.get_values_for_type(x509.IPAddress))
    return hosts
