"""A pod's TLS certificates, re-read while it runs: new connections get rotated ones, open ones keep theirs.

cert-manager or the operator renews a certificate by rewriting the mounted Secret (Kubernetes swaps the
volume's ``..data`` symlink). Every few seconds the files are read and hashed; when they changed, all
contexts are built again (server/tls_settings.py) and swapped in at once, so the listeners and the
pod-to-pod connections opened from then on use them. A read that does not make a usable set (a
half-written pair, a key of another certificate, an expired certificate) keeps the contexts in use,
logs the error once per content and counts it: txnkeeper_tls_reload_errors_total; with
txnkeeper_tls_certificate_expiry_seconds{listener} the alert "certificate expiring within 14 days" sees
both a renewal that never came and one that came broken. A CA bundle holding the old and the new CA
trusts both during a CA rotation's overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from txnkeeper.contract import pki
from txnkeeper.contract.admin import PodCertificate, PodTls
from txnkeeper.contract.tls import TlsClientSettings, TlsServerSettings, TlsSettingsError
from txnkeeper.protocol.tls_accept import tls_factory
from txnkeeper.server.tls_settings import TlsContexts, build_contexts, read_files

log = logging.getLogger(__name__)


class TlsReloader:
    """The current contexts of a pod (``TlsSource`` of its listeners, ``ClientTls`` of its peer pools)."""

    def __init__(self, config: TlsServerSettings) -> None:
        self.config = config
        self._current: TlsContexts = build_contexts(config, read_files(config))
        self._report = _report(config, self._current, dt.datetime.now(dt.UTC))
        self._failed_digest: str | None = None
        self.reloads = 0
        self.reload_errors = 0
        # The files on disk are not the ones in use and could not be used (cleared once they are):
        # a broken renewal counts one error, but stays visible here for as long as it lasts.
        self.failing = False
        self.handshake_failures: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._peer_settings = TlsClientSettings(config.ca_file or "", config.cert_file, config.key_file)
        log.info("TLS on %s: %s", ", ".join(sorted(config.listeners)), self.describe())

    # --- TlsSource / ClientTls -------------------------------------------------------------------------
    def server_context(self, listener: str) -> ssl.SSLContext:
        return self._current.server[listener]

    def handshake_failed(self, listener: str) -> None:
        self.handshake_failures[listener] += 1

    @property
    def settings(self) -> TlsClientSettings:
        return self._peer_settings

    def client_context(self) -> ssl.SSLContext:
        return self._current.peer

    # --- reloading ---------------------------------------------------------------------------------------
    def describe(self) -> str:
        cert = self._current.certificate
        return (
            f"certificate {self.config.cert_file} (serial {cert.serial_number:x}, notAfter"
            f" {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC), CA file {self.config.ca_file}"
            f" ({self._current.cas} CAs)"
        )

    def check(self) -> bool:
        """Read the files; swap in new contexts if they changed and make a usable set. True if swapped."""
        try:
            files = read_files(self.config)
        except TlsSettingsError as exc:  # a missing file is reported once, not at every check
            return self._failed(f"unreadable: {exc}", exc)
        digest = files.digest
        if digest == self._current.files.digest:
            self.failing = False
            return False
        if digest == self._failed_digest:
            return False
        try:
            contexts = build_contexts(self.config, files)
        except (TlsSettingsError, ssl.SSLError, ValueError) as exc:
            return self._failed(digest, exc)
        self._current = contexts
        self._report = _report(self.config, contexts, dt.datetime.now(dt.UTC))
        self._failed_digest = None
        self.failing = False
        self.reloads += 1
        log.info("TLS files changed: new connections use %s; open connections keep theirs", self.describe())
        return True

    def _failed(self, digest: str, exc: BaseException) -> bool:
        self.failing = True
        if digest == self._failed_digest:
            return False
        self._failed_digest = digest
        self.reload_errors += 1
        log.error("TLS reload failed, the certificates in use stay: %s", exc)
        return False

    def report(self) -> PodTls:
        """``GET /admin/v1/tls``: the files in use now (a rotation the pod could not use shows as
        ``reloadFailing`` beside the old, still served, certificate)."""
        return replace(self._report, reload_failing=self.failing)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.reload_interval_s)
            try:
                # Reading and building takes a few ms of CPU (key parsing): off the event loop.
                await asyncio.to_thread(self.check)
            except Exception:
                log.exception("TLS reload check failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def expiry_seconds(self) -> float:
        now = dt.datetime.now(dt.UTC)
        return (self._current.certificate.not_valid_after_utc - now).total_seconds()


def _report(config: TlsServerSettings, contexts: TlsContexts, loaded_at: dt.datetime) -> PodTls:
    """What ``contexts`` hold, for GET /admin/v1/tls: fingerprints (sha256 of the DER, hex) of the leaf,
    of its issuer when the CA bundle holds it, and of every trusted CA."""
    leaf = contexts.certificate
    try:
        what = f"CA file {config.ca_file}"
        cas = pki.load_bundle(contexts.files.ca, what=what) if contexts.files.ca else []
    except ValueError:
        cas = []  # build_contexts loaded them; a bundle it accepted but pki refuses reports no CAs
    issuer = next((ca for ca in cas if pki.signed_by(leaf, ca)), None)
    return PodTls(
        enabled=True,
        listeners=tuple(sorted(config.listeners)),
        certificate=PodCertificate(
            fingerprint=pki.fingerprint(leaf),
            not_after=leaf.not_valid_after_utc.isoformat(),
            issuer_fingerprint=pki.fingerprint(issuer) if issuer is not None else None,
            hosts=tuple(pki.hosts_of(leaf)),
        ),
        trusted_cas=tuple(pki.fingerprint(ca) for ca in cas),
        loaded_at=loaded_at.isoformat(),
    )


class TlsCollector(Collector):
    """The reloader's state as Prometheus metrics (registered by the pod beside its other collectors)."""

    def __init__(self, reloader: TlsReloader) -> None:
        self._reloader = reloader

    def collect(self) -> Iterator[Metric]:
        reloader = self._reloader
        expiry = GaugeMetricFamily(
            "txnkeeper_tls_certificate_expiry_seconds",
            "Seconds until the certificate a TLS listener serves expires (notAfter - now)",
            labels=["listener"],
        )
        seconds = reloader.expiry_seconds()
        for listener in sorted(reloader.config.listeners):
            expiry.add_metric([listener], seconds)
        yield expiry
        yield CounterMetricFamily(
            "txnkeeper_tls_reload_errors",
            "Rotated TLS files that could not be used (the certificates in use were kept)",
            value=reloader.reload_errors,
        )
        yield GaugeMetricFamily(
            "txnkeeper_tls_reload_failing",
            "1 while the TLS files on disk differ from those in use and cannot be used",
            value=1.0 if reloader.failing else 0.0,
        )
        yield CounterMetricFamily(
            "txnkeeper_tls_reloads", "TLS file rotations taken into use", value=reloader.reloads
        )
        refused = CounterMetricFamily(
            "txnkeeper_tls_handshake_failures",
            "Connections refused at the TLS handshake, by listener",
            labels=["listener"],
        )
        for listener in ("client", "admin"):
            refused.add_metric([listener], reloader.handshake_failures[listener])
        yield refused


class TlsSite(web.TCPSite):
    """The admin API's site over TLS: the reloader's current context for each new connection."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, reloader: TlsReloader) -> None:
        super().__init__(runner, host, port, reuse_address=True)
        self._reloader = reloader

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        factory = tls_factory(server, self._reloader, "admin", handshake_timeout=10.0)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
