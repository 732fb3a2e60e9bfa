"""GET /admin/v1/tls (docs/contracts.md §5): a real TLS pod reports the certificate it serves, its
issuer and the CAs it trusts, and the answer follows a rotation of its files without a restart (what
the operator's certificate engine waits on); a rotation it cannot use shows as reloadFailing beside
the certificate still served. No token is needed. The verifier's pod discovery reaches TLS pods at
https:// by their DNS names, and its and the offload audit's fetches reach a real TLS pod with the
mounted Secret's env (and are refused, saying why, without the client certificate)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from runtime_pods import ServePod
from runtime_waits import wait_until
from tls_certs import replace_atomically
from tls_pods import start_tls_pod

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient, AdminError, PodTls
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.verifier import fetch, k8s, offload_audit
from txnkeeper.verifier.model import PodEndpoint

WITHIN = 20.0
HOSTS = ("*.pas.ns.svc", "localhost", "127.0.0.1")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write(directory: Path, leaf: pki.Issued, *cas: pki.Issued) -> None:
    replace_atomically(directory / "ca.crt", pki.bundle_pem(ca.cert for ca in cas))
    replace_atomically(directory / "tls.key", leaf.key_pem)
    replace_atomically(directory / "tls.crt", leaf.cert_pem)


def _leaf(ca: pki.Issued, name: str = "pas") -> pki.Issued:
    return pki.issue(ca, name, hosts=HOSTS, now=_now(), validity=dt.timedelta(days=30))


async def test_the_tls_report_follows_a_rotation_without_a_restart(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    old_ca = pki.new_ca("old CA", now=_now(), validity=dt.timedelta(days=365))
    first = _leaf(old_ca)
    _write(secret, first, old_ca)
    flags = [
        *("--tls-cert-file", str(secret / "tls.crt"), "--tls-key-file", str(secret / "tls.key")),
        *("--tls-ca-file", str(secret / "ca.crt"), "--tls-reload-interval", "0.2"),
        *("--tls-admin-client-auth", "request"),
    ]
    pod = ServePod(tmp_path, "pas-0", "store", extra=flags)
    trust = TlsClientSettings(str(secret / "ca.crt"))
    try:
        start_tls_pod(pod, trust)
        assert pod.process is not None
        pid = pod.process.pid
        base = f"https://{pod.admin}"
        async with aiohttp.ClientSession() as session:
            # No token and no client certificate: the report is read-only.
            admin = AdminClient(session, 5.0, tls=trust.context())
            report = await admin.tls(base)
            assert report.enabled and report.certificate is not None
            assert report.certificate.fingerprint == first.fingerprint
            assert report.certificate.issuer_fingerprint == old_ca.fingerprint
            assert report.certificate.hosts == HOSTS
            assert report.certificate.not_after == first.not_after.isoformat()
            assert report.trusted_cas == (old_ca.fingerprint,)
            assert set(report.listeners) == {"client", "admin", "peers"}
            assert not report.reload_failing
            loaded = dt.datetime.fromisoformat(str(report.loaded_at))

            # A CA rotation's first step: both CAs trusted, then a leaf of the new CA.
            new_ca = pki.new_ca("new CA", now=_now(), validity=dt.timedelta(days=365))
            _write(secret, first, new_ca, old_ca)
            both = TlsClientSettings(str(secret / "ca.crt")).context()
            admin = AdminClient(session, 5.0, tls=both)

            async def trusts_both() -> bool:
                return set((await admin.tls(base)).trusted_cas) == {new_ca.fingerprint, old_ca.fingerprint}

            await wait_until(trusts_both, WITHIN, "the pod to trust the old and the new CA")
            second = _leaf(new_ca)
            _write(secret, second, new_ca, old_ca)

            async def serves_second() -> bool:
                cert = (await admin.tls(base)).certificate
                return cert is not None and cert.fingerprint == second.fingerprint

            await wait_until(serves_second, WITHIN, "the pod to serve the leaf of the new CA")
            report = await admin.tls(base)
            assert report.certificate is not None
            assert report.certificate.issuer_fingerprint == new_ca.fingerprint
            assert dt.datetime.fromisoformat(str(report.loaded_at)) > loaded

            # A key of another certificate: refused, the old pair stays served and the report says so.
            replace_atomically(secret / "tls.key", _leaf(new_ca, "other").key_pem)

            async def failing() -> bool:
                return (await admin.tls(base)).reload_failing

            await wait_until(failing, WITHIN, "the pod to report the unusable rotation")
            report = await admin.tls(base)
            assert report.certificate is not None and report.certificate.fingerprint == second.fingerprint
        assert pod.process.pid == pid and pod.process.poll() is None
        assert "Traceback" not in pod.log()
    finally:
        pod.stop()


def test_a_report_of_another_shape_is_refused_naming_what_is_wrong() -> None:
    assert PodTls.from_json({"enabled": False}) == PodTls(False)
    assert PodTls(False).to_json() == {"enabled": False}
    with pytest.raises(AdminError, match="malformed TLS report: not an object with a boolean 'enabled'"):
        PodTls.from_json({"enabled": "yes"})
    with pytest.raises(AdminError, match="malformed TLS report: 'certificate'"):
        PodTls.from_json({"enabled": True})


def _pod(name: str, ip: str | None, subdomain: str | None = "pas") -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name),
        status=SimpleNamespace(pod_ip=ip, phase="Running"),
        spec=SimpleNamespace(subdomain=subdomain),
    )


class _Pods:
    def __init__(self, *pods: SimpleNamespace) -> None:
        self.pods = pods

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> SimpleNamespace:
        return SimpleNamespace(items=list(self.pods))


def test_discovery_reaches_tls_pods_by_their_dns_names(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _Pods(_pod("pas-0", "10.1.0.7"), _pod("pas-1", None))
    monkeypatch.delenv("TXNKEEPER_TLS_CA_FILE", raising=False)
    plain = k8s.discover_pods(api, "ns", ["sel"], 8080)
    assert [e.url for e in plain] == ["http://10.1.0.7:8080", None]
    monkeypatch.setenv("TXNKEEPER_TLS_CA_FILE", "/etc/txnkeeper/tls/ca.crt")
    tls = k8s.discover_pods(api, "ns", ["sel"], 8080)
    # The name the pod's certificate (*.pas.ns.svc) is for, resolved through the headless Service.
    assert [e.url for e in tls] == ["https://pas-0.pas.ns.svc:8080", None]
    no_service = k8s.discover_pods(_Pods(_pod("x-0", "10.1.0.8", subdomain=None)), "ns", ["sel"], 8080)
    assert no_service[0].url is None and "no headless Service" in str(no_service[0].note)


def test_the_verifier_fetches_from_a_tls_pod_with_the_mounted_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    ca = pki.new_ca("CA", now=_now(), validity=dt.timedelta(days=365))
    _write(secret, _leaf(ca), ca)
    job = _leaf(ca, "verifier-job")  # the resource's own leaf in the cluster: a client certificate too
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    _write(job_dir, job, ca)
    flags = [
        *("--tls-cert-file", str(secret / "tls.crt"), "--tls-key-file", str(secret / "tls.key")),
        *("--tls-ca-file", str(secret / "ca.crt"), "--tls-admin-client-auth", "require"),
    ]
    pod = ServePod(tmp_path, "pas-0", "store", extra=flags)
    with_cert = TlsClientSettings(str(job_dir / "ca.crt"), str(job_dir / "tls.crt"), str(job_dir / "tls.key"))
    try:
        start_tls_pod(pod, with_cert)
        port = pod.admin.rsplit(":", 1)[1]
        url = f"https://localhost:{port}"
        for name, value in (("CA", "ca.crt"), ("CERT", "tls.crt"), ("KEY", "tls.key")):
            monkeypatch.setenv(f"TXNKEEPER_TLS_{name}_FILE", str(job_dir / value))
        fetch._opener.cache_clear()  # read once per process from the env: this test changes it
        offload_audit._opener.cache_clear()
        result = fetch.fetch_ledgers(PodEndpoint("pas-0", url), 10.0)
        assert result.error is None and isinstance(result.document, dict), result.error
        # The offload audit's reading of the pods' segments, the same way.
        refs, problems = offload_audit.fetch_segments([PodEndpoint("pas-0", url)], 10.0)
        assert (refs, problems) == ([], [])
        # Without the client certificate the pod (admin clientAuth require) refuses at the handshake.
        monkeypatch.delenv("TXNKEEPER_TLS_CERT_FILE")
        monkeypatch.delenv("TXNKEEPER_TLS_KEY_FILE")
        fetch._opener.cache_clear()
        offload_audit._opener.cache_clear()
        refused = fetch.fetch_ledgers(PodEndpoint("pas-0", url), 10.0)
        assert refused.document is None and "requires a client certificate" in str(refused.error)
        _, problems = offload_audit.fetch_segments([PodEndpoint("pas-0", url)], 10.0)
        assert [p.kind for p in problems] == ["pod-unreadable"]
        assert "requires a client certificate" in problems[0].detail, problems[0].detail
    finally:
        fetch._opener.cache_clear()
        offload_audit._opener.cache_clear()
        pod.stop()
