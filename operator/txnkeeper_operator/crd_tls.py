"""The CRD's ``spec.tls`` and ``status.tls`` (crdgen.py puts them into both kinds).

Its own module because the certificate lifetimes are checked here by CEL with the same words as
tlsspec.py uses at reconcile (objects admitted before a rule existed still get refused there).
"""

from __future__ import annotations

from typing import Any

from txnkeeper.contract.tls import CLIENT_AUTH
from txnkeeper_operator import tlsspec

Schema = dict[str, Any]


def _p(type_: str, description: str, **extra: Any) -> Schema:
    return {"type": type_, "description": description, **extra}


def _duration(description: str, default: str) -> Schema:
    return _p(
        "string",
        f"{description} Go duration: hours, minutes, seconds (e.g. {default}, 90m, 1h30m).",
        default=default,
        maxLength=32,
        pattern=tlsspec.DURATION_PATTERN,
    )


def _shorter(short: str, long: str, short_default: str, long_default: str, message: str) -> dict[str, Any]:
    """CEL: ``short`` < ``long`` (both optional with defaults) as durations."""
    left = f"duration(has(self.{short}) ? self.{short} : '{short_default}')"
    right = f"duration(has(self.{long}) ? self.{long} : '{long_default}')"
    return {"rule": f"{left} < {right}", "message": message}


def spec_schema() -> Schema:
    ca = {
        "type": "object",
        "description": (
            "The operator's own CA of the namespace (Secret txnkeeper-ca); ignored with certManager."
        ),
        "properties": {
            "validity": _duration("Lifetime of a new CA.", tlsspec.DEFAULT_CA_VALIDITY),
            "renewBefore": _duration(
                "A new CA is made this long before the current one expires.", tlsspec.DEFAULT_CA_RENEW_BEFORE
            ),
            "overlap": _duration(
                "The old and the new CA are both trusted at least this long during a rotation.",
                tlsspec.DEFAULT_CA_OVERLAP,
            ),
        },
        "x-kubernetes-validations": [
            _shorter(
                "renewBefore",
                "validity",
                tlsspec.DEFAULT_CA_RENEW_BEFORE,
                tlsspec.DEFAULT_CA_VALIDITY,
                "spec.tls.ca.renewBefore must be shorter than spec.tls.ca.validity: a CA would be replaced "
                "as soon as it is made",
            ),
            _shorter(
                "overlap",
                "renewBefore",
                tlsspec.DEFAULT_CA_OVERLAP,
                tlsspec.DEFAULT_CA_RENEW_BEFORE,
                "spec.tls.ca.overlap must be shorter than spec.tls.ca.renewBefore: the old CA must still "
                "be valid for the whole overlap",
            ),
        ],
    }
    issuer = {
        "type": "object",
        "description": "The cert-manager issuer that signs the Certificates.",
        "required": ["name"],
        "properties": {
            "name": _p("string", "Name of the Issuer or ClusterIssuer.", minLength=1, maxLength=253),
            "kind": _p(
                "string",
                "Issuer (same namespace) or ClusterIssuer.",
                default="Issuer",
                enum=list(tlsspec.ISSUER_KINDS),
            ),
            "group": _p(
                "string",
                "API group of the issuer.",
                default=tlsspec.DEFAULT_ISSUER_GROUP,
                minLength=1,
                maxLength=253,
            ),
        },
    }
    return {
        "type": "object",
        "description": (
            "TLS of every listener of the pods (client protocol: pulsar+ssl:// and txnkeeper's own; admin "
            "API and /metrics: https://; pod to pod: mutual TLS) and of the operator's and verifier jobs' "
            "calls to them. The pods mount Secret {name}-tls (tls.crt, tls.key, ca.crt) at "
            f"{tlsspec.TLS_DIR} and re-read it while running. Switching TLS on or off changes the pod "
            "template: the operator restarts the pods one at a time (as a version roll, inside "
            "maintenanceWindows); clients then use pulsar+ssl:// and https:// (or pulsar:// and http://)."
        ),
        "properties": {
            "enabled": _p(
                "boolean",
                "TLS on or off; absent: the operator's default (Helm value tls.enabled, default true).",
            ),
            "clientAuth": _p(
                "string",
                "Client protocol port: none (no client certificate asked), request (verified if sent) or "
                "require (a client without a certificate of the CA is refused at the handshake). The admin "
                "port always requests one; pod-to-pod connections always present one.",
                default="none",
                enum=list(CLIENT_AUTH),
            ),
            "renewBefore": _duration(
                "Leaf certificates are renewed this long before they expire.", tlsspec.DEFAULT_RENEW_BEFORE
            ),
            "certificateValidity": _duration(
                "Lifetime of a leaf certificate.", tlsspec.DEFAULT_CERTIFICATE_VALIDITY
            ),
            "ca": ca,
            "certManager": {
                "type": "object",
                "description": "Use cert-manager Certificates instead of the operator's own CA.",
                "required": ["issuerRef"],
                "properties": {"issuerRef": issuer},
            },
        },
        "x-kubernetes-validations": [
            _shorter(
                "renewBefore",
                "certificateValidity",
                tlsspec.DEFAULT_RENEW_BEFORE,
                tlsspec.DEFAULT_CERTIFICATE_VALIDITY,
                "spec.tls.renewBefore must be shorter than spec.tls.certificateValidity: a certificate "
                "would be renewed as soon as it is issued",
            ),
        ],
    }


def status_schema() -> Schema:
    time = {"type": "string", "format": "date-time"}
    return {
        "type": "object",
        "description": "The resource's certificates as the operator last saw them.",
        "properties": {
            "mode": _p(
                "string", "Who issues the certificates.", enum=["operator", "cert-manager", "disabled"]
            ),
            "caNotAfter": time | {"description": "When the current CA expires.", "nullable": True},
            "certificateNotAfter": time
            | {"description": "When the resource's certificate expires.", "nullable": True},
            "phase": _p(
                "string",
                "Ready, Pending (cert-manager has not issued yet), Refused (message says why), or the CA "
                "rotation's phase: trust-new, reissue, retire-old.",
            ),
            "message": _p("string", "What the operator does or waits for, in words."),
        },
    }
