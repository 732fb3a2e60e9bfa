"""The certificate engine: (the namespace's CA Secret, the resource's certificate Secrets, what every pod
reports it serves and trusts, the other resources' progress, the spec's durations, now) -> the writes
that come next, why the rest waits, or why the operator refuses to touch the material.

Pure like the rollout and scaling engines (no kopf, no Kubernetes client; the clock is an input): the
operator's certificates.py reads the world into a ``CertInput``, calls ``plan`` and carries out the
``CertAction``s in order, stopping at the first that fails. Nothing is remembered between passes but
the Secrets themselves (the CA rotation's phase in ``txnkeeper-ca``'s annotations, each resource's
progress in its ``<cr>-tls`` Secret's annotations), so a restarted operator resumes from what the
cluster holds and what the pods say, in every phase.

Why the CA rotation has three phases (Strimzi's cluster CA renewal, driven by what pods report as
Strimzi's KafkaRoller is): a pod refuses a peer whose certificate comes from a CA it does not trust, so
(1) ``trust-new``: every bundle gains the new CA while every leaf stays signed by the old one, until
every pod of every resource of the namespace reports it trusts both; (2) ``reissue``: every leaf and
the operator's client certificate are re-issued from the new CA, until every pod serves one; (3)
``retire-old``: after ``overlap`` since (1), the old CA leaves the bundles and then ``txnkeeper-ca``.
A phase never advances because time passed, only on the pods' reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from cryptography import x509

from txnkeeper.contract import pki
from txnkeeper_operator.engine.certmodel import (
    CA_CERT,
    CA_KEY,
    CA_PREVIOUS,
    CA_PREVIOUS_KEY,
    CA_SECRET,
    CLIENT_COMMON_NAME,
    CLIENT_SECRET,
    OVERLAP_ANNOTATION,
    PHASE_ANNOTATION,
    REASON_ANNOTATION,
    RENEW_ANNOTATION,
    ROTATE_ANNOTATION,
    SERVED_ANNOTATION,
    STARTED_ANNOTATION,
    TLS_CERT,
    TLS_KEY,
    TRUSTED_ANNOTATION,
    CertAction,
    CertInput,
    CertPlan,
    CertSpecError,
    PeerCa,
    Phase,
    PodTls,
    SecretData,
    Step,
    TlsSpec,
    TlsView,
    duration_text,
    parse_duration,
    resource_hosts,
)

# Everything callers use goes through this module: the vocabulary is re-exported.
__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CA_PREVIOUS",
    "CA_PREVIOUS_KEY",
    "CA_SECRET",
    "CLIENT_COMMON_NAME",
    "CLIENT_SECRET",
    "OVERLAP_ANNOTATION",
    "PHASE_ANNOTATION",
    "REASON_ANNOTATION",
    "ROTATE_ANNOTATION",
    "SERVED_ANNOTATION",
    "STARTED_ANNOTATION",
    "TLS_CERT",
    "TLS_KEY",
    "TRUSTED_ANNOTATION",
    "CertAction",
    "CertInput",
    "CertPlan",
    "CertSpecError",
    "PeerCa",
    "Phase",
    "PodTls",
    "SecretData",
    "Step",
    "TlsSpec",
    "TlsView",
    "bundle_fingerprints",
    "duration_text",
    "parse_duration",
    "plan",
    "resource_hosts",
    "short",
]


class _Refused(Exception):
    pass


def short(fingerprint: str | None) -> str:
    return (fingerprint or "none")[:12]


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class _Planner:
    """One pass: the material as it will be after each action so far (later checks see earlier writes)."""

    def __init__(self, inp: CertInput) -> None:
        self.inp = inp
        self.actions: list[CertAction] = []
        self.waiting: list[str] = []
        self.ca: pki.Issued
        self.previous: list[x509.Certificate] = []
        # The old CA with its key, in phase trust-new only (None before, or for a rotation that an
        # operator without it started: leaves then come from the new CA).
        self.previous_issuer: pki.Issued | None = None
        self.phase = Phase.IDLE
        self.ca_annotations: dict[str, str] = dict(inp.ca.annotations) if inp.ca else {}
        self.leaf: pki.Issued | None = None
        self.leaf_annotations: dict[str, str] = dict(inp.leaf.annotations) if inp.leaf else {}
        self.leaf_bundle: frozenset[str] = frozenset()
        self.client: pki.Issued | None = None
        # This pass started a rotation: no pod can have seen the new CA, and the caller asks the pods
        # (and reads the other resources) only once a rotation is under way, so nothing advances now.
        self.started = False

    # --- the CA ------------------------------------------------------------------------------------

    def _refuse_ca(self, where: str, what: str) -> _Refused:
        ns = self.inp.namespace
        return _Refused(
            f"Secret {ns}/{CA_SECRET} {where}: {_terse(what)}. The operator never replaces a CA on its"
            f" own (pods trust it): repair the Secret, or delete it (kubectl -n {ns} delete secret"
            f" {CA_SECRET}) to let the operator make a new CA (every certificate is then re-issued from it"
            " at once, without an overlap)"
        )

    def load_ca(self) -> None:
        secret, now = self.inp.ca, self.inp.now
        if secret is None:
            self.ca = pki.new_ca(
                f"txnkeeper CA {self.inp.namespace}", now=now, validity=self.inp.spec.ca_validity
            )
            self.actions.append(
                CertAction(
                    Step.CREATE_CA,
                    CA_SECRET,
                    {CA_CERT: self.ca.cert_pem, CA_KEY: self.ca.key_pem},
                    {},
                    f"created the namespace's CA {short(self.ca.fingerprint)}, valid until"
                    f" {_at(self.ca.not_after)}",
                    create=True,
                )
            )
            return
        for key in (CA_CERT, CA_KEY):
            if not secret.data.get(key):
                raise self._refuse_ca(f"key {key}", "missing or empty")
        try:
            self.ca = pki.load_issued(secret.data[CA_CERT], secret.data[CA_KEY], what="the CA")
        except pki.PkiError as err:
            raise self._refuse_ca(f"keys {CA_CERT}/{CA_KEY}", str(err)) from None
        try:
            constraints = self.ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
            is_ca = constraints.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise self._refuse_ca(f"key {CA_CERT}", "the certificate is not a CA (basicConstraints CA:FALSE)")
        if self.ca.not_after <= now:
            raise self._refuse_ca(f"key {CA_CERT}", f"the CA expired at {_at(self.ca.not_after)}")
        if secret.data.get(CA_PREVIOUS):
            try:
                self.previous = pki.load_bundle(secret.data[CA_PREVIOUS], what="the previous CA")
            except pki.PkiError as err:
                raise self._refuse_ca(f"key {CA_PREVIOUS}", str(err)) from None
        raw = self.ca_annotations.get(PHASE_ANNOTATION, "")
        if secret.data.get(CA_PREVIOUS_KEY) and raw == Phase.TRUST_NEW:
            try:
                self.previous_issuer = pki.load_issued(
                    secret.data[CA_PREVIOUS], secret.data[CA_PREVIOUS_KEY], what="the previous CA"
                )
            except pki.PkiError as err:
                raise self._refuse_ca(f"keys {CA_PREVIOUS}/{CA_PREVIOUS_KEY}", str(err)) from None
        try:
            self.phase = Phase(raw)
        except ValueError:
            raise self._refuse_ca(
                f"annotation {PHASE_ANNOTATION}",
                f"{raw!r} is not a rotation phase ({', '.join(p for p in Phase if p)}, or absent)",
            ) from None
        if self.phase is not Phase.IDLE and not self.previous:
            raise self._refuse_ca(
                f"key {CA_PREVIOUS}", f"missing although the rotation is in phase {self.phase}"
            )

    def maybe_start_rotation(self) -> None:
        if self.phase is not Phase.IDLE:
            return
        spec, now = self.inp.spec, self.inp.now
        if self.ca_annotations.get(ROTATE_ANNOTATION) == "now":
            reason = f"requested by the annotation {ROTATE_ANNOTATION}=now"
        elif self.ca.not_after - now <= spec.ca_renew_before:
            reason = (
                f"the CA expires at {_at(self.ca.not_after)}, within spec.tls.ca.renewBefore"
                f" ({duration_text(spec.ca_renew_before)})"
            )
        else:
            return
        old = self.ca
        self.ca = pki.new_ca(f"txnkeeper CA {self.inp.namespace}", now=now, validity=spec.ca_validity)
        self.previous = [old.cert]
        self.previous_issuer = old
        self.phase = Phase.TRUST_NEW
        self.started = True
        annotations: dict[str, str | None] = {
            PHASE_ANNOTATION: str(Phase.TRUST_NEW),
            STARTED_ANNOTATION: _at(now),
            OVERLAP_ANNOTATION: _at(now + spec.overlap),
            REASON_ANNOTATION: reason,
            ROTATE_ANNOTATION: None,
        }
        self._note_ca_annotations(annotations)
        self.actions.append(
            CertAction(
                Step.START_ROTATION,
                CA_SECRET,
                {
                    CA_CERT: self.ca.cert_pem,
                    CA_KEY: self.ca.key_pem,
                    CA_PREVIOUS: old.cert_pem,
                    CA_PREVIOUS_KEY: old.key_pem,
                },
                annotations,
                f"CA rotation started ({reason}): new CA {short(self.ca.fingerprint)}, old CA"
                f" {short(old.fingerprint)} stays trusted; phase trust-new: every pod must trust both"
                " before certificates are re-issued",
                event="CertificateAuthorityRotating",
            )
        )

    def _note_ca_annotations(self, annotations: Mapping[str, str | None]) -> None:
        for key, value in annotations.items():
            if value is None:
                self.ca_annotations.pop(key, None)
            else:
                self.ca_annotations[key] = value

    @property
    def bundle(self) -> list[x509.Certificate]:
        """What every pod must trust now."""
        keep_old = self.phase in (Phase.TRUST_NEW, Phase.REISSUE)
        return [self.ca.cert, *(self.previous if keep_old else [])]

    @property
    def bundle_fingerprints(self) -> frozenset[str]:
        return frozenset(pki.fingerprint(c) for c in self.bundle)

    # --- leaves ------------------------------------------------------------------------------------

    def _renewal_reason(
        self, secret: SecretData | None, hosts: Sequence[str] | None
    ) -> tuple[pki.Issued | None, str | None]:
        """The leaf the Secret holds (None: unusable) and why it must be (re)issued (None: it is fine)."""
        if secret is None:
            return None, "the Secret does not exist"
        for key in (TLS_CERT, TLS_KEY):
            if not secret.data.get(key):
                return None, f"Secret {secret.name} has no key {key}"
        try:
            leaf = pki.load_issued(
                secret.data[TLS_CERT], secret.data[TLS_KEY], what=f"Secret {secret.name} {TLS_CERT}/{TLS_KEY}"
            )
        except pki.PkiError as err:
            return None, _terse(str(err))
        now, spec = self.inp.now, self.inp.spec
        issuers = [self.ca.cert, *(self.previous if self.phase is Phase.TRUST_NEW else [])]
        issuer = next((ca for ca in issuers if pki.signed_by(leaf.cert, ca)), None)
        if issuer is None:
            return leaf, f"it was not issued by the current CA {short(self.ca.fingerprint)}"
        if leaf.not_after <= now:
            return leaf, f"it expired at {_at(leaf.not_after)}"
        if secret.annotations.get(RENEW_ANNOTATION) == "now":
            return leaf, f"requested by the annotation {RENEW_ANNOTATION}=now"
        if hosts is not None and sorted(set(pki.hosts_of(leaf.cert))) != sorted(set(hosts)):
            have, want = set(pki.hosts_of(leaf.cert)), set(hosts)
            return leaf, (
                f"its hosts differ (missing: {', '.join(sorted(want - have)) or 'none'};"
                f" extra: {', '.join(sorted(have - want)) or 'none'})"
            )
        # A leaf ending with its CA cannot be renewed into a longer one: the CA's rotation renews it.
        if leaf.not_after - now <= spec.renew_before and leaf.not_after < issuer.not_valid_after_utc:
            if issuer is not self.ca.cert:
                return leaf, None  # phase trust-new: re-issued from the new CA in the next phase
            return leaf, (
                f"it expires at {_at(leaf.not_after)}, within spec.tls.renewBefore"
                f" ({duration_text(spec.renew_before)})"
            )
        return leaf, None

    @property
    def issuer(self) -> pki.Issued:
        """The CA new certificates come from: in phase trust-new the old one, which every pod trusts
        (the new CA is trusted only once every pod reports it is; a certificate from it handed out
        earlier, say to a resource created meanwhile, would be refused by the pods that have not yet
        re-read their bundle). The reissue phase replaces those certificates like all others."""
        old = self.previous_issuer
        if self.phase is Phase.TRUST_NEW and old is not None and old.not_after > self.inp.now:
            return old
        return self.ca

    def _issue(self, common_name: str, hosts: Sequence[str], *, server: bool) -> pki.Issued:
        return pki.issue(
            self.issuer,
            common_name,
            hosts=hosts,
            now=self.inp.now,
            validity=self.inp.spec.validity,
            server=server,
            client=True,
        )

    def leaf_step(self) -> None:
        inp = self.inp
        secret = inp.leaf
        if secret is not None and not secret.owned:
            raise _Refused(
                f"Secret {inp.namespace}/{secret.name} exists but is not owned by {inp.label}: the operator"
                " does not overwrite a Secret it did not make; delete or rename it"
            )
        leaf, reason = self._renewal_reason(secret, inp.hosts)
        bundle = pki.bundle_pem(self.bundle)
        if reason is not None:
            from_new = (
                self.phase is Phase.REISSUE
                and leaf is not None
                and any(pki.signed_by(leaf.cert, ca) for ca in self.previous)
            )
            self.leaf = self._issue(f"{inp.resource}.{inp.namespace}.svc", inp.hosts, server=True)
            self.leaf_bundle = self.bundle_fingerprints
            self.actions.append(
                CertAction(
                    Step.REISSUE if from_new else Step.ISSUE,
                    f"{inp.resource}-tls",
                    {TLS_CERT: self.leaf.cert_pem, TLS_KEY: self.leaf.key_pem, CA_CERT: bundle},
                    _renewed(secret),
                    (
                        f"certificate {short(self.leaf.fingerprint)} re-issued from the new CA"
                        f" {short(self.ca.fingerprint)} (CA rotation phase reissue)"
                        if from_new
                        else f"certificate {short(self.leaf.fingerprint)} issued by CA"
                        f" {short(self.issuer.fingerprint)}, valid until {_at(self.leaf.not_after)}: {reason}"
                    ),
                    event="CertificateRenewed",
                    create=secret is None,
                )
            )
            return
        assert secret is not None and leaf is not None
        self.leaf = leaf
        have = secret.data.get(CA_CERT) or b""
        self.leaf_bundle = _fingerprints(have)
        if have != bundle:
            self.leaf_bundle = self.bundle_fingerprints
            self.actions.append(
                CertAction(
                    Step.PUT_BUNDLE,
                    secret.name,
                    {CA_CERT: bundle},
                    {},
                    "trust bundle ca.crt now holds "
                    + " and ".join(f"CA {short(pki.fingerprint(c))}" for c in self.bundle),
                )
            )

    def client_step(self) -> None:
        """The operator's own client certificate (one per namespace): renewed like a leaf."""
        secret = self.inp.client
        client, reason = self._renewal_reason(secret, None)
        bundle = pki.bundle_pem(self.bundle)
        if reason is not None:
            self.client = self._issue(CLIENT_COMMON_NAME, (), server=False)
            from_new = (
                self.phase is Phase.REISSUE
                and client is not None
                and any(pki.signed_by(client.cert, ca) for ca in self.previous)
            )
            self.actions.append(
                CertAction(
                    Step.REISSUE if from_new else Step.ISSUE,
                    CLIENT_SECRET,
                    {TLS_CERT: self.client.cert_pem, TLS_KEY: self.client.key_pem, CA_CERT: bundle},
                    _renewed(secret),
                    f"the operator's client certificate {short(self.client.fingerprint)} "
                    + (
                        f"re-issued from the new CA {short(self.ca.fingerprint)} (CA rotation phase reissue)"
                        if from_new
                        else f"issued by CA {short(self.issuer.fingerprint)}: {reason}"
                    ),
                    create=secret is None,
                )
            )
            return
        assert secret is not None
        self.client = client
        if (secret.data.get(CA_CERT) or b"") != bundle:
            self.actions.append(
                CertAction(
                    Step.PUT_BUNDLE,
                    CLIENT_SECRET,
                    {CA_CERT: bundle},
                    {},
                    "the operator's trust bundle now holds "
                    + " and ".join(f"CA {short(pki.fingerprint(c))}" for c in self.bundle),
                )
            )

    # --- the pods' progress and the rotation's phases ----------------------------------------------

    def _pods_waiting(self, *, serve: bool) -> list[str]:
        """Why each pod is not yet where the rotation needs it (empty: every pod is)."""
        current = self.ca.fingerprint
        need = self.bundle_fingerprints
        out: list[str] = []
        for pod in sorted(self.inp.pods, key=lambda p: p.pod):
            stuck = " (its certificate reload is failing)" if pod.reload_failing else ""
            if pod.problem is not None:
                out.append(f"pod {pod.pod} to report its TLS state ({pod.problem})")
            elif not pod.enabled:
                out.append(f"pod {pod.pod} to serve TLS (it reports TLS off)")
            elif not serve and not need <= pod.trusted:
                missing = ", ".join(short(f) for f in sorted(need - pod.trusted))
                out.append(f"pod {pod.pod} to trust CA {missing}{stuck}")
            elif serve and pod.issuer != current:
                out.append(
                    f"pod {pod.pod} to serve a certificate from the new CA {short(current)} (it serves"
                    f" one from CA {short(pod.issuer)}){stuck}"
                )
        return out

    def _mark(self, key: str, done: bool) -> None:
        """Record on <cr>-tls that every pod trusts / serves from the current CA. Only ever set: within
        a rotation no pod goes back (the bundle keeps both CAs until retire-old, a new pod starts from
        the Secret), and a mark naming an earlier rotation's CA counts for nothing."""
        value = self.ca.fingerprint
        if not done or self.leaf_annotations.get(key) == value:
            return
        self.leaf_annotations[key] = value
        what = "trusts" if key == TRUSTED_ANNOTATION else "serves a certificate from"
        self.actions.append(
            CertAction(
                Step.MARK,
                f"{self.inp.resource}-tls",
                {},
                {key: value},
                f"every pod of {self.inp.label} {what} CA {short(value)}",
            )
        )

    def _advance(self, to: Phase, message: str, *, event: str = "CertificateAuthorityRotating") -> None:
        self.phase = to
        annotations: dict[str, str | None] = {PHASE_ANNOTATION: str(to)}
        # Past trust-new nothing is issued from the old CA again: its key leaves the Secret.
        data: dict[str, bytes | None] = {CA_PREVIOUS_KEY: None}
        self.previous_issuer = None
        step = Step.ADVANCE
        if to is Phase.IDLE:
            annotations = {k: None for k in (PHASE_ANNOTATION, STARTED_ANNOTATION, OVERLAP_ANNOTATION)}
            annotations[REASON_ANNOTATION] = None
            data = {CA_PREVIOUS: None, CA_PREVIOUS_KEY: None}
            step = Step.RETIRE_OLD
            self.previous = []
        self._note_ca_annotations(annotations)
        self.actions.append(CertAction(step, CA_SECRET, data, annotations, message, event=event))

    def rotation_step(self) -> None:
        """Progress marks for this resource, then the namespace's phase if every resource is there."""
        if self.phase is Phase.IDLE:
            return
        current = self.ca.fingerprint
        if self.started:
            self.waiting.append(
                f"CA rotation (trust-new): started; waiting for every pod to trust the new CA"
                f" {short(current)}"
            )
            return
        others = self.inp.peers
        if self.phase is Phase.TRUST_NEW:
            pods = self._pods_waiting(serve=False)
            self._mark(TRUSTED_ANNOTATION, not pods and self.leaf_bundle >= self.bundle_fingerprints)
            behind = [p.resource for p in others if p.trusted != current]
            if pods or behind:
                self.waiting.append(
                    "CA rotation (trust-new): waiting for "
                    + "; ".join(pods or [f"the pods of {', '.join(behind)} to trust CA {short(current)}"])
                )
                return
            self._advance(
                Phase.REISSUE,
                f"every pod of every resource trusts the new CA {short(current)}: phase reissue,"
                " certificates are re-issued from it",
            )
            self.leaf_step()  # re-issued from the new CA in this pass
            self.client_step()
        if self.phase is Phase.REISSUE:
            pods = self._pods_waiting(serve=True)
            served = not pods and self.leaf is not None and pki.signed_by(self.leaf.cert, self.ca.cert)
            self._mark(SERVED_ANNOTATION, served)
            behind = [p.resource for p in others if p.served != current]
            client_done = self.client is not None and pki.signed_by(self.client.cert, self.ca.cert)
            overlap_until = _parse_at(self.ca_annotations.get(OVERLAP_ANNOTATION))
            if pods or behind or not client_done:
                if not (pods or behind):
                    pods = ["the operator's client certificate from the new CA"]
                elif not pods:
                    pods = [f"the pods of {', '.join(behind)} to serve certificates from the new CA"]
                self.waiting.append("CA rotation (reissue): waiting for " + "; ".join(pods))
                return
            if overlap_until is not None and self.inp.now < overlap_until:
                self.waiting.append(
                    f"CA rotation (reissue): every pod serves a certificate from the new CA; the old CA"
                    f" stays trusted until {_at(overlap_until)} (spec.tls.ca.overlap)"
                )
                return
            self._advance(
                Phase.RETIRE_OLD,
                f"every pod serves a certificate from the new CA {short(current)} and the overlap has"
                " passed: phase retire-old, the old CA leaves the trust bundles",
            )
            self.leaf_step()  # the bundle without the old CA
            self.client_step()
        if self.phase is Phase.RETIRE_OLD:
            old = frozenset(pki.fingerprint(c) for c in self.previous)
            behind = [p.resource for p in others if p.bundle & old]
            if behind or self.leaf_bundle & old:
                self.waiting.append(
                    f"CA rotation (retire-old): waiting for {', '.join(behind)} to drop the old CA from"
                    " its trust bundle"
                )
                return
            retired = ", ".join(short(f) for f in sorted(old))
            self._advance(
                Phase.IDLE,
                f"CA rotation done: the old CA {retired} is retired, CA {short(current)} is the only one"
                " trusted",
                event="CertificateAuthorityRotated",
            )

    def view(self) -> TlsView:
        if self.waiting:
            message = self.waiting[0]
        else:
            assert self.leaf is not None
            if self.leaf.not_after >= self.ca.not_after:
                rotation = self.ca.not_after - self.inp.spec.ca_renew_before
                due = f"renewed by the CA's rotation, due at {_at(rotation)}"
            else:
                due = f"renewal due at {_at(self.leaf.not_after - self.inp.spec.renew_before)}"
            message = (
                f"certificate {short(self.leaf.fingerprint)} from CA {short(self.ca.fingerprint)}, valid"
                f" until {_at(self.leaf.not_after)}; {due}"
            )
        return TlsView(
            "operator",
            str(self.phase) or "Ready",
            message,
            self.ca.not_after,
            self.leaf.not_after if self.leaf is not None else None,
        )


