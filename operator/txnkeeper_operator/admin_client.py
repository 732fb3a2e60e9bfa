"""HTTP client for a pod's admin API (contracts §5): the operator's only channel into the runtime.

The operator never imports the runtime, so this module is also where the admin API's JSON is checked:
a document of the wrong shape is an AdminError, which the engine sees as "state unknown" and waits on,
never as "batching disabled".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from txnkeeper_operator.engine import BatchSettings
from txnkeeper_operator.naming import Kind


class AdminError(Exception):
    """A pod's admin API could not be reached or answered something unusable."""


@dataclass(frozen=True, slots=True)
class PodBatchLog:
    """What GET /admin/v1/batch-log says about the log this resource kind governs."""

    pod_level: BatchSettings
    stores: tuple[BatchSettings, ...]
    array: tuple[Mapping[str, Any], ...]  # coordinatorArray / subscriptionArray entries as reported

    def effective(self) -> BatchSettings:
        """One value for the whole pod (``BatchSettings.effective``)."""
        return BatchSettings.effective(self.pod_level, self.stores)


def parse_batch_log(kind: Kind, doc: Any) -> PodBatchLog:
    try:
        pod_level = BatchSettings.from_stat(doc[kind.stat_key])
        array = tuple(doc.get(kind.array_key) or [])
        stores = tuple(BatchSettings.from_stat(entry[kind.array_stat_key]) for entry in array)
    except (KeyError, TypeError, ValueError) as err:
        raise AdminError(f"malformed batch-log document: {err!r}") from err
    return PodBatchLog(pod_level, stores, array)


def parse_rollover(doc: Any) -> dict[str, int]:
    """POST /admin/v1/stores/rollover -> {store name: LastBatchedLedger}."""
    try:
        return {str(s["name"]): int(s["lastBatchedLedger"]) for s in doc["stores"]}
    except (KeyError, TypeError, ValueError) as err:
        raise AdminError(f"malformed rollover answer: {err!r}") from err


class AdminClient:
    def __init__(self, session: aiohttp.ClientSession, timeout_seconds: float = 5.0) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def _call(self, method: str, url: str, token: str | None = None, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, timeout=self._timeout
            ) as resp:
                try:
                    doc = await resp.json(content_type=None)
                except ValueError:
                    doc = None
                if resp.status >= 400:
                    detail = doc.get("error") if isinstance(doc, dict) else None
                    raise AdminError(f"{method} {url}: HTTP {resp.status}: {detail or resp.reason}")
                return doc
        except (aiohttp.ClientError, TimeoutError) as err:
            raise AdminError(f"{method} {url}: {type(err).__name__}: {err}") from err

    async def info(self, base: str) -> dict[str, Any]:
        doc = await self._call("GET", f"{base}/admin/v1/info")
        if not isinstance(doc, dict) or "release" not in doc:
            raise AdminError(f"GET {base}/admin/v1/info: not an info document")
        return doc

    async def batch_log(self, base: str, kind: Kind) -> PodBatchLog:
        return parse_batch_log(kind, await self._call("GET", f"{base}/admin/v1/batch-log"))

    async def set_batch_log(self, base: str, kind: Kind, batch: BatchSettings, token: str) -> None:
        await self._call("POST", f"{base}/admin/v1/batch-log", token, {kind.stat_key: batch.to_stat()})

    async def rollover(self, base: str, token: str) -> dict[str, int]:
        return parse_rollover(await self._call("POST", f"{base}/admin/v1/stores/rollover", token, {}))
