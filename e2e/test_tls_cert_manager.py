"""cert-manager mode on a real cluster (issue 28): the operator makes cert-manager Certificates, kind's API
server validates them against cert-manager's own CRD, the test plays cert-manager (no controller runs
here: it issues each Secret from its own CA, as an Issuer would), the pods start on those Secrets and
serve transactions over mutual TLS, and a re-issued Secret (cert-manager renewing with a new key) is
taken by every pod without a restart.

Why on kind as well as against the operator tests' API server: the Secrets are mounted by the kubelet
(refreshed in place on renewal), probes run over HTTPS with that material, and the load's clients in
other pods verify the pods against the Issuer's CA, none of which exists without a cluster.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from e2e.helpers import Cluster, wait_for
from e2e.test_operator import PAS, TC, apply, get_cr, run_workload, wait_cr
from e2e.test_operator import operator as operator  # noqa: PLC0414 (the module's fixture, shared)
from e2e.test_scaling import balanced_at, dns, verify
from e2e.test_tls import TOPICS, every_pod_serves, pods_of
from txnkeeper.contract import pki

Obj = dict[str, Any]
CACHE = Path(os.environ.get("CACHE_DIR") or Path.home() / ".cache" / "txnkeeper")
CERT_MANAGER_CRD = (
    Path(os.environ.get("CERT_MANAGER_CRDS") or CACHE / "cert-manager" / "v1.21.2")
    / "certificates.cert-manager.io.yaml"
)
ISSUER = {"name": "corp-issuer", "kind": "ClusterIssuer", "group": "cert-manager.io"}
CLIENT_CERTIFICATE = "txnkeeper-operator-client"
MANIFESTS = f"""
apiVersion: txnkeeper.io/v1
kind: TransactionCoordinator
metadata: {{name: txn}}
spec:
  version: "2.0.0"
  replicas: 1
  coordinators: 2
  storage: {{size: 64Mi}}
  tls: {{enabled: true, clientAuth: require, certManager: {{issuerRef: {json.dumps(ISSUER)}}}}}
---
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {{name: acks}}
spec:
  version: "2.0.0"
  replicas: 1
  shards: 4
  storage: {{size: 64Mi}}
  tls: {{enabled: true, clientAuth: require, certManager: {{issuerRef: {json.dumps(ISSUER)}}}}}
