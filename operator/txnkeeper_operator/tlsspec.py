"""``spec.tls`` as the operator reads it: whether TLS is on, and the certificate lifetimes, checked.

One module so that the pod template (mounts, env, probes), the operator's own calls to pods (https or
http) and the certificate engine ask the same question the same way: ``spec.tls.enabled``, else the
operator's default (chart value ``tls.enabled``, env TXNKEEPER_OPERATOR_TLS_DEFAULT). The CRD refuses
malformed durations and a renewBefore not below its validity at admission; objects admitted before
that rule (or edited past it) are refused here too, with the same words. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from txnkeeper.contract.tls import CLIENT_AUTH

# Go's time.ParseDuration without fractions or units below a second (certificate lifetimes):
# 720h, 90m, 1h30m, 45s. The CRD uses the same pattern.
DURATION_PATTERN = r"^([0-9]+(h|m|s))+$"
_PART = re.compile(r"([0-9]+)(h|m|s)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}

DEFAULT_RENEW_BEFORE = "720h"
DEFAULT_CERTIFICATE_VALIDITY = "2160h"
DEFAULT_CA_VALIDITY = "8760h"
DEFAULT_CA_RENEW_BEFORE = "720h"
DEFAULT_CA_OVERLAP = "1h"
ISSUER_KINDS = ("Issuer", "ClusterIssuer")
DEFAULT_ISSUER_GROUP = "cert-manager.io"

# Where the pods (and the verifier jobs) find the resource's Secret <cr>-tls.
TLS_DIR = "/etc/txnkeeper/tls"
CERT_FILE = f"{TLS_DIR}/tls.crt"
KEY_FILE = f"{TLS_DIR}/tls.key"
CA_FILE = f"{TLS_DIR}/ca.crt"
VOLUME = "tls"
# The operator's client certificate, one per namespace (read through the API, never mounted).
OPERATOR_CLIENT_SECRET = "txnkeeper-operator-client-tls"


class TlsSpecError(ValueError):
    """spec.tls holds something the operator cannot use (the message names the field and the fix)."""


def parse_duration(text: str, field: str) -> timedelta:
    """``720h``, ``1h30m``, ``45s`` -> timedelta; anything else is refused naming ``field``."""
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise TlsSpecError(
            f"{field} must be a duration such as 720h, 90m, 1h30m or 45s (hours, minutes, seconds), "
            f"got {text!r}"
        )
    seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))
    if seconds <= 0:
        raise TlsSpecError(f"{field} must be longer than zero, got {text!r}")
    return timedelta(seconds=seconds)


def secret_name(cr_name: str) -> str:
    """The resource's certificate Secret (type kubernetes.io/tls: tls.crt, tls.key, ca.crt)."""
    return f"{cr_name}-tls"


def server_hostname(pod: str, cr_name: str, namespace: str) -> str:
    """The name a pod's certificate is checked against when the pod is reached by its IP: its DNS
    name behind the headless Service, which the wildcard ``*.<cr>.<ns>.svc`` of ``<cr>-tls`` covers
    (and no other resource's certificate does)."""
    return f"{pod}.{cr_name}.{namespace}.svc"


