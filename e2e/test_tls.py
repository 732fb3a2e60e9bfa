"""TLS on a real cluster (issue 28): the operator's own CA, a server-certificate renewal and a CA rotation
under transactional load, with zero failed transactions and zero pod restarts.

Why here: the pieces that decide whether a rotation keeps connections alive exist only in a cluster: the
kubelet refreshing a mounted Secret in place (about a sync period after the operator writes it), pods
re-reading their files while serving, the operator waiting on what every pod reports it serves before the
next step (never on time alone), and clients in other pods that mounted the bundle. The load runs as
Jobs that mount the store's TLS Secret and connect with mutual TLS, as an application in the namespace
would; each Job is short, so a new one starts with the bundle of the moment (clients outside the cluster
must take the new CA during the overlap the same way).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from e2e.helpers import Cluster, wait_for
from e2e.test_operator import PAS, TC, apply, get_cr, run_workload, wait_cr
from e2e.test_operator import operator as operator  # noqa: PLC0414 (the module's fixture, shared)
from e2e.test_scaling import Load, balanced_at, dns, verify
from txnkeeper.contract import pki

Obj = dict[str, Any]
CA_SECRET = "txnkeeper-ca"
RESOURCES = (("txn", TC), ("acks", PAS))
TOPICS = "persistent://public/default/tls-a,persistent://public/default/tls-b"
# Short overlap: the test waits for it once (a user's default is 1h).
MANIFESTS = """
apiVersion: txnkeeper.io/v1
kind: TransactionCoordinator
metadata: {name: txn}
spec:
  version: "2.0.0"
  replicas: 1
  coordinators: 2
  storage: {size: 64Mi}
  tls: {enabled: true, clientAuth: require, ca: {overlap: 20s}}
---
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {name: acks}
spec:
  version: "2.0.0"
  replicas: 2
  shards: 4
  storage: {size: 64Mi}
  tls: {enabled: true, clientAuth: require, ca: {overlap: 20s}}