def _renewed(secret: SecretData | None) -> dict[str, str | None]:
    """A re-issue answers a renewal request: its annotation goes with it."""
    return {RENEW_ANNOTATION: None} if secret is not None and RENEW_ANNOTATION in secret.annotations else {}


def _terse(text: str) -> str:
    """An error without the cryptography library's pointer to its FAQ."""
    return re.sub(r"\s*See https?://\S+ for more details\.", "", text)


def _parse_at(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None  # unreadable: the overlap is taken as passed (it only delays, never guards safety)


def _fingerprints(pem: bytes) -> frozenset[str]:
    try:
        return frozenset(pki.fingerprint(c) for c in pki.load_bundle(pem, what="ca.crt"))
    except pki.PkiError:
        return frozenset()


def bundle_fingerprints(pem: bytes) -> frozenset[str]:
    """The CAs of a ``ca.crt`` bundle (empty when unreadable): a peer's ``PeerCa.bundle``."""
    return _fingerprints(pem)


def plan(inp: CertInput) -> CertPlan:
    """What to write next for one resource (and the namespace's CA and client certificate)."""
    planner = _Planner(inp)
    try:
        planner.load_ca()
        planner.maybe_start_rotation()
        planner.leaf_step()
        planner.client_step()
        planner.rotation_step()
    except _Refused as refused:
        message = str(refused)
        ca_after = getattr(planner, "ca", None)
        return CertPlan(
            (),
            TlsView("operator", "Refused", message, ca_after.not_after if ca_after else None, None),
            refused=message,
        )
    view = planner.view()
    return CertPlan(tuple(planner.actions), view, waiting=view.message if planner.waiting else None)
