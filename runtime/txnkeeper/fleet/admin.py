"""The local fleet's admin-API calls (contracts §5), and the stat <-> engine settings mapping.

The fleet may import only the operator's pure engine (contracts §0), so it speaks HTTP to its members
itself, the same way the operator does to pods.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp

from txnkeeper_operator.engine import BatchSettings

TIMEOUT = aiohttp.ClientTimeout(total=10)


class FleetAdminError(Exception):
    """A member's admin API did not answer usefully."""


class FleetAdmin:
    def __init__(self, session: aiohttp.ClientSession, token: str) -> None:
        self._session = session
        self._token = token

    async def _call(self, method: str, url: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self._token}"} if method == "POST" else {}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, timeout=TIMEOUT
            ) as resp:
                if resp.content_type == "application/json":
                    doc = await resp.json()
                else:
                    doc = await resp.text()
                if resp.status >= 400:
                    raise FleetAdminError(f"{method} {url}: HTTP {resp.status}: {doc}")
                return doc
        except (aiohttp.ClientError, TimeoutError) as err:
            raise FleetAdminError(f"{method} {url}: {type(err).__name__}: {err}") from err

    async def ready(self, base: str) -> bool:
        try:
            async with self._session.get(f"{base}/ready", timeout=TIMEOUT) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def batch_settings(self, base: str, stat_key: str, array_key: str, entry_key: str) -> BatchSettings:
        """The member's effective settings: its pod-level value when every store agrees with it."""
        doc = await self._call("GET", f"{base}/admin/v1/batch-log")
        stores = [BatchSettings.from_stat(e[entry_key]) for e in doc.get(array_key) or []]
        return BatchSettings.effective(BatchSettings.from_stat(doc[stat_key]), stores)

    async def set_batch(self, base: str, stat_key: str, batch: BatchSettings) -> None:
        await self._call("POST", f"{base}/admin/v1/batch-log", {stat_key: batch.to_stat()})

    async def rollover(self, base: str) -> dict[str, int]:
        doc = await self._call("POST", f"{base}/admin/v1/stores/rollover", {})
        return {str(s["name"]): int(s["lastBatchedLedger"]) for s in doc["stores"]}

    async def ledgers(self, base: str) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call("GET", f"{base}/admin/v1/stores/ledgers")
        return doc

    async def batch_figures(self, base: str, prefix: str) -> dict[str, float]:
        """Records per batch and flush triggers from the member's Prometheus metrics."""
        text = str(await self._call("GET", f"{base}/metrics"))
        figures: dict[str, float] = {}
        for name in (
            "bufferedwriter_batch_records_sum",
            "bufferedwriter_batch_records_count",
            "bufferedwriter_flush_trigger_max_records_total",
            "bufferedwriter_flush_trigger_max_size_total",
            "bufferedwriter_flush_trigger_max_delay_total",
            "bufferedwriter_flush_trigger_large_data_total",
        ):
            total = 0.0
            for match in re.finditer(rf"^{prefix}_{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE):
                total += float(match.group(1))
            figures[name] = total
        return figures
