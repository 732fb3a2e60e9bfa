"""A small asyncio client for the Kubernetes REST API, for the node agent.

Why not the `kubernetes` package: its client is synchronous and deserialises into models that drop
what they do not know; the node agent needs raw JSON, merge patches, and list+watch loops on one event
loop next to the pod processes it supervises. The surface is exactly what a kubelet uses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

log = logging.getLogger("kubeapi")

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class KubeClient:
    """Authenticated with a client certificate from a kubeconfig written by localcluster.pki."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server: str = cluster["server"]
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl, limit=20))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        data = json.dumps(body) if body is not None else None
        async with self.session.request(
            method,
            self.server + path,
            data=data,
            params=params,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise ApiError(resp.status, method, path, text)
            result: Obj = json.loads(text) if text else {}
            return result

    async def get(self, path: str, params: dict[str, str] | None = None) -> Obj | None:
        """The object, or None when it does not exist (404)."""
        try:
            return await self.request("GET", path, params=params)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def create(self, path: str, body: Obj) -> Obj | None:
        """Create; None when it already exists (409)."""
        try:
            return await self.request("POST", path, body)
        except ApiError as e:
            if e.status == 409:
                return None
            raise

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str, body: Obj | None = None) -> bool:
        """Delete; False when it was already gone (404) or a precondition did not hold (409)."""
        try:
            await self.request("DELETE", path, body)
            return True
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise

    async def watch(self, path: str, params: dict[str, str], resource_version: str) -> AsyncIterator[Obj]:
        """Watch events from resource_version; ends when the server ends the stream."""
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "240",
        }
        async with self.session.get(
            self.server + path,
            params=query,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=300),
        ) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, "WATCH", path, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)


async def informer(
    client: KubeClient,
    path: str,
    params: dict[str, str],
    on_list: Callable[[list[Obj]], Awaitable[None]],
    on_event: Callable[[str, Obj], Awaitable[None]],
) -> None:
    """List, then watch; relist after an expired resourceVersion or a broken connection.

    Consumers are level-based: on_list gets the full set each time, so a missed event is repaired.
    """
    while True:
        try:
            listing = await client.request("GET", path, params=params)
            await on_list(listing["items"])
            rv = listing["metadata"]["resourceVersion"]
            while True:
                ended_cleanly = True
                async for event in client.watch(path, params, rv):
                    kind = event["type"]
                    obj = event["object"]
                    if kind == "ERROR":  # usually 410 Gone: the resourceVersion is too old
                        ended_cleanly = False
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        await on_event(kind, obj)
                if not ended_cleanly:
                    break
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, ApiError, OSError) as e:
            log.warning("informer %s: %s; relisting", path, e)
            await asyncio.sleep(1.0)  # back off a little before relisting against a failing server
