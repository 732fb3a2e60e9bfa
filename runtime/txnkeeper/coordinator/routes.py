"""Where each topic is served, as clients told the coordinator, persisted for recovery.

Why the coordinator learns routes from clients: a store pod's address is whatever the client used to
reach it (a DNS name or a pod IP); recording it when a partition or subscription joins a transaction
lets the coordinator end that transaction there, also after a coordinator restart, without a
separate topology service. Changes are rare (first sight of a topic), so each is written durably.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from txnkeeper.coordinator.sequence import write_atomically


class RouteTable:
    """topic -> store address, durable."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._routes: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        if not self._path.exists():
            return
        try:
            data = json.loads(self._path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"route table {self._path} is corrupt: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"route table {self._path} is not a JSON object")
        self._routes = {str(k): str(v) for k, v in data.items()}

    def get(self, topic: str) -> str | None:
        return self._routes.get(topic)

    def knows(self, topics: list[str], address: str) -> bool:
        """True when ``learn(topics, address)`` would change nothing (the usual case)."""
        return not address or all(self._routes.get(t) == address for t in topics)

    async def learn(self, topics: list[str], address: str) -> None:
        """Remember that ``topics`` are served at ``address``; durable before returning."""
        if self.knows(topics, address):
            return
        async with self._lock:
            changed = {t: address for t in topics if self._routes.get(t) != address}
            if not changed:
                return
            updated = {**self._routes, **changed}
            await asyncio.to_thread(write_atomically, self._path, json.dumps(updated, sort_keys=True))
            self._routes = updated
