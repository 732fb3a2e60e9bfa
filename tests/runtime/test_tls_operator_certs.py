"""The operator's certificate engine driving a real ``txnkeeper serve`` pod through a CA rotation.

The engine's Secrets are laid out as the pod's mounted files (re-read by the pod every 0.2 s here), and
the pod's TLS report is taken from what the real pod does, not from what it says: the certificate a new
connection is served, and which CAs it trusts, probed by handshakes that present a client certificate
of each CA on an admin port that requires one. Through every phase the operator's own client
certificate (the engine's ``txnkeeper-operator-client-tls``) must reach the pod over mutual TLS; at the
end the retired CA's certificates are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from runtime_pods import ServePod
from tls_certs import replace_atomically
from tls_pods import start_tls_pod

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper_operator.engine import certs
from txnkeeper_operator.engine.certs import CertAction, CertInput, PodTls, SecretData

NS = "apps"
NAME = "pas"


class Namespace:
    """The Secrets as the engine wrote them, and every CA it made (with its key, to probe trust)."""

    def __init__(self, directory: Path) -> None:
        self.secrets: dict[str, SecretData] = {}
        self.cas: list[pki.Issued] = []
        self.directory = directory
        self.spec = certs.TlsSpec(overlap=timedelta(seconds=1))

    def apply(self, action: CertAction) -> None:
        before = self.secrets.get(action.secret)
        data = {**(before.data if before else {})}
        notes = {**(before.annotations if before else {})}
        for key, value in action.data.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        for key, note in action.annotations.items():
            if note is None:
                notes.pop(key, None)
            else:
                notes[key] = note
        self.secrets[action.secret] = SecretData(action.secret, data, notes)
        if certs.CA_KEY in action.data and action.data[certs.CA_KEY] is not None:
            self.cas.append(pki.load_issued(data[certs.CA_CERT], data[certs.CA_KEY], what="ca"))

    def mount(self) -> None:
        """The kubelet's refresh of the pod's Secret volume and the operator's read of its own."""
        leaf = self.secrets[f"{NAME}-tls"].data
        for key in (certs.TLS_KEY, certs.TLS_CERT, certs.CA_CERT):
            replace_atomically(self.directory / "pod" / key, leaf[key])
        mine = self.secrets[certs.CLIENT_SECRET].data
        for key in (certs.TLS_KEY, certs.TLS_CERT, certs.CA_CERT):
            replace_atomically(self.directory / "operator" / key, mine[key])

    def phase(self) -> str:
        ca = self.secrets.get(certs.CA_SECRET)
        return ca.annotations.get(certs.PHASE_ANNOTATION, "") if ca else ""

    def plan(self, report: PodTls | None) -> certs.CertPlan:
        return certs.plan(
            CertInput(
                namespace=NS,
                resource=NAME,
                label=f"PendingAckStore/{NAME}",
                hosts=certs.resource_hosts(NAME, NS),
                spec=self.spec,
                ca=self.secrets.get(certs.CA_SECRET),
                leaf=self.secrets.get(f"{NAME}-tls"),
                client=self.secrets.get(certs.CLIENT_SECRET),
                pods=(report,) if report is not None else (),
                peers=(),
                now=datetime.now(UTC),
            )
        )


