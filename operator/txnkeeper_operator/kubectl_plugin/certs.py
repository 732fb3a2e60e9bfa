"""``certs``: when the certificates in txnkeeper's TLS Secrets expire.

Which Secrets: those matching the label selector (default ``app.kubernetes.io/name=txnkeeper``, the
label every object of the operator and chart carries; ``-l`` for others, e.g. Secrets cert-manager
issues with a ``secretTemplate`` label) that hold a ``tls.crt`` or ``ca.crt`` key, as Kubernetes TLS
Secrets and cert-manager's do. Every certificate of each PEM bundle is listed with its subject and
notAfter. It reads what the Secrets hold, whoever wrote them; it does not depend on the operator.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509

from txnkeeper_operator.kubectl_plugin.connect import REQUEST_TIMEOUT, Cluster
from txnkeeper_operator.kubectl_plugin.failures import call
from txnkeeper_operator.kubectl_plugin.reads import Obj
from txnkeeper_operator.kubectl_plugin.views import table

DEFAULT_SELECTOR = "app.kubernetes.io/name=txnkeeper"
CERT_KEYS = ("tls.crt", "ca.crt")
# The chart's certificate-expiry alert fires this long before notAfter (issue 28: within 14 days).
EXPIRING = timedelta(days=14)


@dataclass(frozen=True, slots=True)
class CertRow:
    secret: str
    key: str
    subject: str
    not_after: datetime | None
    problem: str | None = None  # why the key could not be read

    def state(self, now: datetime) -> str:
        if self.problem is not None or self.not_after is None:
            return "UNREADABLE"
        if self.not_after <= now:
            return "EXPIRED"
        return "EXPIRING" if self.not_after - now <= EXPIRING else "OK"


def rows_of(secret: Obj) -> list[CertRow]:
    """One row per certificate in the Secret's certificate keys (none: not a TLS Secret)."""
    name = str(secret["metadata"]["name"])
    rows: list[CertRow] = []
    for key in CERT_KEYS:
        raw = (secret.get("data") or {}).get(key)
        if raw is None:
            continue
        try:
            certs = x509.load_pem_x509_certificates(base64.b64decode(raw, validate=True))
        except (ValueError, binascii.Error) as err:
            rows.append(CertRow(name, key, "-", None, f"not a PEM certificate: {err}"))
            continue
        rows.extend(
            CertRow(name, key, cert.subject.rfc4514_string() or "-", cert.not_valid_after_utc)
            for cert in certs
        )
    return rows


def list_rows(cluster: Cluster, selector: str) -> list[CertRow]:
    listed = call(
        cluster.core.list_namespaced_secret,
        cluster.namespace,
        label_selector=selector,
        verb="list", resource="secrets", namespace=cluster.namespace, server=cluster.server,
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    secrets = sorted(
        (cluster.api.sanitize_for_serialization(s) for s in listed.items or []),
        key=lambda s: str(s["metadata"]["name"]),
    )
    return [row for secret in secrets for row in rows_of(secret)]


def any_unusable(rows: list[CertRow], now: datetime | None = None) -> bool:
    moment = now or datetime.now(UTC)
    return any(r.state(moment) in ("EXPIRED", "UNREADABLE") for r in rows)


def _left(not_after: datetime | None, now: datetime) -> str:
    if not_after is None:
        return "-"
    seconds = (not_after - now).total_seconds()
    days, hours = int(abs(seconds) // 86400), int(abs(seconds) % 86400 // 3600)
    span = f"{days}d{hours}h"
    return span if seconds > 0 else f"-{span}"


def certs_text(rows: list[CertRow], namespace: str, selector: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    if not rows:
        return (
            f"No Secrets with tls.crt or ca.crt matching {selector!r} in namespace {namespace!r}"
            " (pick others with -l)"
        )
    body = [
        [
            r.secret,
            r.key,
            r.subject,
            r.not_after.strftime("%Y-%m-%dT%H:%M:%SZ") if r.not_after else "-",
            _left(r.not_after, now),
            r.state(now) + (f": {r.problem}" if r.problem else ""),
        ]
        for r in rows
    ]
    return "\n".join(table(["SECRET", "KEY", "SUBJECT", "NOT AFTER", "EXPIRES IN", "STATE"], body))
