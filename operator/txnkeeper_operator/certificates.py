"""The certificate manager's I/O: read the Secrets and the pods' TLS reports, run the certificate engine,
write what it decides, post Events, publish status.tls and the expiry metric.

Called by every reconcile (the change handlers and the periodic tick) before the resource's children
are applied, so a pod is never started before the Secret it mounts exists. Two modes (docs/contracts.md
"Certificates"): the operator's own CA per namespace (engine/certs.py decides, this module writes), or,
with spec.tls.certManager.issuerRef, cert-manager ``Certificate`` objects whose Secrets this module only
waits for and reads. Writes to the namespace's shared Secrets (``txnkeeper-ca``, the operator's client
certificate) are serialised per namespace in this process and made conditional on the CA Secret's
resourceVersion, so two resources' reconciles can never start two rotations.
"""

from __future__ import annotations

import asyncio
from base64 import b64decode, b64encode
from collections.abc import Mapping
from typing import Any

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminError
from txnkeeper_operator import metrics, naming, observe, podtls, tlsspec
from txnkeeper_operator.context import Context
from txnkeeper_operator.engine import certs
from txnkeeper_operator.engine.certs import (
    CertAction,
    CertInput,
    CertSpecError,
    PeerCa,
    PodTls,
    SecretData,
    TlsView,
)
from txnkeeper_operator.engine.persist import format_time
from txnkeeper_operator.kube import KindNotServed, Obj, WriteConflict
from txnkeeper_operator.resource import Resource

CERT_MANAGER_API = "cert-manager.io/v1"
CERTIFICATES = "certificates"
CLIENT_CERTIFICATE = "txnkeeper-operator-client"
_LOCKS: dict[str, asyncio.Lock] = {}


def enabled(cr: Resource, default: bool) -> bool:
    """spec.tls.enabled, else ``default`` (the operator's setting from the chart's tls.enabled)."""
    return tlsspec.enabled(cr.spec, default)


def issuer_ref(cr: Resource) -> Mapping[str, Any] | None:
    """spec.tls.certManager.issuerRef (None: the operator's own CA)."""
    block = cr.section("tls").get("certManager")
    ref = block.get("issuerRef") if isinstance(block, Mapping) else None
    return ref if isinstance(ref, Mapping) and ref.get("name") else None


def leaf_secret(cr: Resource) -> str:
    return f"{cr.name}-tls"


def _decoded(obj: Obj | None, owner_uid: str | None) -> SecretData | None:
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    data = {k: b64decode(v) for k, v in (obj.get("data") or {}).items() if isinstance(v, str)}
    owned = owner_uid is None or any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or [])
    return SecretData(str(meta.get("name", "")), data, dict(meta.get("annotations") or {}), owned)


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "txnkeeper", "app.kubernetes.io/managed-by": naming.FIELD_MANAGER}


def _secret_manifest(cr: Resource, action: CertAction) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": action.secret,
        "namespace": cr.namespace,
        "labels": _labels(),
        "annotations": {k: v for k, v in action.annotations.items() if v is not None},
    }
    if action.secret == leaf_secret(cr):
        meta["ownerReferences"] = [cr.owner_reference()]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        # The CA Secret holds a private key users must never mount: Opaque, not a TLS Secret.
        "type": "Opaque" if action.secret == certs.CA_SECRET else "kubernetes.io/tls",
        "data": {k: b64encode(v).decode() for k, v in action.data.items() if v is not None},
    }


