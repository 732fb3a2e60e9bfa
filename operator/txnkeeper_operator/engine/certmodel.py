"""The certificate engine's vocabulary (engine/certs.py decides with it): the names of the Secrets and
annotations everyone agrees on, spec.tls's durations, what is read (Secrets, pods' TLS reports, the
other resources' progress) and what is decided (Secret writes, status.tls). Immutable values, no I/O,
no clock, like the rollout engine's model.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

CA_SECRET = "txnkeeper-ca"
CLIENT_SECRET = "txnkeeper-operator-client-tls"
CLIENT_COMMON_NAME = "txnkeeper-operator"
# On txnkeeper-ca: the rotation's state, and how a user asks for one.
ROTATE_ANNOTATION = "txnkeeper.io/rotate-ca"
# On a leaf Secret (<cr>-tls, the operator client's): re-issue it now (same CA); removed once done.
RENEW_ANNOTATION = "txnkeeper.io/renew"
PHASE_ANNOTATION = "txnkeeper.io/ca-rotation-phase"
STARTED_ANNOTATION = "txnkeeper.io/ca-rotation-started"
OVERLAP_ANNOTATION = "txnkeeper.io/ca-overlap-until"
REASON_ANNOTATION = "txnkeeper.io/ca-rotation-reason"
# On <cr>-tls: the CA (fingerprint) every pod of the resource was last seen to trust / serve a leaf of.
TRUSTED_ANNOTATION = "txnkeeper.io/ca-trusted-by-pods"
SERVED_ANNOTATION = "txnkeeper.io/ca-served-by-pods"
CA_CERT, CA_KEY, CA_PREVIOUS = "ca.crt", "ca.key", "ca-previous.crt"
# The old CA's key, kept only through the rotation's trust-new phase: a certificate issued then (a new
# resource, a renewal) comes from the old CA, which every pod still trusts.
CA_PREVIOUS_KEY = "ca-previous.key"
TLS_CERT, TLS_KEY = "tls.crt", "tls.key"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


class CertSpecError(ValueError):
    """spec.tls holds a value the operator cannot use (the message names the field)."""


class Phase(StrEnum):
    """The CA rotation's phase, as written in ``txnkeeper-ca``'s annotation (IDLE: none written)."""

    IDLE = ""
    TRUST_NEW = "trust-new"
    REISSUE = "reissue"
    RETIRE_OLD = "retire-old"


class Step(StrEnum):
    CREATE_CA = "create-ca"
    ISSUE = "issue"  # a leaf (or the operator's client certificate) issued or renewed, with a reason
    PUT_BUNDLE = "put-bundle"  # ca.crt of a leaf Secret: the CAs pods must trust now
    START_ROTATION = "start-rotation"
    ADVANCE = "advance"  # the rotation's next phase, written to txnkeeper-ca
    REISSUE = "reissue"  # a leaf re-issued from the new CA (phase reissue)
    RETIRE_OLD = "retire-old"  # the old CA dropped from txnkeeper-ca: the rotation is done
    MARK = "mark"  # the resource's progress (what its pods trust / serve) on its <cr>-tls Secret


def parse_duration(text: object, field_name: str) -> timedelta:
    """A Go-style duration (``720h``, ``90m``, ``1h30m``, ``45s``)."""
    raw = str(text).strip()
    parts = _DURATION.findall(raw)
    if not raw or "".join(n + u for n, u in parts) != raw:
        raise CertSpecError(
            f"{field_name}: {text!r} is not a duration: write hours, minutes and seconds like 720h, 90m,"
            " 1h30m or 45s"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """spec.tls's durations, with the defaults of docs/contracts.md."""

    renew_before: timedelta = timedelta(hours=720)
    validity: timedelta = timedelta(hours=2160)
    ca_validity: timedelta = timedelta(hours=8760)
    ca_renew_before: timedelta = timedelta(hours=720)
    overlap: timedelta = timedelta(hours=1)

    def __post_init__(self) -> None:
        for name, value, limit, limit_name in (
            ("renewBefore", self.renew_before, self.validity, "certificateValidity"),
            ("ca.renewBefore", self.ca_renew_before, self.ca_validity, "ca.validity"),
        ):
            if value >= limit:
                raise CertSpecError(
                    f"spec.tls.{name} ({duration_text(value)}) must be shorter than spec.tls.{limit_name}"
                    f" ({duration_text(limit)}): every certificate would be renewed as soon as it is issued"
                )
        for name, value in (("certificateValidity", self.validity), ("ca.validity", self.ca_validity)):
            if value <= timedelta(0):
                raise CertSpecError(f"spec.tls.{name} must be positive, got {duration_text(value)}")


@dataclass(frozen=True, slots=True)
class SecretData:
    """A Secret as read: its data (base64 decoded) and annotations; ``owned``: by the resource (its
    ownerReference), which is what lets the operator replace a leaf Secret that holds garbage."""

    name: str
    data: Mapping[str, bytes]
    annotations: Mapping[str, str] = field(default_factory=dict)
    owned: bool = True


@dataclass(frozen=True, slots=True)
class PodTls:
    """What one pod reports it serves and trusts (GET /admin/v1/tls); ``problem``: why there is no
    usable report (not ready, unreachable, malformed), which the rotation waits on by name."""

    pod: str
    enabled: bool = False
    fingerprint: str | None = None
    issuer: str | None = None
    trusted: frozenset[str] = frozenset()
    reload_failing: bool = False
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class PeerCa:
    """Another resource of the namespace whose certificates come from the same CA: what its
    ``<cr>-tls`` Secret says its pods trust and serve, and which CAs its bundle holds."""

    resource: str  # "Kind/name", for messages
    trusted: str | None
    served: str | None
    bundle: frozenset[str]


@dataclass(frozen=True, slots=True)
class CertInput:
    namespace: str
    resource: str  # the custom resource's name
    label: str  # "Kind/name", for messages
    hosts: tuple[str, ...]
    spec: TlsSpec
    ca: SecretData | None
    leaf: SecretData | None
    client: SecretData | None
    pods: tuple[PodTls, ...]
    peers: tuple[PeerCa, ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class CertAction:
    """One Secret write: ``data`` keys set (None: removed), ``annotations`` likewise; ``create``: the
    Secret does not exist yet. ``event``: the Event reason to post on the resource (None: none)."""

    step: Step
    secret: str
    data: Mapping[str, bytes | None]
    annotations: Mapping[str, str | None]
    message: str
    event: str | None = None
    create: bool = False


@dataclass(frozen=True, slots=True)
class TlsView:
    """status.tls."""

    mode: str
    phase: str
    message: str
    ca_not_after: datetime | None = None
    certificate_not_after: datetime | None = None


@dataclass(frozen=True, slots=True)
class CertPlan:
    actions: tuple[CertAction, ...]
    view: TlsView
    waiting: str | None = None
    refused: str | None = None


def resource_hosts(name: str, namespace: str) -> tuple[str, ...]:
    """The names a resource's pods answer to (docs/contracts.md): the headless Service's wildcard, so
    scaling never needs a new certificate, the Service's names, and the loopback."""
    return (
        f"*.{name}.{namespace}.svc",
        f"*.{name}.{namespace}.svc.cluster.local",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
        f"{name}.{namespace}",
        name,
        "localhost",
        "127.0.0.1",
    )


def duration_text(value: timedelta) -> str:
    """A duration as spec.tls spells it (720h, 90m, 45s)."""
    seconds = int(value.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"
