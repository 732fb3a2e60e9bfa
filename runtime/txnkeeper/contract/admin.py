"""The one client of a pod's admin API (contracts §5), used by the operator and the local fleet.

Both drive runtime pods only over HTTP (the operator never imports the runtime, contracts §0), and they
used to keep two hand-written copies of these calls and of the JSON checks. This is also where the admin
API's answers are checked: a document of the wrong shape is an AdminError, which the rollout engine sees
as "state unknown" and waits on, never as "batching disabled". It needs aiohttp and nothing from
txnkeeper outside the contract package.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import aiohttp

from txnkeeper.contract.batching import BatchSettings
from txnkeeper.contract.placement import Placement, PlacementError, PlacementKind
from txnkeeper.contract.tls import TlsClientSettings, describe_url_error


class AdminError(Exception):
    """A pod's admin API could not be reached or answered something unusable."""


class BatchLogKeys(Protocol):
    """Where the admin API's batch-log document keeps one log's settings (Pulsar's stat names)."""

    @property
    def stat_key(self) -> str: ...  # body key: which log the batchedWrite block governs

    @property
    def array_key(self) -> str: ...  # array of per-store stats

    @property
    def array_stat_key(self) -> str: ...  # field of an array entry holding its TxnBufferedWriterStat


@dataclass(frozen=True, slots=True)
class BatchLog:
    stat_key: str
    array_key: str
    array_stat_key: str


COORDINATOR_LOG = BatchLog("coordinator", "coordinatorArray", "transactionLogBatchedWriteStat")
PENDING_ACK_LOG = BatchLog("pendingAck", "subscriptionArray", "transactionPendingAckBatchedWriteStat")


@dataclass(frozen=True, slots=True)
class PodBatchLog:
    """What GET /admin/v1/batch-log says about one log of a pod."""

    pod_level: BatchSettings
    stores: tuple[BatchSettings, ...]
    array: tuple[Mapping[str, Any], ...]  # coordinatorArray / subscriptionArray entries as reported

    def effective(self) -> BatchSettings:
        """One value for the whole pod (``BatchSettings.effective``)."""
        return BatchSettings.effective(self.pod_level, self.stores)


def parse_batch_log(log: BatchLogKeys, doc: Any) -> PodBatchLog:
    try:
        pod_level = BatchSettings.from_stat(doc[log.stat_key])
        array = tuple(doc.get(log.array_key) or [])
        stores = tuple(BatchSettings.from_stat(entry[log.array_stat_key]) for entry in array)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise AdminError(f"malformed batch-log document: {err!r}") from err
    return PodBatchLog(pod_level, stores, array)


def parse_rollover(doc: Any) -> dict[str, int]:
    """POST /admin/v1/stores/rollover -> {store name: LastBatchedLedger}."""
    try:
        return {str(s["name"]): int(s["lastBatchedLedger"]) for s in doc["stores"]}
    except (KeyError, TypeError, ValueError) as err:
        raise AdminError(f"malformed rollover answer: {err!r}") from err