def _handshake(address: str, ca_file: Path, client: pki.Issued | None, tmp: Path) -> ssl.SSLSocket | None:
    """A new TLS connection to the pod's admin port presenting ``client`` (None: the handshake failed)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False
    if client is not None:
        (tmp / "probe.crt").write_bytes(client.cert_pem)
        (tmp / "probe.key").write_bytes(client.key_pem)
        context.load_cert_chain(str(tmp / "probe.crt"), str(tmp / "probe.key"))
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    try:
        tls = context.wrap_socket(sock, server_hostname=host)
        # TLS 1.3 reports a refused client certificate after the handshake: read to see the alert.
        tls.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            tls.recv(1)
        return tls
    except (ssl.SSLError, OSError):
        sock.close()
        return None


def report(ns: Namespace, pod: ServePod, tmp: Path) -> PodTls:
    """What the pod serves and trusts, by its behaviour."""
    every_ca = tmp / "every-ca.crt"
    every_ca.write_bytes(pki.bundle_pem(ca.cert for ca in ns.cas))
    now = datetime.now(UTC)
    trusted: set[str] = set()
    served: bytes | None = None
    for ca in ns.cas:
        probe = pki.issue(ca, "probe", now=now, validity=timedelta(hours=1), server=False)
        tls = _handshake(pod.admin, every_ca, probe, tmp)
        if tls is None:
            continue
        served = tls.getpeercert(binary_form=True)
        tls.close()
        trusted.add(ca.fingerprint)
    if served is None:
        return PodTls(pod.name, problem="no handshake succeeded")
    from cryptography import x509

    cert = x509.load_der_x509_certificate(served)
    issuer = next((ca.fingerprint for ca in ns.cas if pki.signed_by(cert, ca.cert)), None)
    return PodTls(pod.name, True, pki.fingerprint(cert), issuer, frozenset(trusted))


async def _operator_call(ns: Namespace, pod: ServePod) -> None:
    """The operator's admin call with its client Secret as it is now: must never fail."""
    mine = ns.directory / "operator"
    settings = TlsClientSettings(str(mine / "ca.crt"), str(mine / "tls.crt"), str(mine / "tls.key"))
    async with aiohttp.ClientSession() as session:
        info = await AdminClient(session, tls=settings).info(f"https://{pod.admin}")
    assert info["role"] == "store"


@pytest.mark.timeout(120)
def test_a_real_pod_follows_a_rotation_and_the_operator_reaches_it_throughout(tmp_path: Path) -> None:
    ns = Namespace(tmp_path)
    (tmp_path / "pod").mkdir()
    (tmp_path / "operator").mkdir()
    for action in ns.plan(None).actions:
        ns.apply(action)
    ns.mount()
    pod_dir = tmp_path / "pod"
    pod = ServePod(
        tmp_path,
        f"{NAME}-0",
        "store",
        extra=[
            "--tls-cert-file", str(pod_dir / "tls.crt"), "--tls-key-file", str(pod_dir / "tls.key"),
            "--tls-ca-file", str(pod_dir / "ca.crt"), "--tls-admin-client-auth", "require",
            "--tls-reload-interval", "0.2",
        ],
    )  # fmt: skip
    mine = tmp_path / "operator"
    try:
        start_tls_pod(
            pod, TlsClientSettings(str(mine / "ca.crt"), str(mine / "tls.crt"), str(mine / "tls.key"))
        )
        asyncio.run(_operator_call(ns, pod))
        first_ca = ns.cas[0]

        ca = ns.secrets[certs.CA_SECRET]
        ns.secrets[certs.CA_SECRET] = SecretData(
            ca.name, ca.data, {**ca.annotations, certs.ROTATE_ANNOTATION: "now"}
        )
        phases: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"the rotation did not end: phases {phases}"
            rotating = ns.phase() != ""
            plan = ns.plan(report(ns, pod, tmp_path) if rotating else None)
            for action in plan.actions:
                ns.apply(action)
                phase = action.annotations.get(certs.PHASE_ANNOTATION)
                if action.secret == certs.CA_SECRET and phase:
                    phases.append(phase)
            ns.mount()
            asyncio.run(_operator_call(ns, pod))
            if phases and not ns.phase():
                break
            time.sleep(0.3)  # the pod re-reads its files every 0.2 s
        assert phases == ["trust-new", "reissue", "retire-old"]
        assert len(ns.cas) == 2
        new_ca = ns.cas[1]

        def settled() -> PodTls | None:
            got = report(ns, pod, tmp_path)
            return got if got.trusted == {new_ca.fingerprint} else None

        deadline = time.monotonic() + 10
        final = settled()
        while final is None and time.monotonic() < deadline:
            time.sleep(0.2)
            final = settled()
        assert final is not None, report(ns, pod, tmp_path)
        assert final.issuer == new_ca.fingerprint
        # A certificate of the retired CA is refused now.
        probe = pki.issue(first_ca, "old", now=datetime.now(UTC), validity=timedelta(hours=1), server=False)
        assert _handshake(pod.admin, tmp_path / "every-ca.crt", probe, tmp_path) is None
        asyncio.run(_operator_call(ns, pod))
    finally:
        pod.stop()
