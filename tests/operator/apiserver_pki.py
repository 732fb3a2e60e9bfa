"""Certificates, service-account keys and an admin kubeconfig for a throwaway kube-apiserver.

Why: tests/operator/test_op_apiserver.py runs the operator against a real API server of its own (etcd
and kube-apiserver only, no nodes). The server needs a serving certificate, a client CA whose admin
certificate the test authenticates with, and a key pair to sign service-account tokens. openssl is on
every Debian machine, so this needs no extra Python dependency.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

APISERVER_SANS = "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"


def _openssl(pki: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)


def _sign(pki: Path, stem: str, subject: str, extensions: str) -> None:
    _openssl(pki, "genrsa", "-out", f"{stem}.key", "2048")
    _openssl(pki, "req", "-new", "-key", f"{stem}.key", "-subj", subject, "-out", f"{stem}.csr")
    (pki / f"{stem}.ext").write_text(extensions)
    _openssl(
        pki, "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-sha256", "-extfile", f"{stem}.ext", "-out", f"{stem}.crt",
    )  # fmt: skip


def generate(pki: Path) -> None:
    """ca.crt/key, apiserver.crt/key (serving), admin.crt/key (system:masters), sa.key/pub."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(pki, "genrsa", "-out", "ca.key", "2048")
    _openssl(
        pki, "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=txnkeeper-test-ca", "-days", "2",
        "-sha256", "-out", "ca.crt",
    )  # fmt: skip
    usage = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
    _sign(pki, "apiserver", "/CN=kube-apiserver", f"{usage}extendedKeyUsage=serverAuth\n"
          f"subjectAltName={APISERVER_SANS}\n")  # fmt: skip
    _sign(pki, "admin", "/CN=kubernetes-admin/O=system:masters", f"{usage}extendedKeyUsage=clientAuth\n")
    _openssl(pki, "genrsa", "-out", "sa.key", "2048")
    _openssl(pki, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def admin_kubeconfig(pki: Path, server: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the admin certificate of `generate`."""
    ca, crt, key = pki / "ca.crt", pki / "admin.crt", pki / "admin.key"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "admin@test", "context": {"cluster": "test", "user": "admin"}}],
        "current-context": "admin@test",
    }
    path.write_text(yaml.safe_dump(config))
    return path
