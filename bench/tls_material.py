"""A throwaway CA and one certificate for the TLS benchmark (``txn_e2e.py --tls``): the pods serve it and
present it to each other, the client presents it too (mutual TLS, as pod-to-pod traffic is)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from txnkeeper.contract.tls import TlsClientSettings


def write_material(directory: Path, client_auth: str = "require") -> tuple[list[str], TlsClientSettings]:
    """Write ca.crt, tls.crt and tls.key (P-256, SANs 127.0.0.1 and localhost) into ``directory``;
    returns the serve flags using them (``client_auth`` on the client port) and the client's settings."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "txn_e2e bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench pod")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(sans, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    flags = [
        "--tls-cert-file",
        str(cert_file),
        "--tls-key-file",
        str(key_file),
        "--tls-ca-file",
        str(ca_file),
        "--tls-listeners",
        "client,peers",
        "--tls-client-auth",
        client_auth,
    ]
    return flags, TlsClientSettings(str(ca_file), str(cert_file), str(key_file))