class AdminClient:
    """Calls on pods' admin APIs; ``token`` is the default bearer token for the mutating calls."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout_seconds: float = 5.0,
        token: str | None = None,
        *,
        tls: TlsClientSettings | ssl.SSLContext | None = None,
    ) -> None:
        """``tls``: https:// pod URLs are verified against its CA file (or with this context), the
        client certificate presented to pods that require one (contract/tls.py)."""
        self._session = session
        self._tls_settings = tls if isinstance(tls, TlsClientSettings) else None
        # aiohttp's default (True: the system's CAs) unless a CA was given
        self._ssl: ssl.SSLContext | bool = (
            tls.context() if isinstance(tls, TlsClientSettings) else (tls or True)
        )
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._token = token
        self._hostname_of: Callable[[str], str | None] = _no_hostname
        self._refusal: str | None = None

    def scoped(
        self,
        tls: ssl.SSLContext | None,
        hostname_of: Callable[[str], str | None] = lambda _url: None,
        *,
        refusal: str | None = None,
        ca_name: str | None = None,
    ) -> AdminClient:
        """The same session with another TLS context (the operator's per-namespace client certificate)
        and, for https:// URLs, the name each pod's certificate is checked against (``hostname_of(url)``:
        pods are reached by IP, their certificates name their DNS names). ``refusal``: every https://
        call fails at once with this message, reaching no pod (the client certificate is not there
        yet); ``ca_name``: where the trusted CAs come from, as refusals name it."""
        other = AdminClient(self._session, self._timeout.total or 5.0, self._token, tls=tls)
        if ca_name is not None:
            other._tls_settings = TlsClientSettings(ca_name)
        other._hostname_of = hostname_of
        other._refusal = refusal
        return other

    def _request_kwargs(self, url: str) -> dict[str, Any]:
        if self._refusal is not None and url.startswith("https://"):
            raise AdminError(f"{url}: {self._refusal}")
        kwargs: dict[str, Any] = {"timeout": self._timeout, "ssl": self._ssl}
        hostname = self._hostname_of(url) if url.startswith("https://") else None
        if hostname is not None:
            kwargs["server_hostname"] = hostname
        return kwargs

    async def _call(
        self, method: str, url: str, token: str | None = None, body: Any = None, *, text: bool = False
    ) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, **self._request_kwargs(url)
            ) as resp:
                raw = await resp.text()
                doc: Any = None
                if not text or resp.status >= 400:
                    try:
                        doc = await resp.json(content_type=None)
                    except ValueError:
                        doc = None
                if resp.status >= 400:
                    detail = doc.get("error") if isinstance(doc, dict) else None
                    raise AdminError(f"{method} {url}: HTTP {resp.status}: {detail or resp.reason}")
                return raw if text else doc
        except aiohttp.ClientSSLError as err:
            # aiohttp keeps the ssl module's error: a refused certificate, or the handshake's failure
            cause = getattr(err, "certificate_error", None) or getattr(err, "os_error", err)
            hostname = self._hostname_of(url)
            settings = self._tls_settings
            if settings is not None and hostname is not None:
                settings = replace(settings, server_hostname=hostname)
            described = describe_url_error(cause, url, settings)
            raise AdminError(f"{method} {url}: {described or err}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            # A TLS 1.3 server refuses a client certificate after the handshake: on the first read.
            cause = err.__cause__ or err.__context__
            if isinstance(cause, ssl.SSLError):
                described = describe_url_error(cause, url, self._tls_settings)
                raise AdminError(f"{method} {url}: {described or err}") from err
            raise AdminError(f"{method} {url}: {type(err).__name__}: {err}") from err

    async def ready(self, base: str) -> bool:
        """True when the pod's /ready answers 200; any failure to ask is simply not ready."""
        try:
            url = f"{base}/ready"
            async with self._session.get(url, **self._request_kwargs(url)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, AdminError):
            return False

    async def info(self, base: str) -> dict[str, Any]:
        doc = await self._call("GET", f"{base}/admin/v1/info")
        if not isinstance(doc, dict) or "release" not in doc:
            raise AdminError(f"GET {base}/admin/v1/info: not an info document")
        return doc

    async def batch_log(self, base: str, log: BatchLogKeys) -> PodBatchLog:
        return parse_batch_log(log, await self._call("GET", f"{base}/admin/v1/batch-log"))

    async def set_batch_log(
        self, base: str, log: BatchLogKeys, batch: BatchSettings, token: str | None = None
    ) -> None:
        body = {log.stat_key: batch.to_stat()}
        await self._call("POST", f"{base}/admin/v1/batch-log", token or self._token, body)

    async def rollover(self, base: str, token: str | None = None) -> dict[str, int]:
        doc = await self._call("POST", f"{base}/admin/v1/stores/rollover", token or self._token, {})
        return parse_rollover(doc)

    async def ledgers(self, base: str) -> dict[str, Any]:
        doc = await self._call("GET", f"{base}/admin/v1/stores/ledgers")
        if not isinstance(doc, dict):
            raise AdminError(f"GET {base}/admin/v1/stores/ledgers: not a ledgers document")
        return doc

    async def offload_summary(self, base: str) -> dict[str, Any]:
        """GET /admin/v1/offload/summary (docs/contracts.md §5): the pod's managed ledgers' offload state."""
        doc = await self._call("GET", f"{base}/admin/v1/offload/summary")
        if not isinstance(doc, dict) or "tierOnlyLedgers" not in doc or "maxMetadataVersion" not in doc:
            raise AdminError(f"GET {base}/admin/v1/offload/summary: not an offload summary document")
        return doc

    async def request_offload_restore(
        self, base: str, offload: Mapping[str, Any], token: str | None = None
    ) -> None:
        """POST /admin/v1/offload/restore: the pod restores its tier-only ledgers at its next start."""
        await self._call(
            "POST", f"{base}/admin/v1/offload/restore", token or self._token, {"offload": dict(offload)}
        )

    async def tls(self, base: str) -> PodTls:
        """``GET /admin/v1/tls`` (no token): the certificate the pod serves right now."""
        url = f"{base}/admin/v1/tls"
        return PodTls.from_json(await self._call("GET", url), f"GET {url}")

    async def metrics(self, base: str) -> str:
        """The pod's Prometheus text exposition."""
        text: str = await self._call("GET", f"{base}/metrics", text=True)
        return text

    # ---- placement (docs/contracts.md §12) ----------------------------------------------------------
    async def verb(self, method: str, url: str, token: str | None = None, body: Any = None) -> Any:
        """One JSON call; mutating calls carry ``token`` (default: the client's)."""
        return await self._call(method, url, token or self._token if method != "GET" else None, body)

    async def put_placement(self, base: str, record: Placement, token: str | None = None) -> None:
        """``PUT /admin/v1/placement`` with the record: the pod takes it when it is newer than its own
        (the same record again is a no-op; an older epoch is a 409)."""
        await self.verb("PUT", f"{base}/admin/v1/placement", token, record.to_json())

    async def get_placement(self, base: str) -> Placement:
        """``GET /admin/v1/placement``: the record the pod judges by (the answer is the record, or an
        object holding it under ``record`` beside the pod's move markers)."""
        url = f"{base}/admin/v1/placement"
        doc = await self.verb("GET", url)
        raw = doc.get("record", doc) if isinstance(doc, dict) else doc
        try:
            return Placement.from_json(raw, f"GET {url}")
        except PlacementError as err:
            raise AdminError(str(err)) from err

    def placement_calls(self, kind: PlacementKind) -> PlacementCalls:
        """The move verbs of store shards or of coordinator ids."""
        return PlacementCalls(self, SHARD_ROUTE if kind == "store-shards" else COORDINATOR_ROUTE)

    async def shard_fence(self, base: str, shard: int, move: str, token: str | None = None) -> dict[str, Any]:
        return await self.placement_calls("store-shards").fence(base, shard, move, token)

    async def shard_receive(
        self, base: str, shard: int, move: str, source: str, token: str | None = None
    ) -> dict[str, Any]:
        return await self.placement_calls("store-shards").receive(base, shard, move, source, token)

    async def shard_unfence(self, base: str, shard: int, move: str, token: str | None = None) -> None:
        await self.placement_calls("store-shards").unfence(base, shard, move, token)

    async def shard_discard(self, base: str, shard: int, move: str, token: str | None = None) -> None:
        await self.placement_calls("store-shards").discard(base, shard, move, token)

    async def shard_release(self, base: str, shard: int, move: str, token: str | None = None) -> None:
        await self.placement_calls("store-shards").release(base, shard, move, token)

    async def list_shards(self, base: str) -> HeldUnits:
        return await self.placement_calls("store-shards").held(base)

    async def coordinator_fence(
        self, base: str, coordinator: int, move: str, token: str | None = None
    ) -> dict[str, Any]:
        return await self.placement_calls("coordinator-ids").fence(base, coordinator, move, token)

    async def coordinator_receive(
        self, base: str, coordinator: int, move: str, source: str, token: str | None = None
    ) -> dict[str, Any]:
        return await self.placement_calls("coordinator-ids").receive(base, coordinator, move, source, token)

    async def coordinator_unfence(
        self, base: str, coordinator: int, move: str, token: str | None = None
    ) -> None:
        await self.placement_calls("coordinator-ids").unfence(base, coordinator, move, token)

    async def coordinator_discard(
        self, base: str, coordinator: int, move: str, token: str | None = None
    ) -> None:
        await self.placement_calls("coordinator-ids").discard(base, coordinator, move, token)

    async def coordinator_release(
        self, base: str, coordinator: int, move: str, token: str | None = None
    ) -> None:
        await self.placement_calls("coordinator-ids").release(base, coordinator, move, token)

    async def list_coordinator_ids(self, base: str) -> HeldUnits:
        return await self.placement_calls("coordinator-ids").held(base)