@dataclass(frozen=True, slots=True)
class IssuerRef:
    name: str
    kind: str = "Issuer"
    group: str = DEFAULT_ISSUER_GROUP


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """spec.tls with its defaults applied and its durations parsed (``TlsSpec.of`` checks them)."""

    enabled: bool
    client_auth: str = "none"
    renew_before: timedelta = timedelta(hours=720)
    certificate_validity: timedelta = timedelta(hours=2160)
    ca_validity: timedelta = timedelta(hours=8760)
    ca_renew_before: timedelta = timedelta(hours=720)
    ca_overlap: timedelta = timedelta(hours=1)
    issuer: IssuerRef | None = None  # cert-manager mode

    @property
    def mode(self) -> str:
        return "cert-manager" if self.issuer is not None else "operator"

    @classmethod
    def of(cls, spec: Mapping[str, Any], default_enabled: bool) -> TlsSpec:
        """Read ``spec`` (a resource's spec); raises TlsSpecError naming what is wrong."""
        raw = spec.get("tls") or {}
        if not isinstance(raw, Mapping):
            raise TlsSpecError(f"spec.tls must be an object, got {raw!r}")
        enabled = raw.get("enabled", default_enabled)
        if not isinstance(enabled, bool):
            raise TlsSpecError(f"spec.tls.enabled must be true or false, got {enabled!r}")
        client_auth = str(raw.get("clientAuth", "none"))
        if client_auth not in CLIENT_AUTH:
            raise TlsSpecError(
                f"spec.tls.clientAuth must be one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}"
            )
        ca = raw.get("ca") or {}
        renew = parse_duration(raw.get("renewBefore", DEFAULT_RENEW_BEFORE), "spec.tls.renewBefore")
        validity = parse_duration(
            raw.get("certificateValidity", DEFAULT_CERTIFICATE_VALIDITY), "spec.tls.certificateValidity"
        )
        ca_validity = parse_duration(ca.get("validity", DEFAULT_CA_VALIDITY), "spec.tls.ca.validity")
        ca_renew = parse_duration(ca.get("renewBefore", DEFAULT_CA_RENEW_BEFORE), "spec.tls.ca.renewBefore")
        overlap = parse_duration(ca.get("overlap", DEFAULT_CA_OVERLAP), "spec.tls.ca.overlap")
        if renew >= validity:
            raise TlsSpecError(
                f"spec.tls.renewBefore ({raw.get('renewBefore', DEFAULT_RENEW_BEFORE)}) must be shorter "
                "than spec.tls.certificateValidity "
                f"({raw.get('certificateValidity', DEFAULT_CERTIFICATE_VALIDITY)}): a certificate would be "
                "renewed as soon as it is issued"
            )
        if ca_renew >= ca_validity:
            raise TlsSpecError(
                "spec.tls.ca.renewBefore must be shorter than spec.tls.ca.validity: a CA would be replaced "
                "as soon as it is made"
            )
        if overlap >= ca_renew:
            raise TlsSpecError(
                "spec.tls.ca.overlap must be shorter than spec.tls.ca.renewBefore: the old CA must still "
                "be valid for the whole overlap"
            )
        if validity > ca_validity:
            raise TlsSpecError(
                "spec.tls.certificateValidity must not be longer than spec.tls.ca.validity (a certificate "
                "never outlives the CA that signs it)"
            )
        return cls(enabled, client_auth, renew, validity, ca_validity, ca_renew, overlap, _issuer(raw))


def _issuer(raw: Mapping[str, Any]) -> IssuerRef | None:
    manager = raw.get("certManager") or {}
    ref = manager.get("issuerRef") if isinstance(manager, Mapping) else None
    if not ref:
        return None
    if not isinstance(ref, Mapping) or not ref.get("name"):
        raise TlsSpecError("spec.tls.certManager.issuerRef needs a name (the cert-manager Issuer to use)")
    kind = str(ref.get("kind") or "Issuer")
    if kind not in ISSUER_KINDS:
        raise TlsSpecError(
            f"spec.tls.certManager.issuerRef.kind must be Issuer or ClusterIssuer, got {kind!r}"
        )
    return IssuerRef(str(ref["name"]), kind, str(ref.get("group") or DEFAULT_ISSUER_GROUP))


def enabled(spec: Mapping[str, Any], default_enabled: bool) -> bool:
    """Whether the resource's pods serve TLS. Only ``enabled`` is read, so a resource whose lifetimes
    are refused keeps the transport it has (its pods are not switched to plaintext by a typo)."""
    raw = spec.get("tls") or {}
    value = raw.get("enabled") if isinstance(raw, Mapping) else None
    return value if isinstance(value, bool) else default_enabled


def client_auth(spec: Mapping[str, Any]) -> str:
    raw = spec.get("tls") or {}
    value = str(raw.get("clientAuth", "none")) if isinstance(raw, Mapping) else "none"
    return value if value in CLIENT_AUTH else "none"


def problems(section: Any) -> list[str]:
    """What is wrong with a spec.tls section (empty: nothing), for the SettingsValid condition."""
    try:
        TlsSpec.of({"tls": section}, True)
    except TlsSpecError as err:
        return [str(err)]
    return []