"""


def secret_data(cluster: Cluster, ns: str, name: str) -> dict[str, bytes]:
    secret = cluster.core.read_namespaced_secret(name, ns)
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def served(cluster: Cluster, ns: str, pod: str, material: dict[str, bytes]) -> x509.Certificate:
    """The certificate a pod's admin port presents to a new connection, verified against ``material``'s
    bundle and for the pod's DNS name (the handshake fails otherwise: that is part of the check)."""
    resource = pod.rsplit("-", 1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for key in ("ca.crt", "tls.crt", "tls.key"):
            paths[key] = Path(tmp) / key
            paths[key].write_bytes(material[key])
        context = ssl.create_default_context(cafile=str(paths["ca.crt"]))
        context.load_cert_chain(str(paths["tls.crt"]), str(paths["tls.key"]))
        with cluster.endpoint(ns, pod, 8080) as ep:
            host, port = ep.rsplit(":", 1)
            with (
                socket.create_connection((host, int(port)), timeout=10) as raw,
                context.wrap_socket(raw, server_hostname=f"{pod}.{resource}.{ns}.svc") as tls,
            ):
                der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def pods_of(cluster: Cluster, ns: str) -> dict[str, tuple[str, int]]:
    """Every txnkeeper pod of the namespace: its uid and container restarts (a restart changes either)."""
    out: dict[str, tuple[str, int]] = {}
    selector = "app.kubernetes.io/instance in (txn,acks)"
    for pod in cluster.core.list_namespaced_pod(ns, label_selector=selector).items:
        assert pod.metadata is not None and pod.status is not None
        if pod.metadata.labels and pod.metadata.labels.get("job-name"):
            continue
        restarts = sum(c.restart_count for c in pod.status.container_statuses or [])
        out[str(pod.metadata.name)] = (str(pod.metadata.uid), restarts)
    return out


def every_pod_serves(
    cluster: Cluster, ns: str, want: x509.Certificate | None, issuer: x509.Certificate
) -> bool:
    """Every pod presents ``want`` (or, with None, any leaf) signed by ``issuer`` to a new connection."""
    material = secret_data(cluster, ns, "acks-tls")
    for name in pods_of(cluster, ns):
        try:
            cert = served(cluster, ns, name, material)
        except (OSError, ssl.SSLError):
            return False
        if not pki.signed_by(cert, issuer):
            return False
        resource = name.rsplit("-", 1)[0]
        expected = want if want is not None and resource == "acks" else None
        if expected is not None and pki.fingerprint(cert) != pki.fingerprint(expected):
            return False
    return True


@pytest.fixture
def resources(cluster: Cluster, operator: str, namespace: str) -> Iterator[str]:
    apply(cluster, namespace, MANIFESTS)
    for name, plural in RESOURCES:
        replicas = 1 if name == "txn" else 2
        wait_cr(cluster, namespace, plural, name, balanced_at(replicas), f"Ready on {replicas} pods", 420)
    run_workload(
        cluster, namespace, "subscribe", "--stores", dns(namespace, "acks"), "--topics", TOPICS,
        "--subscription", "audit", tls_secret="acks-tls",
    )  # fmt: skip
    yield namespace


class TlsLoad(Load):
    """The scaling test's load, connecting with the store's TLS Secret mounted (mutual TLS)."""

    def _job(self, n: int) -> Obj:
        return run_workload(
            self.cluster, self.ns, "produce", "--coordinators", dns(self.ns, "txn"),
            "--stores", dns(self.ns, "acks"), "--topics", TOPICS, "--txns", "4", "--seconds", "20",
            "--tag", f"l{n}", timeout=420, tls_secret="acks-tls",
        )  # fmt: skip


@pytest.mark.timeout(1500)
def test_certificate_renewal_and_ca_rotation_under_load_fail_nothing_and_restart_nothing(
    cluster: Cluster, resources: str
) -> None:
    ns = resources
    ca_before = pki.load_bundle(secret_data(cluster, ns, CA_SECRET)["ca.crt"], what=CA_SECRET)[0]
    leaf_before = pki.load_bundle(secret_data(cluster, ns, "acks-tls")["tls.crt"], what="acks-tls")[0]
    assert wait_for(
        lambda: every_pod_serves(cluster, ns, leaf_before, ca_before), "pods serve the CA's leaf", 120
    )
    pods = pods_of(cluster, ns)
    assert len(pods) == 3, pods

    with TlsLoad(cluster, ns) as load:
        wait_for(lambda: load.results or load.errors, "the first load job", 300)

        # 1. The server certificate, renewed on request: same CA, a new leaf, served without a restart.
        cluster.kubectl("-n", ns, "annotate", "--overwrite", "secret", "acks-tls", "txnkeeper.io/renew=now")
        leaf = wait_for(
            lambda: (
                c
                if pki.fingerprint(
                    c := pki.load_bundle(secret_data(cluster, ns, "acks-tls")["tls.crt"], what="acks-tls")[0]
                )
                != pki.fingerprint(leaf_before)
                else None
            ),
            "a renewed acks-tls",
            120,
        )
        wait_for(
            lambda: every_pod_serves(cluster, ns, leaf, ca_before), "every pod serving the renewed leaf", 240
        )

        # 2. The CA, rotated: trust new+old, leaves from the new CA, then the old CA retired.
        cluster.kubectl(
            "-n", ns, "annotate", "--overwrite", "secret", CA_SECRET, "txnkeeper.io/rotate-ca=now"
        )

        def new_ca() -> x509.Certificate | None:
            cert = pki.load_bundle(secret_data(cluster, ns, CA_SECRET)["ca.crt"], what=CA_SECRET)[0]
            return cert if pki.fingerprint(cert) != pki.fingerprint(ca_before) else None

        ca_after = wait_for(new_ca, "a new CA in txnkeeper-ca", 120)
        wait_for(
            lambda: every_pod_serves(cluster, ns, None, ca_after), "every pod serving a new-CA leaf", 420
        )

        def retired() -> bool:
            data = secret_data(cluster, ns, CA_SECRET)
            if "ca-previous.crt" in data:
                return False
            for name, _plural in RESOURCES:
                bundle = pki.load_bundle(secret_data(cluster, ns, f"{name}-tls")["ca.crt"], what=name)
                if [pki.fingerprint(c) for c in bundle] != [pki.fingerprint(ca_after)]:
                    return False
            return True

        wait_for(retired, "the old CA retired from every bundle", 420)
        # One more job after the retirement: new connections with the new CA alone.
        done = len(load.results)
        wait_for(
            lambda: len(load.results) >= done + 2 or load.errors, "two load jobs after the rotation", 300
        )
        results = load.stop()

    for result in results:
        assert not any(result.get("uncertain", {}).values()), (
            f"a transaction failed: {json.dumps(result)[:500]}"
        )
    assert pods_of(cluster, ns) == pods, "a pod restarted or was replaced during the rotations"
    for name, plural in RESOURCES:
        status = get_cr(cluster, ns, plural, name)["status"]
        assert status["tls"]["mode"] == "operator", status.get("tls")
    verify_tls(cluster, ns, results)


def verify_tls(cluster: Cluster, ns: str, results: list[Obj]) -> None:
    verify(cluster, ns, results, TOPICS, tls_secret="acks-tls")