def _no_hostname(_url: str) -> str | None:
    return None


# ---- what a pod serves: GET /admin/v1/tls (docs/contracts.md §5) -------------------------------------


@dataclass(frozen=True, slots=True)
class PodCertificate:
    """The leaf a pod serves: sha256 of its DER (hex), notAfter (ISO 8601), the sha256 of its issuer's
    certificate when the pod's CA bundle holds the issuer (None otherwise), and the names it is for."""

    fingerprint: str
    not_after: str
    issuer_fingerprint: str | None
    hosts: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "notAfter": self.not_after,
            "issuerFingerprint": self.issuer_fingerprint,
            "hosts": list(self.hosts),
        }


@dataclass(frozen=True, slots=True)
class PodTls:
    """``GET /admin/v1/tls``: what the pod's TLS files loaded right now hold (not what is on disk:
    a rotated file the pod could not use leaves ``reload_failing`` true and the old values here).
    ``{"enabled": false}`` from a pod without TLS."""

    enabled: bool
    listeners: tuple[str, ...] = ()
    certificate: PodCertificate | None = None
    trusted_cas: tuple[str, ...] = ()
    loaded_at: str | None = None
    reload_failing: bool = False

    def to_json(self) -> dict[str, Any]:
        if not self.enabled or self.certificate is None:
            return {"enabled": False}
        return {
            "enabled": True,
            "listeners": list(self.listeners),
            "certificate": self.certificate.to_json(),
            "trustedCAs": list(self.trusted_cas),
            "loadedAt": self.loaded_at,
            "reloadFailing": self.reload_failing,
        }

    @classmethod
    def from_json(cls, doc: Any, where: str = "TLS report") -> PodTls:
        """Checked: a document of another shape is an AdminError naming what is wrong."""
        try:
            if not isinstance(doc, dict) or not isinstance(doc.get("enabled"), bool):
                raise TypeError("not an object with a boolean 'enabled'")
            if not doc["enabled"]:
                return cls(False)
            cert = doc["certificate"]
            issuer = cert.get("issuerFingerprint")
            if issuer is not None and not isinstance(issuer, str):
                raise TypeError("certificate.issuerFingerprint must be a string or null")
            texts = [cert["fingerprint"], cert["notAfter"], doc["loadedAt"], *cert["hosts"]]
            texts += [*doc["listeners"], *doc["trustedCAs"]]
            if not all(isinstance(t, str) for t in texts) or not isinstance(doc["reloadFailing"], bool):
                raise TypeError("fingerprints, names and times must be strings, reloadFailing a boolean")
            return cls(
                True,
                tuple(doc["listeners"]),
                PodCertificate(cert["fingerprint"], cert["notAfter"], issuer, tuple(cert["hosts"])),
                tuple(doc["trustedCAs"]),
                doc["loadedAt"],
                doc["reloadFailing"],
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise AdminError(f"{where}: malformed TLS report: {err}") from err


# ---- placement and moves (docs/contracts.md §12) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnitRoute:
    """Where one placement kind's move verbs live: ``/admin/v1/{path}/{unit}/{verb}`` and the listing
    ``GET /admin/v1/{path}`` whose ``{list_key}`` array has one entry per unit, keyed ``{id_key}``."""

    path: str
    list_key: str
    id_key: str


SHARD_ROUTE = UnitRoute("shards", "shards", "shard")
COORDINATOR_ROUTE = UnitRoute("coordinators", "coordinators", "coordinator")


@dataclass(frozen=True, slots=True)
class HeldUnit:
    """One shard (coordinator id) a pod holds data of, as ``GET /admin/v1/shards`` reports it: the
    owner its record names, ``serving``/``fenced``/``received``, and the load a rebalance weighs."""

    unit: int
    owner: int
    state: str
    bytes: int
    bytes_in_per_second: float
    txn_per_second: float


@dataclass(frozen=True, slots=True)
class HeldUnits:
    """A pod's listing: the epoch of the record it judges by and every unit it holds data of."""

    epoch: int
    units: tuple[HeldUnit, ...]


HELD_STATES = ("serving", "fenced", "received", "closed")
# A listing may name every unit of the record: these it only knows of (owned elsewhere, no data here).
NOT_HELD_STATES = ("elsewhere",)


def parse_held(route: UnitRoute, doc: Any) -> HeldUnits:
    """``GET /admin/v1/shards`` (``/admin/v1/coordinators``) -> HeldUnits: the units the pod holds
    data of (``closed``: owned, not open yet); rows in ``NOT_HELD_STATES`` are left out. A malformed
    entry is an AdminError (the engine then treats the pod as "holdings unknown" and never shrinks
    past it)."""
    try:
        epoch = doc["epoch"]
        rows = doc[route.list_key]
        if not _is_int(epoch) or not isinstance(rows, list):
            raise TypeError(f"epoch must be an integer and {route.list_key} a list")
        units = []
        for row in rows:
            state = row["state"]
            size = row.get("bytes", 0)
            if state not in HELD_STATES + NOT_HELD_STATES or not all(
                _is_int(v) for v in (row[route.id_key], row["owner"], size)
            ):
                raise ValueError(f"bad entry {row!r}")
            if state in NOT_HELD_STATES:
                continue
            units.append(
                HeldUnit(
                    unit=row[route.id_key],
                    owner=row["owner"],
                    state=state,
                    bytes=size,
                    bytes_in_per_second=float(row.get("bytesInPerSecond", 0.0)),
                    txn_per_second=float(row.get("txnPerSecond", 0.0)),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise AdminError(f"malformed {route.list_key} listing: {err!r}") from err
    return HeldUnits(epoch, tuple(units))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PlacementCalls:
    """The §12 verbs on one pod, for one placement kind (``SHARD_ROUTE`` or ``COORDINATOR_ROUTE``).
    Every verb is idempotent for the same move id, so a caller that crashed repeats it."""

    def __init__(self, admin: AdminClient, route: UnitRoute) -> None:
        self._admin = admin
        self._route = route

    def _url(self, base: str, unit: int, verb: str) -> str:
        return f"{base}/admin/v1/{self._route.path}/{unit}/{verb}"

    async def fence(self, base: str, unit: int, move: str, token: str | None = None) -> dict[str, Any]:
        """Step 1 on the source: the manifest ``{"shard"|"coordinator", "move", "epoch", "files",
        "bytes", ...}`` (409: the pod's record does not make it the owner)."""
        url = self._url(base, unit, "fence")
        doc = await self._admin.verb("POST", url, token, {"move": move})
        if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
            raise AdminError(f"POST {url}: not a move manifest")
        return doc

    async def receive(
        self, base: str, unit: int, move: str, source: str, token: str | None = None
    ) -> dict[str, Any]:
        """Step 3 on the target: it pulls every file of the manifest from ``source`` (the source's
        admin base URL) and answers ``{"files", "bytes"}`` once it has them, checked and fsync'd."""
        url = self._url(base, unit, "receive")
        doc = await self._admin.verb("POST", url, token, {"move": move, "source": source})
        if not isinstance(doc, dict) or not _is_int(doc.get("files")) or not _is_int(doc.get("bytes")):
            raise AdminError(f"POST {url}: not a receive answer (files, bytes)")
        return doc

    async def precopy(
        self,
        base: str,
        unit: int,
        move: str,
        source: str,
        token: str | None = None,
        *,
        max_bytes_per_second: int | None = None,
    ) -> dict[str, Any]:
        """Step 0 on the target (store shards): it copies the source's closed files before the fence
        and answers ``{"files", "bytes", ...}`` (what it pulled now); nothing is served from them.
        ``max_bytes_per_second`` bounds the copy (None: as fast as the pods go)."""
        url = self._url(base, unit, "precopy")
        body: dict[str, Any] = {"move": move, "source": source}
        if max_bytes_per_second is not None:
            body["maxBytesPerSecond"] = max_bytes_per_second
        doc = await self._admin.verb("POST", url, token, body)
        if not isinstance(doc, dict) or not _is_int(doc.get("files")) or not _is_int(doc.get("bytes")):
            raise AdminError(f"POST {url}: not a pre-copy answer (files, bytes)")
        return doc

    async def unfence(self, base: str, unit: int, move: str, token: str | None = None) -> None:
        """Roll back on the source (409: it no longer owns the unit)."""
        await self._admin.verb("POST", self._url(base, unit, "unfence"), token, {"move": move})

    async def discard(self, base: str, unit: int, move: str, token: str | None = None) -> None:
        """Roll back on the target: delete a staged or received copy (409: it owns the unit)."""
        await self._admin.verb("POST", self._url(base, unit, "discard"), token, {"move": move})

    async def release(self, base: str, unit: int, move: str, token: str | None = None) -> None:
        """Step 5 on the source: delete its copy (409 while its record still names it owner)."""
        await self._admin.verb("POST", self._url(base, unit, "release"), token, {"move": move})

    async def held(self, base: str) -> HeldUnits:
        """``GET /admin/v1/shards`` (or ``/admin/v1/coordinators``): what the pod holds."""
        return parse_held(self._route, await self._admin.verb("GET", f"{base}/admin/v1/{self._route.path}"))
