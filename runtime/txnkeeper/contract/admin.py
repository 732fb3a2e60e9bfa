"""The one client of a pod's admin API (contracts §5), used by the operator and the local fleet.

Both drive runtime pods only over HTTP (the operator never imports the runtime, contracts §0), and they
used to keep two hand-written copies of these calls and of the JSON checks. This is also where the admin
API's answers are checked: a document of the wrong shape is an AdminError, which the rollout engine sees
as "state unknown" and waits on, never as "batching disabled". It needs aiohttp and nothing from
txnkeeper outside the contract package.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from txnkeeper.contract.batching import BatchSettings
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

    async def _call(
        self, method: str, url: str, token: str | None = None, body: Any = None, *, text: bool = False
    ) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, timeout=self._timeout, ssl=self._ssl
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
            described = describe_url_error(cause, url, self._tls_settings)
            raise AdminError(f"{method} {url}: {described or err}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise AdminError(f"{method} {url}: {type(err).__name__}: {err}") from err

    async def ready(self, base: str) -> bool:
        """True when the pod's /ready answers 200; any failure to ask is simply not ready."""
        try:
            async with self._session.get(f"{base}/ready", timeout=self._timeout, ssl=self._ssl) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
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

    async def metrics(self, base: str) -> str:
        """The pod's Prometheus text exposition."""
        text: str = await self._call("GET", f"{base}/metrics", text=True)
        return text
