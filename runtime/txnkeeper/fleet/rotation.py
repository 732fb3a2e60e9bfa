"""Rotating the local fleet's certificates while it runs: the local counterpart of the operator's
certificate manager (issue 28; the same steps and the same rule: a step is done when every process
says so, never because time passed).

Leaf renewal is one step: a new leaf per process from the same CA, then wait until each process has
taken it. A CA rotation is three: (1) trust-new: a new CA, the trust bundle holds new and old; wait
until every process has re-read it; (2) reissue: every leaf (and the fleet's client certificate) from
the new CA; wait until every process serves its new leaf; (3) retire-old: the bundle holds the new CA
only; wait until every process has re-read it. Connections open across the steps keep their
certificates (server/tls_reload.py); new ones get the new material.

"Has taken it" is read from what the process reports, as the operator reads pods' reports: its
``txnkeeper_tls_reloads_total`` went past its value before the step and ``txnkeeper_tls_reload_failing``
is 0 (a process that read a half-replaced pair refused it and then took the full one); for a new leaf
also the certificate a new TLS connection to each of its listeners is served (its SHA-256
fingerprint). A process that does not get there in time fails the step, naming it and what it said.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from txnkeeper.contract import pki
from txnkeeper.contract.admin import AdminClient, AdminError
from txnkeeper.fleet.certificates import FleetCertificates, now
from txnkeeper.fleet.process import RuntimeProcess

STEP_TIMEOUT_S = 60.0
POLL_S = 0.2
CA_NAME = "txnkeeper local fleet CA"


class RotationError(RuntimeError):
    """A step did not complete on every process in time; the message names which and why."""


@dataclass(frozen=True, slots=True)
class Reported:
    """What one process's metrics say about its TLS files."""

    reloads: float
    failing: bool


def _metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def served_fingerprint(address: str, context: ssl.SSLContext) -> str:
    """The SHA-256 fingerprint of the certificate a new TLS connection to ``address`` is served
    (blocking: run it in a thread)."""
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if not der:
        raise ssl.SSLError(f"{address} presented no certificate")
    return pki.fingerprint(pki.load_bundle(ssl.DER_cert_to_PEM_cert(der).encode(), what=address)[0])


def _addresses(member: RuntimeProcess) -> tuple[str, str]:
    """Its client and admin ``host:port`` (the fleet pins them; a member started on port 0 reports
    them once ready)."""
    return member.client_address or member.listen, member.admin_address or member.admin_listen


class CertificateRotation:
    """The rotations of one fleet's certificates; ``members`` lists the processes to wait on (the
    running ones of every group), ``say`` reports each step."""

    def __init__(
        self,
        certificates: FleetCertificates,
        admin: AdminClient,
        members: Callable[[], Sequence[RuntimeProcess]],
        say: Callable[[str], None],
        *,
        step_timeout_s: float = STEP_TIMEOUT_S,
    ) -> None:
        self.certificates = certificates
        self.admin = admin
        self.members = members
        self.say = say
        self.step_timeout_s = step_timeout_s

    async def renew_leaves(self) -> None:
        """A new leaf for every process (and the fleet's client) from the current CA."""
        await self._step("renew leaves", self._reissue)

    async def rotate_ca(self) -> None:
        """A new CA in three steps (module docstring)."""
        old = self.certificates.ca
        new = pki.new_ca(
            f"{CA_NAME} {now():%Y%m%d%H%M%S}",
            now=now(),
            validity=old.not_after - old.cert.not_valid_before_utc,
        )

        def trust_new() -> dict[str, str]:
            self.certificates.trust([new.cert, old.cert])
            return {}

        def reissue() -> dict[str, str]:
            self.certificates.ca = new
            self.certificates.write_ca()
            return self._reissue()

        def retire_old() -> dict[str, str]:
            self.certificates.trust([new.cert])
            return {}

        await self._step("CA rotation 1/3 trust-new (bundle: new + old CA)", trust_new)
        await self._step("CA rotation 2/3 reissue (every leaf from the new CA)", reissue)
        await self._step("CA rotation 3/3 retire-old (bundle: new CA only)", retire_old)

    # --- one step ------------------------------------------------------------------------------------------
    def _reissue(self) -> dict[str, str]:
        """New leaves for every running process; their fingerprints by process name."""
        self.certificates.issue_client()
        return {m.name: self.certificates.issue_leaf(m.name).fingerprint for m in self.members()}

    async def _step(self, what: str, change: Callable[[], dict[str, str]]) -> None:
        members = [m for m in self.members() if m.running()]
        before = {m.name: await self._reported(m) for m in members}
        started = time.monotonic()
        leaves = change()
        for member in members:
            await self._until(member, what, self._taken(member, before[member.name], leaves.get(member.name)))
        self.say(f"{what}: taken by {len(members)} process(es) in {time.monotonic() - started:.1f}s")

    async def _reported(self, member: RuntimeProcess) -> Reported:
        text = await self.admin.metrics(f"{member.scheme}://{_addresses(member)[1]}")
        reloads = _metric(text, "txnkeeper_tls_reloads_total")
        if reloads is None:
            raise RotationError(f"{member.name} reports no txnkeeper_tls_reloads_total: is TLS on there?")
        return Reported(reloads, _metric(text, "txnkeeper_tls_reload_failing") == 1)

    def _taken(
        self, member: RuntimeProcess, before: Reported, fingerprint: str | None
    ) -> Callable[[], Awaitable[str | None]]:
        """A check: None once ``member`` has taken the step, else what it says meanwhile."""

        async def check() -> str | None:
            now_reported = await self._reported(member)
            if now_reported.reloads <= before.reloads or now_reported.failing:
                return (
                    f"reloads {now_reported.reloads:g} (before the step {before.reloads:g}),"
                    f" reload failing: {now_reported.failing}"
                )
            if fingerprint is None:
                return None
            context = self.certificates.client_context()
            for address in _addresses(member):
                served = await asyncio.to_thread(served_fingerprint, address, context)
                if served != fingerprint:
                    return f"{address} still serves certificate {served[:16]}..., not {fingerprint[:16]}..."
            return None

        return check

    async def _until(
        self, member: RuntimeProcess, what: str, check: Callable[[], Awaitable[str | None]]
    ) -> None:
        deadline = time.monotonic() + self.step_timeout_s
        said: str | None = "not asked yet"
        while time.monotonic() < deadline:
            try:
                said = await check()
            except (AdminError, OSError, ssl.SSLError) as err:
                said = f"cannot be asked: {err}"
            if said is None:
                return
            await asyncio.sleep(POLL_S)
        raise RotationError(
            f"{what}: {member.name} did not take it within {self.step_timeout_s:.0f}s ({said}); its log:"
            f" {member.log_file}"
        )
