"""Where each topic is served, as clients told the coordinator, persisted for recovery.

Why the coordinator learns routes from clients: a store pod's address is whatever the client used to
reach it (a DNS name or a pod IP); recording it when a partition or subscription joins a transaction
lets the coordinator end that transaction there, also after a coordinator restart, without a
separate topology service. Changes are rare (first sight of a topic), so each is written durably, as a
checksummed state file (kind ``coordinator-routes``); the previous release's plain JSON object is still
read and is rewritten checksummed by the next change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError

ROUTES_KIND = "coordinator-routes"
ROUTES_VERSION = 1
_REMEDY = (
    "the coordinator does not start, since it could not end its transactions on the right store pods; "
    "restore the file from a backup (or, if it is lost, remove it: routes are learnt again from "
    "clients, but transactions recovered before a client names their topics again cannot be ended)"
)


class RouteTable:
    """topic -> store address, durable."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._routes: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Read the persisted routes (none if the file does not exist); StateFileError if damaged."""
        doc = statefile.read(
            self._path, ROUTES_KIND, frozenset({ROUTES_VERSION}), legacy=_legacy_body, remedy=_REMEDY
        )
        if doc is None:
            return
        try:
            self._routes = _routes(statefile.obj(doc.body, "routes", {"routes"})["routes"])
        except StateShapeError as exc:
            raise StateFileError(self._path, f"not a valid route table: {exc}", _REMEDY) from exc

    def get(self, topic: str) -> str | None:
        return self._routes.get(topic)

    def rows(self) -> dict[str, str]:
        """Every route (a copy): what a coordinator id moving to another pod takes along."""
        return dict(self._routes)

    async def add_missing(self, rows: dict[str, str]) -> None:
        """Add the routes of ``rows`` for topics this table has no row for (a coordinator id arriving
        from another pod: this pod's own row for a topic is as good, a stale one is corrected by the
        store's redirect); durable before returning."""
        async with self._lock:
            missing = {t: a for t, a in rows.items() if t not in self._routes}
            if not missing:
                return
            updated = {**self._routes, **missing}
            await asyncio.to_thread(
                statefile.write, self._path, ROUTES_KIND, ROUTES_VERSION, {"routes": updated}
            )
            self._routes = updated

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
            await asyncio.to_thread(
                statefile.write, self._path, ROUTES_KIND, ROUTES_VERSION, {"routes": updated}
            )
            self._routes = updated


def _legacy_body(raw: bytes) -> dict[str, Any]:
    """The previous release's routes.json: a plain JSON object, topic -> address."""
    return {"routes": _routes(statefile.parse_json(raw))}


def _routes(value: Any) -> dict[str, str]:
    table = statefile.obj(value, "route table")
    return {topic: statefile.string(addr, f"address of topic {topic!r}") for topic, addr in table.items()}
