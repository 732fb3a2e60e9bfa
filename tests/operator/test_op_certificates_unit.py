"""The certificate manager's pure edges: spec.tls durations and their refusals, the operator's TLS
default, a pod's TLS report (the JSON of GET /admin/v1/tls) as the engine reads it, and the expiry
gauge as Prometheus scrapes it."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from txnkeeper_operator import certificates, metrics, observe
from txnkeeper_operator.engine import certs
from txnkeeper_operator.engine.certs import CertSpecError, PodTls, TlsSpec
from txnkeeper_operator.kube import KindNotServed
from txnkeeper_operator.resource import Resource


def test_the_engines_durations_are_go_style_and_its_limits_hold() -> None:
    # spec.tls itself is read and refused by tlsspec (test_op_tlsspec); the engine's own value keeps its
    # limits for any caller, and its parser reads the scenarios' durations.
    assert certs.parse_duration("1h30m", "x") == timedelta(minutes=90)
    assert certs.parse_duration("45s", "x") == timedelta(seconds=45)
    with pytest.raises(CertSpecError, match="'30d' is not a duration"):
        certs.parse_duration("30d", "spec.tls.renewBefore")
    with pytest.raises(CertSpecError, match=r"renewBefore \(2160h\) must be shorter"):
        TlsSpec(renew_before=timedelta(hours=2160))


def test_the_operators_default_applies_where_the_spec_says_nothing() -> None:
    bare = Resource.from_body(
        {"kind": "PendingAckStore", "metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {}}
    )
    assert certificates.enabled(bare, True) and not certificates.enabled(bare, False)
    cr = Resource.from_body(
        {
            "kind": "PendingAckStore",
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {
                "version": "2.0.0",
                "tls": {"enabled": True, "certManager": {"issuerRef": {"name": "i"}}},
            },
        }
    )
    assert certificates.enabled(cr, False) and certificates.issuer_ref(cr) == {"name": "i"}


def test_a_pods_tls_report_as_the_engine_reads_it() -> None:
    doc = {
        "enabled": True,
        "listeners": ["client", "admin", "peers"],
        "certificate": {"fingerprint": "aa", "notAfter": "2027-01-01T00:00:00Z", "issuerFingerprint": "ca1",
                        "hosts": ["*.txn.ns.svc"]},
        "trustedCAs": ["ca1", "ca2"],
        "loadedAt": "2026-11-29T00:00:00Z",
        "reloadFailing": True,
    }  # fmt: skip
    assert observe.tls_report("txn-0", doc) == PodTls(
        "txn-0",
        enabled=True,
        fingerprint="aa",
        issuer="ca1",
        trusted=frozenset({"ca1", "ca2"}),
        reload_failing=True,
    )
    assert observe.tls_report("txn-0", {"enabled": False}) == PodTls("txn-0", enabled=False)
    assert observe.tls_report("txn-0", {"enabled": True}).problem == (
        "its TLS report has no 'certificate' object or 'trustedCAs' list"
    )
    assert observe.tls_report("txn-0", ["not", "an", "object"]).problem is not None


def test_certificate_expiry_is_served_as_seconds_left() -> None:
    registry = CollectorRegistry()
    gauge = metrics.CertificateMetrics(clock=lambda: 1_000.0)
    registry.register(gauge)
    port = metrics.serve(0, address="127.0.0.1", registry=CollectorRegistry())
    gauge.record("apps", "txn-tls", datetime.fromtimestamp(1_000 + 86_400, UTC))
    gauge.record("apps", "txnkeeper-ca", datetime.fromtimestamp(400, UTC))
    samples = {
        s.labels["secret"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "txnkeeper_operator_certificate_expiry_seconds"
    }
    assert samples == {"txn-tls": 86_400.0, "txnkeeper-ca": -600.0}
    gauge.forget("apps", "txnkeeper-ca")
    assert [s.labels["secret"] for f in registry.collect() for s in f.samples] == ["txn-tls"]
    # The operator's endpoint serves the shared gauge too.
    metrics.CERTIFICATES.record("apps", "served-tls", datetime.now(UTC) + timedelta(days=1))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    names = {s.labels.get("secret") for f in text_string_to_metric_families(text) for s in f.samples}
    metrics.CERTIFICATES.forget("apps", "served-tls")
    assert "served-tls" in names


class _Kube:
    """Only what a refused spec, a disabled resource and a cluster without cert-manager touch."""

    def __init__(self) -> None:
        self.status: list[dict[str, object]] = []

    async def apply_custom(self, plural: str, manifest: dict[str, object]) -> None:
        raise KindNotServed(f"{plural}.cert-manager.io/v1 is not served by the API server")

    async def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, object]) -> None:
        self.status.append(status)


class _Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def emit(self, body: object, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))


async def test_a_refusal_is_published_once_and_tls_off_clears_the_status() -> None:
    from txnkeeper_operator.context import Context
    from txnkeeper_operator.settings import OperatorSettings

    body = {
        "kind": "TransactionCoordinator",
        "metadata": {"name": "txn", "namespace": "ns", "uid": "u"},
        "spec": {"version": "2.0.0", "tls": {"enabled": True, "renewBefore": "3000h"}},
    }
    kube, events = _Kube(), _Events()
    ctx = Context(kube=kube, admin=None, settings=OperatorSettings(), events=events)  # type: ignore[arg-type]
    cr = Resource.from_body(body)
    view = await certificates.ensure(ctx, cr, body, {})
    assert view is not None and view.phase == "Refused"
    assert kube.status == [{"tls": certificates.view_to_status(view)}]
    assert events.posted == [("Warning", "CertificateRefused", view.message)]
    assert "spec.tls.renewBefore (3000h) must be shorter" in view.message
    # The next reconcile sees the same refusal in status: no second Event, no second write.
    await certificates.ensure(ctx, cr, body, {"tls": kube.status[0]["tls"]})
    assert len(events.posted) == 1 and len(kube.status) == 1

    cert_manager = {"version": "2.0.0", "tls": {"enabled": True, "certManager": {"issuerRef": {"name": "i"}}}}
    absent = await certificates.ensure(ctx, Resource.from_body({**body, "spec": cert_manager}), body, {})
    assert absent is not None and absent.phase == "Refused"
    assert absent.message.startswith(
        "spec.tls.certManager is set but certificates.cert-manager.io/v1 is not served by the API server:"
        " install cert-manager (its CRDs)"
    )
    assert events.posted[-1] == ("Warning", "CertificateRefused", absent.message)

    off = Resource.from_body({**body, "spec": {"version": "2.0.0", "tls": {"enabled": False}}})
    assert await certificates.ensure(ctx, off, body, {"tls": kube.status[0]["tls"]}) is None
    assert kube.status[-1] == {"tls": None}
