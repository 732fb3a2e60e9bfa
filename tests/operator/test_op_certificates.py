"""The certificate manager against a real kube-apiserver (the cached etcd + kube-apiserver of
test_op_apiserver.py, its fixture reused), the operator process running under the chart's RBAC.

The operator's own CA: the Secrets it makes (types, owners, hosts, chains), a CA rotation forced by the
annotation going through its phases (held while a pod of the resource has not reported, then on to
the end), and a CA Secret holding garbage refused with a Warning naming the Secret and key and left as
it is. cert-manager mode: the Certificates the operator makes are accepted by cert-manager's own CRD
(fetched by `make cert-manager-crds`; no cert-manager controller runs), the operator waits for the
Secrets naming the Certificate, and reads them once the test writes them as cert-manager would.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from test_op_apiserver import (
    APISERVERS,
    CACHE,
    ETCD,
    _client,
    _cr,
    _free_port,
    _install_crds,
    _operator_kubeconfig,
    _stop,
    apiserver,
    wait_for,
)

from txnkeeper.contract import pki
from txnkeeper_operator.engine import certs

__all__ = ["apiserver"]  # the fixture, imported for pytest

CERT_MANAGER_CRD = (
    Path(os.environ.get("CERT_MANAGER_CRDS") or CACHE / "cert-manager" / "v1.21.2")
    / "certificates.cert-manager.io.yaml"
)
pytestmark = [
    pytest.mark.skipif(not APISERVERS, reason="no kube-apiserver in $CACHE_DIR/k8s (run `make k8s-bins`)"),
    pytest.mark.skipif(ETCD is None, reason="no etcd in $CACHE_DIR/kind/bin (run `make kind-components`)"),
    pytest.mark.timeout(170),
]
TC = "transactioncoordinators"
PAS = "pendingackstores"


@pytest.fixture(scope="module")
def operator(apiserver: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """The CRDs (ours and cert-manager's Certificate) and the operator process; yields an admin client
    and the operator's metrics port."""
    from kubernetes import client

    if not CERT_MANAGER_CRD.exists():
        pytest.skip(f"no {CERT_MANAGER_CRD} (run `make cert-manager-crds`)")
    api = _client(apiserver)
    _install_crds(api)
    ext = client.ApiextensionsV1Api(api)
    with contextlib.suppress(client.ApiException):  # installed by an earlier test of this module
        ext.create_custom_resource_definition(yaml.safe_load(CERT_MANAGER_CRD.read_text()))

    def established() -> bool:
        crd = ext.read_custom_resource_definition("certificates.cert-manager.io")
        conditions = crd.status.conditions if crd.status is not None else None
        return any(c.type == "Established" and c.status == "True" for c in conditions or [])

    wait_for(established, "cert-manager's Certificate CRD established", 30)
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = _operator_kubeconfig(api, apiserver, tmp)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TXNKEEPER_RECONCILE_SECONDS": "1"}
    log = (tmp / "operator.log").open("ab")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "txnkeeper_operator.main", "--liveness=", "--namespace", "own",
         "--namespace", "bad", "--namespace", "cm", "--metrics-port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield api, port
    finally:
        _stop(proc)
        log.close()
    text = (tmp / "operator.log").read_text(errors="replace")
    assert "Forbidden" not in text and "403" not in text, text[-3000:]


def _secret(api: Any, ns: str, name: str) -> Any:
    from kubernetes import client

    try:
        return client.CoreV1Api(api).read_namespaced_secret(name, ns)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def _data(secret: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _tls_status(api: Any, ns: str, plural: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    got = cast(
        dict[str, Any],
        client.CustomObjectsApi(api).get_namespaced_custom_object("txnkeeper.io", "v1", ns, plural, name),
    )
    return dict((got.get("status") or {}).get("tls") or {})


def _events(api: Any, ns: str, reason: str) -> list[Any]:
    from kubernetes import client

    return [e for e in client.CoreV1Api(api).list_namespaced_event(ns).items if e.reason == reason]


def _namespace(api: Any, name: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]


def test_own_ca_secrets_and_a_forced_rotation_held_by_a_pod(operator: tuple[Any, int]) -> None:
    from kubernetes import client

    api, port = operator
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    _namespace(api, "own")
    spec = {"version": "2.0.0", "replicas": 1, "tls": {"enabled": True, "ca": {"overlap": "2s"}}}
    custom.create_namespaced_custom_object(
        "txnkeeper.io", "v1", "own", TC, _cr("TransactionCoordinator", "txn", spec)
    )

    ca_secret = wait_for(lambda: _secret(api, "own", certs.CA_SECRET), "txnkeeper-ca", 40)
    leaf_secret = wait_for(lambda: _secret(api, "own", "txn-tls"), "txn-tls", 20)
    client_secret = wait_for(lambda: _secret(api, "own", certs.CLIENT_SECRET), "the client Secret", 20)
    assert ca_secret.type == "Opaque" and not ca_secret.metadata.owner_references
    assert leaf_secret.type == client_secret.type == "kubernetes.io/tls"
    assert [r.name for r in leaf_secret.metadata.owner_references] == ["txn"]
    assert not client_secret.metadata.owner_references
    first_ca = pki.load_issued(_data(ca_secret)["ca.crt"], _data(ca_secret)["ca.key"], what="ca")
    leaf = pki.load_issued(_data(leaf_secret)["tls.crt"], _data(leaf_secret)["tls.key"], what="leaf")
    assert pki.signed_by(leaf.cert, first_ca.cert)
    assert sorted(pki.hosts_of(leaf.cert)) == sorted(certs.resource_hosts("txn", "own"))
    mine = pki.load_issued(_data(client_secret)["tls.crt"], _data(client_secret)["tls.key"], what="client")
    assert "CN=txnkeeper-operator" in mine.cert.subject.rfc4514_string().split(",")
    tls = wait_for(lambda: _tls_status(api, "own", TC, "txn").get("phase") == "Ready" and _tls_status(
        api, "own", TC, "txn"), "status.tls Ready", 20)  # fmt: skip
    assert tls["mode"] == "operator" and tls["certificateNotAfter"] and tls["caNotAfter"]
    assert wait_for(lambda: _events(api, "own", "CertificateRenewed"), "a CertificateRenewed Event", 20)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        scraped = resp.read().decode()
    expiry = next(
        float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith('txnkeeper_operator_certificate_expiry_seconds{namespace="own",secret="txn-tls"}')
    )
    left = (leaf.not_after - datetime.now(UTC)).total_seconds()
    assert left - 120 < expiry <= left + 1

    # A pod of the resource that has not reported (no kubelet here: it never becomes ready) holds the
    # rotation in trust-new, named in status.tls.
    pod = {
        "metadata": {"name": "txn-0", "labels": {"app.kubernetes.io/name": "txnkeeper",
                                                 "app.kubernetes.io/instance": "txn",
                                                 "app.kubernetes.io/component": "coordinator"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }  # fmt: skip
    # No controller-manager here to make the namespace's default ServiceAccount the pod admission needs.
    core.create_namespaced_service_account("own", {"metadata": {"name": "default"}})  # type: ignore[arg-type]
    core.create_namespaced_pod("own", pod)  # type: ignore[arg-type]
    core.patch_namespaced_secret(
        certs.CA_SECRET, "own", {"metadata": {"annotations": {certs.ROTATE_ANNOTATION: "now"}}}
    )

    def held_by_the_pod() -> dict[str, Any] | None:
        tls = _tls_status(api, "own", TC, "txn")
        return tls if "pod txn-0 to report its TLS state (not ready)" in tls.get("message", "") else None

    held = wait_for(held_by_the_pod, "the rotation held by txn-0", 30)
    assert held["phase"] == "trust-new"
    during = _data(_secret(api, "own", certs.CA_SECRET))
    assert pki.fingerprint(pki.load_bundle(during["ca-previous.crt"], what="p")[0]) == first_ca.fingerprint
    # the old CA's key is held through trust-new (certificates issued meanwhile come from it)
    assert pki.load_issued(during["ca-previous.crt"], during["ca-previous.key"], what="p").fingerprint == (
        first_ca.fingerprint
    )
    assert len(pki.load_bundle(_data(_secret(api, "own", "txn-tls"))["ca.crt"], what="b")) == 2
    assert _events(api, "own", "CertificateAuthorityRotating")

    core.delete_namespaced_pod("txn-0", "own", grace_period_seconds=0)
    wait_for(lambda: _events(api, "own", "CertificateAuthorityRotated"), "CertificateAuthorityRotated", 40)
    after = _data(_secret(api, "own", certs.CA_SECRET))
    assert "ca-previous.crt" not in after and "ca-previous.key" not in after
    new_ca = pki.load_bundle(after["ca.crt"], what="ca")[0]
    assert pki.fingerprint(new_ca) != first_ca.fingerprint
    leaf_now = _data(_secret(api, "own", "txn-tls"))
    assert pki.signed_by(pki.load_bundle(leaf_now["tls.crt"], what="l")[0], new_ca)
    assert [pki.fingerprint(c) for c in pki.load_bundle(leaf_now["ca.crt"], what="b")] == [
        pki.fingerprint(new_ca)
    ]
    wait_for(
        lambda: _tls_status(api, "own", TC, "txn").get("phase") == "Ready", "Ready after the rotation", 20
    )


def test_a_ca_secret_with_garbage_is_refused_and_left_alone(operator: tuple[Any, int]) -> None:
    from kubernetes import client

    api, _port = operator
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    _namespace(api, "bad")
    garbage = {
        "ca.crt": base64.b64encode(b"not a certificate").decode(),
        "ca.key": base64.b64encode(b"x").decode(),
    }
    core.create_namespaced_secret(
        "bad",
        {"metadata": {"name": certs.CA_SECRET}, "type": "Opaque", "data": garbage},  # type: ignore[arg-type]
    )
    version = _secret(api, "bad", certs.CA_SECRET).metadata.resource_version
    custom.create_namespaced_custom_object(
        "txnkeeper.io",
        "v1",
        "bad",
        PAS,
        _cr("PendingAckStore", "pas", {"version": "2.0.0", "tls": {"enabled": True}}),
    )
    refused = wait_for(lambda: _events(api, "bad", "CertificateRefused"), "a CertificateRefused Event", 40)
    assert refused[0].type == "Warning"
    assert "Secret bad/txnkeeper-ca keys ca.crt/ca.key" in refused[0].message, refused[0].message
    assert "kubectl -n bad delete secret txnkeeper-ca" in refused[0].message
    assert _tls_status(api, "bad", PAS, "pas")["phase"] == "Refused"
    assert _secret(api, "bad", certs.CA_SECRET).metadata.resource_version == version
    assert _secret(api, "bad", "pas-tls") is None


def test_cert_manager_mode_makes_certificates_and_waits_for_their_secrets(operator: tuple[Any, int]) -> None:
    from kubernetes import client

    api, _port = operator
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    _namespace(api, "cm")
    ref = {"name": "corp-issuer", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    tls = {
        "enabled": True,
        "renewBefore": "360h",
        "certificateValidity": "1440h",
        "certManager": {"issuerRef": ref},
    }
    custom.create_namespaced_custom_object(
        "txnkeeper.io", "v1", "cm", PAS, _cr("PendingAckStore", "pas", {"version": "2.0.0", "tls": tls})
    )

    def certificate(name: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any],
                custom.get_namespaced_custom_object("cert-manager.io", "v1", "cm", "certificates", name),
            )
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise

    # Accepted by cert-manager's CRD (the API server validated it against that schema).
    leaf_cert = wait_for(lambda: certificate("pas-tls"), "Certificate pas-tls", 40)
    client_cert = wait_for(lambda: certificate("txnkeeper-operator-client"), "the client Certificate", 20)
    assert leaf_cert["spec"]["issuerRef"] == ref and leaf_cert["spec"]["secretName"] == "pas-tls"
    assert (leaf_cert["spec"]["duration"], leaf_cert["spec"]["renewBefore"]) == ("1440h", "360h")
    assert sorted(leaf_cert["spec"]["dnsNames"] + leaf_cert["spec"]["ipAddresses"]) == sorted(
        certs.resource_hosts("pas", "cm")
    )
    assert leaf_cert["spec"]["usages"] == ["server auth", "client auth", "digital signature"]
    assert [o["name"] for o in leaf_cert["metadata"]["ownerReferences"]] == ["pas"]
    assert client_cert["spec"]["secretName"] == certs.CLIENT_SECRET
    assert "ownerReferences" not in client_cert["metadata"]
    # The same CRD refuses what cert-manager could not use: the validation is real.
    bad = {**leaf_cert, "metadata": {"name": "bad"}, "spec": {**leaf_cert["spec"], "usages": ["bogus"]}}
    with pytest.raises(client.ApiException) as refused:
        custom.create_namespaced_custom_object("cert-manager.io", "v1", "cm", "certificates", bad)
    assert refused.value.status == 422

    pending = wait_for(lambda: _events(api, "cm", "CertificatePending"), "a CertificatePending Event", 20)
    assert "Certificate cm/pas-tls" in pending[0].message, pending[0].message
    assert _tls_status(api, "cm", PAS, "pas")["phase"] == "Pending"

    # cert-manager (played by the test) issues both Secrets.
    now = datetime.now(UTC)
    ca = pki.new_ca("corp", now=now, validity=timedelta(days=30))
    leaf = pki.issue(ca, "pas", hosts=certs.resource_hosts("pas", "cm"), now=now, validity=timedelta(days=10))
    mine = pki.issue(ca, "txnkeeper-operator", now=now, validity=timedelta(days=10), server=False)
    for name, issued in (("pas-tls", leaf), (certs.CLIENT_SECRET, mine)):
        data = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem}
        core.create_namespaced_secret("cm", {  # type: ignore[arg-type]
            "metadata": {"name": name}, "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        })  # fmt: skip
    versions = {n: _secret(api, "cm", n).metadata.resource_version for n in ("pas-tls", certs.CLIENT_SECRET)}
    ready = wait_for(lambda: _tls_status(api, "cm", PAS, "pas").get("phase") == "Ready" and _tls_status(
        api, "cm", PAS, "pas"), "status.tls Ready", 30)  # fmt: skip
    assert ready["mode"] == "cert-manager" and leaf.fingerprint[:12] in ready["message"]
    assert ready["certificateNotAfter"].startswith(leaf.not_after.strftime("%Y-%m-%dT%H:%M:%S"))
    # The operator never writes cert-manager's Secrets, and makes no CA of its own there.
    assert {n: _secret(api, "cm", n).metadata.resource_version for n in versions} == versions
    assert _secret(api, "cm", certs.CA_SECRET) is None
