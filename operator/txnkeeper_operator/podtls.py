"""How the operator reaches a resource's pods: plain HTTP, or HTTPS with mutual TLS.

A pod is called with the scheme it serves, read from its own spec (the TLS env its template gave it),
never from what the resource asks for now: while a switch of spec.tls rolls through the pods, the old
pods still serve what they started with. Pods are reached by IP, so the check of a pod's certificate
uses the pod's DNS name behind the headless Service (``<pod>.<cr>.<ns>.svc``): only the certificate
of this resource (``*.<cr>.<ns>.svc``) passes, not one of another resource signed by the same CA.

The client certificate is the namespace's Secret ``txnkeeper-operator-client-tls`` (tls.crt, tls.key,
ca.crt), read through the API (nothing is mounted: the operator watches many namespaces) and turned
into one SSL context per namespace, rebuilt when the Secret's resourceVersion changes, so a CA
rotation's new bundle is used without a restart. Without the Secret no call goes to a TLS pod: the
resource's AdminTLS condition says what is awaited.
"""

from __future__ import annotations

import ssl
import tempfile
from base64 import b64decode
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient
from txnkeeper_operator import tlsspec
from txnkeeper_operator.engine import Condition, ConditionStatus, PodState
from txnkeeper_operator.kube import KubeApi
from txnkeeper_operator.observe import PodView, admin_base, pod_ip
from txnkeeper_operator.resource import Resource

Obj = Mapping[str, Any]
CONDITION = "AdminTLS"
_CERT_ENV = "TXNKEEPER_TLS_CERT_FILE"


def pod_serves_tls(pod: Obj) -> bool:
    """Whether the pod was started with a certificate (its runtime container's TLS env)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if any(e.get("name") == _CERT_ENV and e.get("value") for e in container.get("env") or []):
            return True
    return False


def pod_base(pod: Obj) -> str | None:
    """The pod's admin API (None: no IP yet): https:// when it serves TLS."""
    ip = pod_ip(pod)
    return admin_base(ip, tls=pod_serves_tls(pod)) if ip is not None else None


def mark_stale(states: Sequence[PodState], views: Sequence[PodView], *, tls: bool) -> tuple[PodState, ...]:
    """The pods started with the other transport than the template now gives (``tls``): the rollout
    restarts them one at a time (PodState.stale), as for a version change."""
    serving = {view.name: pod_serves_tls(view.obj) for view in views}
    out = []
    for state in states:
        now = serving.get(state.name, tls)
        why = f"TLS {'on' if now else 'off'} -> {'on' if tls else 'off'}"
        out.append(state if now == tls else replace(state, stale=why))
    return tuple(out)


class ClientTlsUnavailable(Exception):
    """The operator's client certificate of a namespace is missing or unusable (the message says which
    and what creates it); ``reason`` is the AdminTLS condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _secret_ref(namespace: str) -> str:
    return f"Secret {namespace}/{tlsspec.OPERATOR_CLIENT_SECRET}"


def build_context(secret: Obj, namespace: str) -> ssl.SSLContext:
    """A client context from the Secret's tls.crt, tls.key (presented to pods) and ca.crt (the pods'
    certificates are verified against every CA in it, old and new during a rotation)."""
    where = _secret_ref(namespace)
    data = secret.get("data") or {}
    missing = [key for key in ("tls.crt", "tls.key", "ca.crt") if not data.get(key)]
    if missing:
        raise ClientTlsUnavailable(
            "ClientSecretUnusable",
            f"{where} has no {', '.join(missing)} (it must hold tls.crt, tls.key and ca.crt, as the "
            "operator's certificate manager or cert-manager writes them)",
        )
    try:
        cert, key, ca = (b64decode(str(data[k])) for k in ("tls.crt", "tls.key", "ca.crt"))
        pki.load_issued(cert, key, what=f"{where} tls.crt/tls.key")
        pki.load_bundle(ca, what=f"{where} ca.crt")
    except (ValueError, TypeError) as err:
        raise ClientTlsUnavailable("ClientSecretUnusable", f"{err}") from err
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
    # ssl loads a key pair only from files: a private directory, gone once loaded.
    with tempfile.TemporaryDirectory(prefix="txnkeeper-operator-tls-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(str(cert_path), str(key_path))
    return context


class ClientTlsCache:
    """One context per namespace, kept while the Secret's resourceVersion stays the same."""

    def __init__(self) -> None:
        self._contexts: dict[str, tuple[str, ssl.SSLContext]] = {}
        self.builds = 0  # contexts built (a test proves a changed Secret is taken)

    async def context(self, kube: KubeApi, namespace: str) -> tuple[ssl.SSLContext, str]:
        """(context, the Secret's resourceVersion); raises ClientTlsUnavailable."""
        secret = await kube.get("Secret", namespace, tlsspec.OPERATOR_CLIENT_SECRET)
        if secret is None:
            self._contexts.pop(namespace, None)
            raise ClientTlsUnavailable(
                "ClientSecretMissing",
                f"waiting for {_secret_ref(namespace)}, which the operator's certificate manager or "
                "cert-manager creates: no call goes to this resource's TLS pods until it exists",
            )
        version = str(secret.get("metadata", {}).get("resourceVersion", ""))
        cached = self._contexts.get(namespace)
        if cached is not None and cached[0] == version and version:
            return cached[1], version
        context = build_context(secret, namespace)
        self.builds += 1
        self._contexts[namespace] = (version, context)
        return context, version


@dataclass(frozen=True, slots=True)
class PodCalls:
    """The admin client of one reconcile of one resource, and the AdminTLS condition (None: no TLS)."""

    admin: AdminClient
    condition: Condition | None


def hostnames(cr: Resource, pods: Sequence[Obj]) -> dict[str, str]:
    """https base URL of each TLS pod -> the name its certificate must be for."""
    out = {}
    for pod in pods:
        base = pod_base(pod)
        if base is not None and base.startswith("https://"):
            out[base] = tlsspec.server_hostname(str(pod["metadata"]["name"]), cr.name, cr.namespace)
    return out


async def pod_calls(
    cache: ClientTlsCache,
    kube: KubeApi,
    admin: AdminClient,
    cr: Resource,
    pods: Sequence[Obj],
    *,
    wanted: bool,
) -> PodCalls:
    """``admin`` scoped to ``cr``'s pods: HTTPS with the namespace's client certificate for the pods
    that serve TLS, each checked against its own DNS name. ``wanted``: the resource asks for TLS."""
    names = hostnames(cr, pods)
    if not wanted and not names:
        return PodCalls(admin, None)
    ref = _secret_ref(cr.namespace)

    def hostname_of(url: str) -> str | None:
        return next((name for base, name in names.items() if url.startswith(base)), None)

    try:
        context, version = await cache.context(kube, cr.namespace)
    except ClientTlsUnavailable as err:
        condition = Condition(CONDITION, ConditionStatus.FALSE, err.reason, str(err))
        return PodCalls(admin.scoped(None, hostname_of, refusal=str(err), ca_name=f"{ref} ca.crt"), condition)
    condition = Condition(
        CONDITION,
        ConditionStatus.TRUE,
        "ClientCertificateLoaded",
        f"the operator calls the pods' admin APIs over mutual TLS with {ref} (resourceVersion {version}); "
        f"each pod's certificate must be for <pod>.{cr.name}.{cr.namespace}.svc",
    )
    return PodCalls(admin.scoped(context, hostname_of, ca_name=f"{ref} ca.crt"), condition)