def _patch(action: CertAction, version: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if action.annotations:
        meta["annotations"] = dict(action.annotations)
    if version is not None:
        meta["resourceVersion"] = version  # conditional: a concurrent writer makes this a 409
    patch: dict[str, Any] = {"metadata": meta}
    if action.data:
        patch["data"] = {
            k: (b64encode(v).decode() if v is not None else None) for k, v in action.data.items()
        }
    return patch


async def _pod_reports(ctx: Context, cr: Resource) -> tuple[PodTls, ...]:
    """What every pod of the resource says it serves and trusts (GET /admin/v1/tls)."""
    pods = await ctx.kube.list_pods(cr.namespace, naming.selector_string(cr.kind, cr.name))
    reports: list[PodTls] = []

    async def one(pod: Obj) -> None:
        name = str(pod["metadata"]["name"])
        # https:// for a pod started with TLS; ctx.admin is the reconcile's, scoped to mutual TLS.
        base = podtls.pod_base(pod)
        if not observe.pod_ready(pod) or base is None:
            reports.append(PodTls(name, problem="not ready"))
            return
        try:
            doc = await ctx.admin.verb("GET", f"{base}/admin/v1/tls")
        except AdminError as err:
            reports.append(PodTls(name, problem=str(err)))
            return
        reports.append(observe.tls_report(name, doc))

    # A terminating pod is going away; its successor starts from the Secret as it is now.
    await asyncio.gather(*(one(p) for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")))
    return tuple(sorted(reports, key=lambda r: r.pod))


async def _peers(ctx: Context, cr: Resource) -> tuple[PeerCa, ...]:
    """The namespace's other resources whose certificates come from the operator's CA."""
    out: list[PeerCa] = []
    for kind in naming.KINDS:
        for body in await ctx.kube.list_resources(kind.plural, cr.namespace):
            other = Resource.from_body({**body, "kind": kind.kind})
            if (other.kind, other.name) == (cr.kind, cr.name):
                continue
            if not enabled(other, ctx.settings.tls_default) or issuer_ref(other) is not None:
                continue
            secret = _decoded(await ctx.kube.get("Secret", cr.namespace, leaf_secret(other)), None)
            notes = secret.annotations if secret else {}
            out.append(
                PeerCa(
                    f"{kind.kind}/{other.name}",
                    notes.get(certs.TRUSTED_ANNOTATION),
                    notes.get(certs.SERVED_ANNOTATION),
                    certs.bundle_fingerprints(secret.data.get(certs.CA_CERT, b"")) if secret else frozenset(),
                )
            )
    return tuple(out)


def view_to_status(view: TlsView) -> dict[str, Any]:
    status: dict[str, Any] = {"mode": view.mode, "phase": view.phase, "message": view.message}
    status["caNotAfter"] = format_time(view.ca_not_after) if view.ca_not_after else None
    status["certificateNotAfter"] = (
        format_time(view.certificate_not_after) if view.certificate_not_after else None
    )
    return status


async def _operator_mode(ctx: Context, cr: Resource, body: Mapping[str, Any]) -> TlsView:
    try:
        # Read and checked once, as the SettingsValid condition reads it (tlsspec), for the engine.
        read = tlsspec.TlsSpec.of(cr.spec, True)
        spec = certs.TlsSpec(
            renew_before=read.renew_before,
            validity=read.certificate_validity,
            ca_validity=read.ca_validity,
            ca_renew_before=read.ca_renew_before,
            overlap=read.ca_overlap,
        )
    except (tlsspec.TlsSpecError, CertSpecError) as err:
        return TlsView("operator", "Refused", str(err))
    lock = _LOCKS.setdefault(cr.namespace, asyncio.Lock())
    async with lock:
        ca_obj = await ctx.kube.get("Secret", cr.namespace, certs.CA_SECRET)
        ca = _decoded(ca_obj, None)
        rotating = bool(ca and ca.annotations.get(certs.PHASE_ANNOTATION))
        leaf_obj = await ctx.kube.get("Secret", cr.namespace, leaf_secret(cr))
        client_obj = await ctx.kube.get("Secret", cr.namespace, certs.CLIENT_SECRET)
        inp = CertInput(
            namespace=cr.namespace,
            resource=cr.name,
            label=f"{cr.kind.kind}/{cr.name}",
            hosts=certs.resource_hosts(cr.name, cr.namespace),
            spec=spec,
            ca=ca,
            leaf=_decoded(leaf_obj, cr.uid),
            client=_decoded(client_obj, None),
            # The pods' reports matter only to a rotation; outside one nobody is asked.
            pods=await _pod_reports(ctx, cr) if rotating else (),
            peers=await _peers(ctx, cr) if rotating else (),
            now=ctx.clock(),
        )
        plan = certs.plan(inp)
        versions = {
            certs.CA_SECRET: _version(ca_obj),
            leaf_secret(cr): _version(leaf_obj),
            certs.CLIENT_SECRET: _version(client_obj),
        }
        for action in plan.actions:
            if not await _write(ctx, cr, action, versions):
                break  # lost a race: the next reconcile decides again from what is there
            if action.event is not None:
                ctx.events.emit(body, "Normal", action.event, action.message)
    return plan.view


def _version(obj: Obj | None) -> str | None:
    return str((obj or {}).get("metadata", {}).get("resourceVersion") or "") or None


async def _write(ctx: Context, cr: Resource, action: CertAction, versions: dict[str, str | None]) -> bool:
    if action.create:
        return await ctx.kube.create_if_absent(_secret_manifest(cr, action))
    # Only the shared CA Secret is written conditionally: the rest have one writer (this resource, or
    # the namespace lock for the client certificate).
    version = versions.get(action.secret) if action.secret == certs.CA_SECRET else None
    try:
        written = await ctx.kube.patch_secret(cr.namespace, action.secret, _patch(action, version))
    except WriteConflict:
        return False
    versions[action.secret] = _version(written)
    return True


def _certificate(cr: Resource, ref: Mapping[str, Any], *, client: bool) -> dict[str, Any]:
    """A cert-manager Certificate: the resource's (server and client auth, the pods' names) or the
    operator's client certificate (one per namespace, owned by no resource)."""
    tls = cr.section("tls")
    spec: dict[str, Any] = {
        "issuerRef": {
            "name": str(ref["name"]),
            "kind": str(ref.get("kind") or "Issuer"),
            "group": str(ref.get("group") or "cert-manager.io"),
        },
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
    }
    for key, field in (("certificateValidity", "duration"), ("renewBefore", "renewBefore")):
        if key in tls:
            spec[field] = str(tls[key])
    meta: dict[str, Any] = {"namespace": cr.namespace, "labels": _labels()}
    if client:
        meta["name"] = CLIENT_CERTIFICATE
        spec |= {
            "secretName": certs.CLIENT_SECRET,
            "commonName": certs.CLIENT_COMMON_NAME,
            "usages": ["client auth", "digital signature"],
        }
    else:
        hosts = certs.resource_hosts(cr.name, cr.namespace)
        meta |= {"name": leaf_secret(cr), "ownerReferences": [cr.owner_reference()]}
        spec |= {
            "secretName": leaf_secret(cr),
            "commonName": f"{cr.name}.{cr.namespace}.svc",
            "dnsNames": [h for h in hosts if not h[0].isdigit()],
            "ipAddresses": [h for h in hosts if h[0].isdigit()],
            "usages": ["server auth", "client auth", "digital signature"],
        }
    return {"apiVersion": CERT_MANAGER_API, "kind": "Certificate", "metadata": meta, "spec": spec}


async def _cert_manager_mode(ctx: Context, cr: Resource, ref: Mapping[str, Any]) -> TlsView:
    try:
        await ctx.kube.apply_custom(CERTIFICATES, _certificate(cr, ref, client=False))
    except KindNotServed as err:
        return TlsView(
            "cert-manager",
            "Refused",
            f"spec.tls.certManager is set but {err}: install cert-manager (its CRDs), or remove"
            " spec.tls.certManager to use the operator's own CA",
        )
    # The first resource's issuer makes the namespace's client certificate; later ones leave it be.
    await ctx.kube.create_custom_if_absent(CERTIFICATES, _certificate(cr, ref, client=True))
    found: list[tuple[str, pki.Issued, bytes]] = []
    for certificate, secret_name in (
        (leaf_secret(cr), leaf_secret(cr)),
        (CLIENT_CERTIFICATE, certs.CLIENT_SECRET),
    ):
        secret = _decoded(await ctx.kube.get("Secret", cr.namespace, secret_name), None)
        if secret is None or not secret.data.get(certs.TLS_CERT):
            return TlsView(
                "cert-manager",
                "Pending",
                f"waiting for cert-manager to issue Certificate {cr.namespace}/{certificate} (issuer"
                f" {ref.get('kind') or 'Issuer'} {ref['name']}): Secret {secret_name} has no tls.crt yet;"
                f" see kubectl -n {cr.namespace} describe certificate {certificate}",
            )
        try:
            issued = pki.load_issued(
                secret.data[certs.TLS_CERT],
                secret.data.get(certs.TLS_KEY, b""),
                what=f"Secret {cr.namespace}/{secret_name} (Certificate {certificate}) tls.crt/tls.key",
            )
        except pki.PkiError as err:
            return TlsView("cert-manager", "Refused", str(err))
        found.append((secret_name, issued, secret.data.get(certs.CA_CERT, b"")))
    (leaf_name, leaf, bundle), _client = found
    ca_after = min(
        (c.not_valid_after_utc for c in _bundle(bundle)),
        default=None,
    )
    return TlsView(
        "cert-manager",
        "Ready",
        f"Secret {leaf_name} holds certificate {certs.short(leaf.fingerprint)} issued by cert-manager"
        f" (issuer {ref.get('kind') or 'Issuer'} {ref['name']}), valid until {format_time(leaf.not_after)}",
        ca_after,
        leaf.not_after,
    )


def _bundle(pem: bytes) -> list[Any]:
    try:
        return list(pki.load_bundle(pem, what="ca.crt"))
    except pki.PkiError:
        return []


async def ensure(
    ctx: Context, cr: Resource, body: Mapping[str, Any], status: Mapping[str, Any]
) -> TlsView | None:
    """The resource's certificates as they should be now; publishes status.tls (None: TLS is off)."""
    if not enabled(cr, ctx.settings.tls_default):
        if status.get("tls"):
            await ctx.kube.patch_status(cr.kind.plural, cr.namespace, cr.name, {"tls": None})
        return None
    ref = issuer_ref(cr)
    view = await (_cert_manager_mode(ctx, cr, ref) if ref is not None else _operator_mode(ctx, cr, body))
    previous = status.get("tls") or {}
    published = view_to_status(view)
    if published != previous:
        await ctx.kube.patch_status(cr.kind.plural, cr.namespace, cr.name, {"tls": published})
        if previous.get("message") != view.message:
            if view.phase == "Refused":
                ctx.events.emit(body, "Warning", "CertificateRefused", view.message)
            elif view.phase == "Pending":
                ctx.events.emit(body, "Normal", "CertificatePending", view.message)
    if view.certificate_not_after is not None:
        metrics.CERTIFICATES.record(cr.namespace, leaf_secret(cr), view.certificate_not_after)
    if view.ca_not_after is not None and ref is None:
        metrics.CERTIFICATES.record(cr.namespace, certs.CA_SECRET, view.ca_not_after)
    return view
