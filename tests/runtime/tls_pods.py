"""TLS material laid out as a mounted Secret, serve pods started with it, and probes of what a TLS
listener serves (the peer certificate's serial, an https admin call)."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from runtime_pods import READY_TIMEOUT, ServePod
from tls_certs import Issued, issue, make_ca, replace_atomically, write_bundle

from txnkeeper.contract.tls import TlsClientSettings


@dataclass
class TlsFiles:
    """The pod's files (tls.crt, tls.key, ca.crt) and a client certificate of the same CA."""

    directory: Path
    ca: Issued
    server: Issued
    client: Issued

    @classmethod
    def create(cls, directory: Path) -> TlsFiles:
        ca = make_ca()
        files = cls(directory, ca, issue(ca, "pod"), issue(ca, "client"))
        directory.mkdir(parents=True, exist_ok=True)
        files.serve_pair(files.server)
        write_bundle(files.ca_file, ca)
        files.client.write(directory, "client")
        return files

    @property
    def cert_file(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.directory / "tls.key"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    def serve_pair(self, issued: Issued) -> None:
        replace_atomically(self.key_file, issued.key_pem)
        replace_atomically(self.cert_file, issued.cert_pem)
        self.server = issued

    def client_settings(self, *, with_cert: bool = True) -> TlsClientSettings:
        if not with_cert:
            return TlsClientSettings(str(self.ca_file))
        return TlsClientSettings(
            str(self.ca_file), str(self.directory / "client.crt"), str(self.directory / "client.key")
        )

    def flags(self, *extra: str) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert_file),
            "--tls-key-file",
            str(self.key_file),
            "--tls-ca-file",
            str(self.ca_file),
            *extra,
        ]


def start_tls_pod(pod: ServePod, settings: TlsClientSettings) -> ServePod:
    """Start ``pod`` and wait until its admin API answers /ready over https."""
    pod.start(wait=False)
    context = settings.context()
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        assert pod.process is not None
        if pod.process.poll() is not None:
            raise RuntimeError(f"pod {pod.name} exited with {pod.process.returncode}:\n{pod.log()}")
        if pod.ports_file.exists():
            ports = json.loads(pod.ports_file.read_text())
            pod.listen, pod.admin = ports["listen"], ports["admin"]
            try:
                with urllib.request.urlopen(f"https://{pod.admin}/ready", timeout=2, context=context) as r:
                    if r.status == 200:
                        return pod
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.05)
    raise TimeoutError(f"pod {pod.name} not ready over https within {READY_TIMEOUT}s:\n{pod.log()}")


def served_serial(address: str, settings: TlsClientSettings) -> int:
    """The serial of the certificate a new TLS connection to ``address`` is served."""
    host, port = address.rsplit(":", 1)
    context = settings.context()
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return int(str(cert["serialNumber"]), 16)


def https_metrics(pod: ServePod, settings: TlsClientSettings) -> str:
    context: ssl.SSLContext = settings.context()
    with urllib.request.urlopen(f"https://{pod.admin}/metrics", timeout=10, context=context) as response:
        return str(response.read().decode())