"""


def certificate(cluster: Cluster, ns: str, name: str, version: str) -> Obj | None:
    from kubernetes import client

    try:
        return cast(
            Obj,
            cluster.custom.get_namespaced_custom_object("cert-manager.io", version, ns, "certificates", name),
        )
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise


def issue_as_cert_manager(
    cluster: Cluster, ns: str, cert: Obj, ca: pki.Issued, *, replace: bool
) -> pki.Issued:
    """What cert-manager's controller does for a Certificate: a key and a certificate for exactly what
    its spec asks, from the Issuer's CA, in the Secret it names (``ca.crt`` = the Issuer's CA)."""
    spec = cert["spec"]
    usages = set(spec.get("usages") or [])
    issued = pki.issue(
        ca,
        spec.get("commonName") or cert["metadata"]["name"],
        hosts=[*spec.get("dnsNames", []), *spec.get("ipAddresses", [])],
        now=datetime.now(UTC),
        validity=timedelta(days=10),
        server="server auth" in usages,
        client="client auth" in usages,
    )
    data = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem}
    body = {
        "metadata": {"name": spec["secretName"]},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    if replace:
        cluster.core.replace_namespaced_secret(spec["secretName"], ns, body)  # type: ignore[arg-type]
    else:
        cluster.core.create_namespaced_secret(ns, body)  # type: ignore[arg-type]
    return issued


@pytest.fixture(scope="module")
def certificate_version(cluster: Cluster) -> Iterator[str]:
    """cert-manager's Certificate CRD installed in the cluster; yields the version it stores (what the
    operator writes and the test reads)."""
    if not CERT_MANAGER_CRD.exists():
        pytest.skip(f"no {CERT_MANAGER_CRD} (run `make cert-manager-crds`)")
    # create, not apply: the CRD is larger than apply's last-applied annotation may be
    cluster.kubectl("create", "-f", str(CERT_MANAGER_CRD), check=False)
    cluster.kubectl(
        "wait", "--for", "condition=established", "--timeout", "60s", "crd/certificates.cert-manager.io"
    )
    crd = json.loads(cluster.kubectl("get", "crd", "certificates.cert-manager.io", "-o", "json").stdout)
    yield next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))


@pytest.mark.timeout(900)
def test_cert_manager_certificates_validated_issued_served_and_renewed_without_restarts(
    cluster: Cluster, operator: str, namespace: str, certificate_version: str
) -> None:
    ns = namespace
    assert certificate_version == "v1", (
        f"the operator writes cert-manager.io/v1, the CRD stores {certificate_version}"
    )
    apply(cluster, ns, MANIFESTS)
    names = ("txn-tls", "acks-tls", CLIENT_CERTIFICATE)
    wanted: dict[str, Obj] = {}
    for name in names:

        def made(name: str = name) -> Obj | None:
            return certificate(cluster, ns, name, certificate_version)

        wanted[name] = wait_for(made, f"the Certificate {name}", 120)
    # kind's API server accepted them against cert-manager's CRD; they ask for what the pods need.
    for name in ("txn-tls", "acks-tls"):
        spec = wanted[name]["spec"]
        assert spec["issuerRef"] == ISSUER and spec["secretName"] == name, spec
        assert any(h.endswith(f".{ns}.svc") for h in spec["dnsNames"]), spec["dnsNames"]
        assert set(spec["usages"]) >= {"server auth", "client auth"}, spec["usages"]
    assert wanted[CLIENT_CERTIFICATE]["spec"]["secretName"] == "txnkeeper-operator-client-tls"

    ca = pki.new_ca("corp issuer CA", now=datetime.now(UTC), validity=timedelta(days=30))
    issued = {name: issue_as_cert_manager(cluster, ns, wanted[name], ca, replace=False) for name in names}
    for name, plural in (("txn", TC), ("acks", PAS)):
        wait_cr(cluster, ns, plural, name, balanced_at(1), "Ready on 1 pod", 420)
        tls = get_cr(cluster, ns, plural, name)["status"]["tls"]
        assert tls["mode"] == "cert-manager", tls
    secrets = {s.metadata.name for s in cluster.core.list_namespaced_secret(ns).items if s.metadata}
    assert "txnkeeper-ca" not in secrets, "the operator made a CA of its own in cert-manager mode"
    assert wait_for(
        lambda: every_pod_serves(cluster, ns, issued["acks-tls"].cert, ca.cert),
        "pods serving the leaves",
        120,
    )
    pods = pods_of(cluster, ns)

    subscribed = run_workload(
        cluster, ns, "subscribe", "--stores", dns(ns, "acks"), "--topics", TOPICS,
        "--subscription", "audit", tls_secret="acks-tls",
    )  # fmt: skip
    assert subscribed is not None
    load = [
        run_workload(
            cluster, ns, "produce", "--coordinators", dns(ns, "txn"), "--stores", dns(ns, "acks"),
            "--topics", TOPICS, "--txns", "4", "--seconds", "10", "--tag", "before", timeout=300,
            tls_secret="acks-tls",
        )
    ]  # fmt: skip

    # cert-manager renews acks-tls (a new key, as its default rotationPolicy does): the pod takes it.
    renewed = issue_as_cert_manager(cluster, ns, wanted["acks-tls"], ca, replace=True)
    assert wait_for(
        lambda: every_pod_serves(cluster, ns, renewed.cert, ca.cert), "the pod serving the renewed leaf", 240
    )
    load.append(
        run_workload(
            cluster, ns, "produce", "--coordinators", dns(ns, "txn"), "--stores", dns(ns, "acks"),
            "--topics", TOPICS, "--txns", "4", "--seconds", "10", "--tag", "after", timeout=300,
            tls_secret="acks-tls",
        )
    )  # fmt: skip
    for result in load:
        assert not any(result.get("uncertain", {}).values()), (
            f"a transaction failed: {json.dumps(result)[:500]}"
        )
    assert pods_of(cluster, ns) == pods, "a pod restarted or was replaced when its certificate was renewed"
    verify(cluster, ns, load, TOPICS, tls_secret="acks-tls")
