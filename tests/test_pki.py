"""contract/pki.py: what it issues is accepted by a real TLS handshake (the standard library's OpenSSL),
and what it refuses, it refuses with a sentence naming the problem."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest

from txnkeeper.contract import pki

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


def _write(directory: Path, name: str, data: bytes) -> str:
    path = directory / name
    path.write_bytes(data)
    return str(path)


async def _handshake(tmp: Path, server: pki.Issued, client: pki.Issued, trusted: bytes, host: str) -> str:
    """Serve ``server`` requiring a client certificate trusted by ``trusted``; connect as ``client``."""
    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(_write(tmp, "s.crt", server.cert_pem), _write(tmp, "s.key", server.key_pem))
    sctx.load_verify_locations(_write(tmp, "ca.crt", trusted))
    sctx.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert")
        seen.append(dict(x[0] for x in peer["subject"])["commonName"])
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=sctx)
    port = srv.sockets[0].getsockname()[1]
    cctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    cctx.load_cert_chain(_write(tmp, "c.crt", client.cert_pem), _write(tmp, "c.key", client.key_pem))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=cctx, server_hostname=host)
        # TLS 1.3: a refused client certificate shows after the client's handshake, as a closed stream.
        answer = await reader.read()
        writer.close()
    finally:
        srv.close()
        await srv.wait_closed()
    if answer != b"ok":
        raise ConnectionError("the server refused the client certificate")
    return seen[0]


def test_a_leaf_for_a_wildcard_headless_name_passes_a_mutual_handshake(tmp_path: Path) -> None:
    ca = pki.new_ca("txnkeeper CA ns1", now=NOW, validity=365 * DAY)
    server = pki.issue(ca, "store", hosts=["*.store-headless.ns1.svc", "localhost"], now=NOW, validity=DAY)
    client = pki.issue(ca, "txnkeeper-operator", now=NOW, validity=DAY, server=False)
    seen = asyncio.run(_handshake(tmp_path, server, client, ca.cert_pem, "store-0.store-headless.ns1.svc"))
    assert seen == "txnkeeper-operator"
    assert pki.signed_by(server.cert, ca.cert)
    assert pki.hosts_of(server.cert) == ["*.store-headless.ns1.svc", "localhost"]


def test_during_a_ca_rotation_a_bundle_of_both_cas_trusts_leaves_of_either(tmp_path: Path) -> None:
    old = pki.new_ca("old", now=NOW, validity=365 * DAY)
    new = pki.new_ca("new", now=NOW, validity=365 * DAY)
    bundle = pki.bundle_pem([new.cert, old.cert, new.cert])
    assert len(pki.load_bundle(bundle, what="bundle")) == 2
    server = pki.issue(new, "pod", hosts=["localhost"], now=NOW, validity=DAY)
    client = pki.issue(old, "old client", now=NOW, validity=DAY, server=False)
    assert asyncio.run(_handshake(tmp_path, server, client, bundle, "localhost")) == "old client"
    assert not pki.signed_by(server.cert, old.cert)


def test_the_new_ca_alone_refuses_a_leaf_of_the_old(tmp_path: Path) -> None:
    old = pki.new_ca("old", now=NOW, validity=365 * DAY)
    new = pki.new_ca("new", now=NOW, validity=365 * DAY)
    server = pki.issue(new, "pod", hosts=["localhost"], now=NOW, validity=DAY)
    client = pki.issue(old, "old client", now=NOW, validity=DAY, server=False)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        asyncio.run(_handshake(tmp_path, server, client, new.cert_pem, "localhost"))


def test_a_leaf_never_outlives_its_ca_and_an_expired_ca_issues_nothing() -> None:
    ca = pki.new_ca("short", now=NOW, validity=2 * DAY)
    leaf = pki.issue(ca, "pod", hosts=["localhost"], now=NOW, validity=90 * DAY)
    assert leaf.not_after == ca.not_after
    with pytest.raises(pki.PkiError, match=r"expired at .*renew it"):
        pki.issue(ca, "pod", hosts=["localhost"], now=NOW + 3 * DAY, validity=DAY)


def test_refusals_name_what_is_wrong() -> None:
    ca = pki.new_ca("ca", now=NOW, validity=DAY)
    other = pki.new_ca("other", now=NOW, validity=DAY)
    with pytest.raises(pki.PkiError, match="needs at least one host name"):
        pki.issue(ca, "pod", now=NOW, validity=DAY)
    with pytest.raises(pki.PkiError, match="server or client"):
        pki.issue(ca, "pod", hosts=["x"], now=NOW, validity=DAY, server=False, client=False)
    with pytest.raises(pki.PkiError, match="Secret ns/x: the private key does not belong"):
        pki.load_issued(ca.cert_pem, other.key_pem, what="Secret ns/x")
    with pytest.raises(pki.PkiError, match="Secret ns/x: not a PEM"):
        pki.load_issued(b"garbage", ca.key_pem, what="Secret ns/x")
    with pytest.raises(pki.PkiError, match="not an unencrypted PEM key"):
        pki.load_issued(ca.cert_pem, b"garbage", what="Secret ns/x")
    loaded = pki.load_issued(ca.cert_pem, ca.key_pem, what="Secret ns/x")
    assert loaded.fingerprint == ca.fingerprint
