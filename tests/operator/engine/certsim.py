"""A simulated namespace for the certificate engine: Secrets, pods that reload them, a clock.

Pods load their resource's ``<cr>-tls`` Secret at each tick (as the kubelet's refresh and the runtime's
5-second re-read do), unless stuck. After every Secret write and every tick the invariant is checked:
every pod trusts the CA of every certificate it can be shown (every other pod's, the operator's client
certificate) and no served certificate has expired; a rotation that breaks a handshake fails the test.
Certificates and keys are real (txnkeeper.contract.pki); outputs name them by labels in order of first
appearance (CA1, cert1, ...) since their fingerprints are random.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509

from txnkeeper.contract import pki
from txnkeeper_operator.engine import certs
from txnkeeper_operator.engine.certs import CertAction, CertInput, CertPlan, PeerCa, PodTls, SecretData

T0 = datetime(2026, 1, 3, 22, 0, tzinfo=UTC)
NAMESPACE = "ns"


class InvariantViolation(AssertionError):
    pass


@dataclass
class SimPod:
    name: str
    stuck: bool = False
    cert: x509.Certificate | None = None
    trusted: list[x509.Certificate] = field(default_factory=list)


@dataclass
class SimResource:
    name: str
    pods: list[SimPod]


class SimNamespace:
    def __init__(self) -> None:
        self.now = T0
        self.spec = certs.TlsSpec()
        self.secrets: dict[str, SecretData] = {}
        self.resources: dict[str, SimResource] = {}
        self.labels: dict[str, str] = {}  # fingerprint -> CA1 / cert1
        self.cas: list[x509.Certificate] = []  # every CA ever written (to name a pod's issuer)
        self.counts = {"CA": 0, "cert": 0}
        # False once the clock jumped with the operator away: an expired certificate is then no fault
        # of the engine's (trust is still checked).
        self.check_expiry = True

    # --- naming ------------------------------------------------------------------------------------

    def _register(self, pem: bytes) -> None:
        for cert in pki.load_bundle(pem, what="sim"):
            fp = pki.fingerprint(cert)
            if fp in self.labels:
                continue
            ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
            kind = "CA" if ca else "cert"
            self.counts[kind] += 1
            self.labels[fp] = f"{kind}{self.counts[kind]}"
            if ca:
                self.cas.append(cert)

    def label(self, fp: str | None) -> str:
        return self.labels.get(fp or "", "none")

    def readable(self, text: str) -> str:
        """Fingerprints (12 hex digits) replaced by their labels."""
        by_short = {fp[:12]: name for fp, name in self.labels.items()}
        return re.sub(r"\b[0-9a-f]{12}\b", lambda m: by_short.get(m.group(0), "unknown"), text)

    # --- the world ---------------------------------------------------------------------------------

    def add(self, name: str, pods: int) -> None:
        self.resources[name] = SimResource(name, [SimPod(f"{name}-{i}") for i in range(pods)])

    def pod(self, name: str) -> SimPod:
        for res in self.resources.values():
            for pod in res.pods:
                if pod.name == name:
                    return pod
        raise ValueError(f"no pod {name!r}")

    def tick(self) -> None:
        for res in self.resources.values():
            secret = self.secrets.get(f"{res.name}-tls")
            for pod in res.pods:
                if pod.stuck or secret is None:
                    continue
                try:
                    pod.cert = pki.load_issued(
                        secret.data[certs.TLS_CERT], secret.data[certs.TLS_KEY], what="pod"
                    ).cert
                    pod.trusted = pki.load_bundle(secret.data[certs.CA_CERT], what="pod")
                except (KeyError, pki.PkiError):
                    continue  # the runtime keeps what it serves when the new files are unusable
        self.check()

    def _issuer(self, cert: x509.Certificate) -> str | None:
        return next((pki.fingerprint(ca) for ca in self.cas if pki.signed_by(cert, ca)), None)

    def report(self, pod: SimPod) -> PodTls:
        if pod.cert is None:
            return PodTls(pod.name, enabled=False)
        return PodTls(
            pod.name,
            enabled=True,
            fingerprint=pki.fingerprint(pod.cert),
            issuer=self._issuer(pod.cert),
            trusted=frozenset(pki.fingerprint(c) for c in pod.trusted),
        )

    def check(self) -> None:
        loaded = [p for r in self.resources.values() for p in r.pods if p.cert is not None]
        shown: list[tuple[str, x509.Certificate]] = [(p.name, p.cert) for p in loaded if p.cert]
        client = self.secrets.get(certs.CLIENT_SECRET)
        client_trust: list[x509.Certificate] = []
        if client is not None and certs.TLS_CERT in client.data:
            shown.append(("the operator", pki.load_bundle(client.data[certs.TLS_CERT], what="c")[0]))
            client_trust = pki.load_bundle(client.data[certs.CA_CERT], what="c")
        for who, cert in shown:
            if self.check_expiry and cert.not_valid_after_utc <= self.now:
                raise InvariantViolation(f"{who} serves {self.label(pki.fingerprint(cert))}, expired")
            for pod in loaded:
                if pod.name != who and not any(pki.signed_by(cert, ca) for ca in pod.trusted):
                    raise InvariantViolation(
                        f"pod {pod.name} does not trust {who}'s {self.label(pki.fingerprint(cert))}"
                    )
        for pod in loaded:
            assert pod.cert is not None
            if client_trust and not any(pki.signed_by(pod.cert, ca) for ca in client_trust):
                raise InvariantViolation(f"the operator does not trust pod {pod.name}'s certificate")

    # --- the operator ------------------------------------------------------------------------------

    def phase(self) -> str:
        ca = self.secrets.get(certs.CA_SECRET)
        return (ca.annotations.get(certs.PHASE_ANNOTATION, "") if ca else "") or "idle"

    def _peer(self, name: str) -> PeerCa:
        secret = self.secrets.get(f"{name}-tls")
        notes = secret.annotations if secret else {}
        return PeerCa(
            f"PendingAckStore/{name}",
            notes.get(certs.TRUSTED_ANNOTATION),
            notes.get(certs.SERVED_ANNOTATION),
            certs.bundle_fingerprints(secret.data.get(certs.CA_CERT, b"")) if secret else frozenset(),
        )

    def plan(self, name: str) -> CertPlan:
        """As certificates.py asks: the pods and the other resources only once a rotation is under way."""
        res = self.resources[name]
        rotating = self.phase() != "idle"
        return certs.plan(
            CertInput(
                namespace=NAMESPACE,
                resource=name,
                label=f"PendingAckStore/{name}",
                hosts=certs.resource_hosts(name, NAMESPACE),
                spec=self.spec,
                ca=self.secrets.get(certs.CA_SECRET),
                leaf=self.secrets.get(f"{name}-tls"),
                client=self.secrets.get(certs.CLIENT_SECRET),
                pods=tuple(self.report(p) for p in res.pods) if rotating else (),
                peers=tuple(self._peer(o) for o in sorted(self.resources) if o != name) if rotating else (),
                now=self.now,
            )
        )

    def apply(self, action: CertAction) -> None:
        before = self.secrets.get(action.secret)
        data = dict(before.data) if before else {}
        notes = dict(before.annotations) if before else {}
        for key, value in action.data.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
                if key not in (certs.TLS_KEY, certs.CA_KEY, certs.CA_PREVIOUS_KEY):
                    self._register(value)
        for key, note in action.annotations.items():
            if note is None:
                notes.pop(key, None)
            else:
                notes[key] = note
        owned = before.owned if before else True
        self.secrets[action.secret] = SecretData(action.secret, data, notes, owned)
        self.check()
