"""Certificates, service-account keys and kubeconfigs for the local control plane.

Why openssl: it is on every Debian machine, so the control plane needs no extra Python dependency.
Each component gets its own client certificate with the identity a real cluster gives it
(system:kube-controller-manager, system:node:<node>, ...), so RBAC and the Node authorizer apply
exactly as they would on a real cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .config import NODE_NAME, Layout

# (file stem, common name, organisation): the identities the components authenticate as.
CLIENTS: list[tuple[str, str, str | None]] = [
    ("admin", "kubernetes-admin", "system:masters"),
    ("kube-controller-manager", "system:kube-controller-manager", None),
    ("kube-scheduler", "system:kube-scheduler", None),
    ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    ("provisioner", "system:txnkeeper:local-path-provisioner", None),
]

APISERVER_SANS = [
    "IP:127.0.0.1",
    "IP:10.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _sign(pki: Path, stem: str, subject: str, extensions: str) -> None:
    _openssl("genrsa", "-out", f"{stem}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{stem}.key", "-subj", subject, "-out", f"{stem}.csr", cwd=pki)
    (pki / f"{stem}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "365", "-sha256", "-extfile", f"{stem}.ext", "-out", f"{stem}.crt", cwd=pki,
    )  # fmt: skip
    (pki / f"{stem}.csr").unlink()
    (pki / f"{stem}.ext").unlink()


def generate(layout: Layout) -> None:
    """Create the CA, serving and client certificates and the service-account key pair (idempotent)."""
    pki = layout.pki
    if (pki / "done").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=txnkeeper-e2e-ca", "-days", "365",
        "-sha256", "-out", "ca.crt", cwd=pki,
    )  # fmt: skip
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(APISERVER_SANS)}\n",
    )
    for stem, cn, org in CLIENTS:
        subject = f"/CN={cn}" + (f"/O={org}" if org else "")
        _sign(
            pki,
            stem,
            subject,
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n",
        )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "done").write_text("")


def write_kubeconfigs(layout: Layout, server: str) -> None:
    """One kubeconfig per identity; `kubeconfig` at the state root is the admin one (tests, operator)."""
    pki = layout.pki
    for stem, _cn, _org in CLIENTS:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}
            ],
            "users": [
                {
                    "name": stem,
                    "user": {
                        "client-certificate": str(pki / f"{stem}.crt"),
                        "client-key": str(pki / f"{stem}.key"),
                    },
                }
            ],
            "contexts": [{"name": f"{stem}@local", "context": {"cluster": "local", "user": stem}}],
            "current-context": f"{stem}@local",
        }
        path = layout.kubeconfig(stem)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        if stem == "admin":
            # The admin kubeconfig names the context "txnkeeper-local" so it is recognisable in tools.
            config["contexts"] = [{"name": "txnkeeper-local", "context": {"cluster": "local", "user": stem}}]
            config["current-context"] = "txnkeeper-local"
            layout.admin_kubeconfig.write_text(yaml.safe_dump(config))
