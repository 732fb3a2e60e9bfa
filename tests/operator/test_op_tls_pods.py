"""The operator's calls to real TLS pods (podtls.py + the contract's AdminClient): mutual TLS with the
namespace's client certificate, each pod checked against its own DNS name, a pod serving another
resource's certificate (same CA) refused with a sentence naming both names, and a rotated client
Secret (new CA) taken without a restart because its resourceVersion changed."""

from __future__ import annotations

import asyncio
import datetime as dt
from base64 import b64encode
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient, AdminError
from txnkeeper.fleet.process import RuntimeProcess, write_admin_token
from txnkeeper_operator import podtls, tlsspec

pytestmark = pytest.mark.timeout(120)
NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


def _hosts(cr: str) -> list[str]:
    return [f"*.{cr}.ns.svc", f"*.{cr}.ns.svc.cluster.local", "localhost", "127.0.0.1"]


def _files(directory: Path, ca_bundle: bytes, leaf: pki.Issued) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in (("tls.crt", leaf.cert_pem), ("tls.key", leaf.key_pem), ("ca.crt", ca_bundle)):
        (directory / f"{name}.new").write_bytes(data)
        (directory / f"{name}.new").replace(directory / name)
    return [
        *("--tls-cert-file", str(directory / "tls.crt"), "--tls-key-file", str(directory / "tls.key")),
        *("--tls-ca-file", str(directory / "ca.crt"), "--tls-admin-client-auth", "require"),
        *("--tls-reload-interval", "0.2"),
    ]


def _secret(ca_bundle: bytes, client: pki.Issued, version: str) -> dict[str, Any]:
    data = {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca_bundle}
    return {
        "metadata": {"name": tlsspec.OPERATOR_CLIENT_SECRET, "resourceVersion": version},
        "data": {k: b64encode(v).decode() for k, v in data.items()},
    }


class Secrets:
    """The one call ClientTlsCache makes of the Kubernetes API (the real API: test_op_tls_apiserver)."""

    def __init__(self) -> None:
        self.secret: dict[str, Any] | None = None

    async def get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        assert (kind, name) == ("Secret", tlsspec.OPERATOR_CLIENT_SECRET)
        return self.secret


async def test_mutual_tls_to_the_right_pod_and_a_refusal_for_another_resources_certificate(
    tmp_path: Path,
) -> None:
    ca = pki.new_ca("namespace CA", now=NOW, validity=365 * DAY)
    client = pki.issue(ca, "txnkeeper-operator", now=NOW, validity=30 * DAY, server=False)
    token = write_admin_token(tmp_path / "token", "tls-pods-token-0123456789")
    right = pki.issue(ca, "pas", hosts=_hosts("pas"), now=NOW, validity=30 * DAY)
    wrong = pki.issue(ca, "other", hosts=["*.other.ns.svc", "127.0.0.1"], now=NOW, validity=30 * DAY)
    pods = {
        name: RuntimeProcess.in_work_dir(
            tmp_path, name, "store", token_file=token, release="2.0.0",
            extra_args=_files(tmp_path / f"{name}-secret", ca.cert_pem, leaf),
        )
        for name, leaf in (("pas-0", right), ("impostor-0", wrong))
    }  # fmt: skip
    kube = Secrets()
    cache = podtls.ClientTlsCache()
    try:
        for proc in pods.values():
            proc.start()
        for proc in pods.values():
            await proc.wait_started()
        bases = {name: f"https://{proc.admin_address}" for name, proc in pods.items()}
        # Both are reached by IP as pods are; both are checked against the name of pas-0.
        names = {base: "pas-0.pas.ns.svc" for base in bases.values()}

        def hostname_of(url: str) -> str | None:
            return next((n for b, n in names.items() if url.startswith(b)), None)

        async with aiohttp.ClientSession() as session:
            plain = AdminClient(session, 5.0)
            with pytest.raises(podtls.ClientTlsUnavailable, match="waiting for Secret ns/txnkeeper-operator"):
                await cache.context(kube, "ns")  # type: ignore[arg-type]
            kube.secret = _secret(ca.cert_pem, client, "1")
            context, version = await cache.context(kube, "ns")  # type: ignore[arg-type]
            assert (version, cache.builds) == ("1", 1)
            admin = plain.scoped(
                context, hostname_of, ca_name="Secret ns/txnkeeper-operator-client-tls ca.crt"
            )
            info = await admin.info(bases["pas-0"])  # the pod requires a client certificate: presented
            assert info["pod"] == "pas-0"
            report = await admin.tls(bases["pas-0"])
            assert report.certificate is not None and report.certificate.fingerprint == right.fingerprint
            with pytest.raises(AdminError) as refused:
                await admin.info(bases["impostor-0"])
            text = str(refused.value)
            assert "hostname mismatch: certificate is for *.other.ns.svc" in text, text
            assert "not pas-0.pas.ns.svc" in text, text

            # Unchanged Secret: the same context; a CA rotation's Secret: a new one, no restart.
            assert (await cache.context(kube, "ns"))[0] is context  # type: ignore[arg-type]
            new_ca = pki.new_ca("next CA", now=NOW, validity=365 * DAY)
            both = pki.bundle_pem([new_ca.cert, ca.cert])
            new_client = pki.issue(new_ca, "txnkeeper-operator", now=NOW, validity=30 * DAY, server=False)
            new_leaf = pki.issue(new_ca, "pas", hosts=_hosts("pas"), now=NOW, validity=30 * DAY)
            _files(tmp_path / "pas-0-secret", both, new_leaf)
            kube.secret = _secret(both, new_client, "2")
            rotated, version = await cache.context(kube, "ns")  # type: ignore[arg-type]
            assert rotated is not context and (version, cache.builds) == ("2", 2)
            admin = plain.scoped(rotated, hostname_of)

            async def serves_new_leaf() -> bool:
                try:
                    cert = (await admin.tls(bases["pas-0"])).certificate
                except AdminError as err:
                    # Until the pod re-reads its bundle it does not trust the new client certificate.
                    assert "does not trust our client certificate" in str(err), err
                    return False
                return cert is not None and cert.fingerprint == new_leaf.fingerprint

            deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)
            while not await serves_new_leaf():
                assert dt.datetime.now(dt.UTC) < deadline, "pas-0 never served the new CA's leaf"
                await asyncio.sleep(0.05)
            assert (await admin.info(bases["pas-0"]))["pod"] == "pas-0"
            # Without the Secret (deleted): no call reaches a TLS pod; the reason says what is awaited.
            kube.secret = None
            with pytest.raises(podtls.ClientTlsUnavailable) as missing:
                await cache.context(kube, "ns")  # type: ignore[arg-type]
            refusing = plain.scoped(None, hostname_of, refusal=str(missing.value))
            with pytest.raises(AdminError, match="which the operator's certificate manager or cert-manager"):
                await refusing.info(bases["pas-0"])
    finally:
        for proc in pods.values():
            await proc.stop()
