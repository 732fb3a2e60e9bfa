"""Moving one store shard (or one coordinator id) between two pods by the §12 admin verbs
(docs/contracts.md §12), and Pulsar's "unload" (fence + unfence: the shard's clients reconnect), as one
async function each: what ``txnkeeper admin shards move|unload`` and ``txnkeeper admin coordinators
move`` run. Against pods that serve TLS the URLs are https://: the caller's CA file verifies them and
its client certificate is presented; the target pulls from the source with its own certificate.

Why a module of its own: the order of the steps is the protocol (fence, receive, the new record to the
target first and the source second, release), every step is idempotent for its move id, and a caller
that stopped anywhere resumes by calling again with the same id. Where the placement record lives
durably is the caller's (``publish``: the fleet's file; in Kubernetes the operator is the only writer and
moves shards itself, so this is not run against an operator-managed resource).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from txnkeeper.admin.https import AdminHttps
from txnkeeper.contract.admin import COORDINATOR_ROUTE, SHARD_ROUTE, UnitRoute
from txnkeeper.contract.placement import Placement, PlacementError, shard_of
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.protocol.rpc import StaticClientTls

Publish = Callable[[Placement], Awaitable[None]]
STEP_TIMEOUT_S = 600.0


class MoveError(Exception):
    """A step failed: ``step`` names it, the message says what the pod answered."""

    def __init__(self, step: str, message: str, status: int = 0) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message
        self.status = status


@dataclass
class MoveReport:
    shard: int  # the unit moved: a shard, or a coordinator id (``id_key`` says which)
    move: str
    source: int
    target: int
    epoch: int = 0
    files: int = 0
    bytes: int = 0
    topics: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    rolled_back: bool = False
    precopy_files: int = 0
    precopy_bytes: int = 0
    pulled_bytes: int = 0  # pulled between fence and switch (the rest was pre-copied)
    pause_s: float = 0.0  # from the fence's call to the target's new record
    precopy_s: float = 0.0  # from the move's start to the fence's call
    id_key: str = "shard"

    def to_json(self) -> dict[str, Any]:
        return {
            self.id_key: self.shard,
            "move": self.move,
            "from": self.source,
            "to": self.target,
            "epoch": self.epoch,
            "files": self.files,
            "bytes": self.bytes,
            "topics": self.topics,
            "steps": self.steps,
            "rolledBack": self.rolled_back,
            "precopyFiles": self.precopy_files,
            "precopyBytes": self.precopy_bytes,
            "pulledBytes": self.pulled_bytes,
            "pauseSeconds": round(self.pause_s, 3),
            "precopySeconds": round(self.precopy_s, 3),
        }


class _Pods:
    """The admin calls of a move, with the token every mutating call carries."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        token: str | None,
        tls: TlsClientSettings | None = None,
        route: UnitRoute = SHARD_ROUTE,
    ) -> None:
        self._http = http
        self.route = route
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._https = AdminHttps(StaticClientTls(tls) if tls is not None else None)

    async def call(self, step: str, method: str, url: str, body: Any = None) -> Any:
        try:
            async with self._http.request(
                method, url, json=body, headers=self._headers, ssl=self._https.ssl_for(url)
            ) as response:
                text = await response.text()
                if response.status != 200:
                    raise MoveError(
                        step, f"{url} answered HTTP {response.status}: {text[:1000]}", response.status
                    )
        except aiohttp.ClientError as exc:
            raise MoveError(step, f"{url} cannot be reached: {await self._https.explain(exc, url)}") from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise MoveError(step, f"{url} answered something that is not JSON") from exc

    async def placement(self, base: str) -> Placement:
        doc = await self.call("placement", "GET", f"{base}/admin/v1/placement")
        try:
            return Placement.from_json(doc.get("record", doc) if isinstance(doc, dict) else doc, base)
        except PlacementError as exc:
            raise MoveError("placement", str(exc)) from exc

    async def ordinal(self, base: str) -> int:
        path = self.route.path
        doc = await self.call(path, "GET", f"{base}/admin/v1/{path}")
        if not isinstance(doc, dict) or not isinstance(doc.get("ordinal"), int):
            raise MoveError(path, f"{base}/admin/v1/{path} names no pod ordinal")
        return int(doc["ordinal"])

    async def verb(self, base: str, unit: int, verb: str, body: dict[str, Any]) -> Any:
        return await self.call(verb, "POST", f"{base}/admin/v1/{self.route.path}/{unit}/{verb}", body)


async def move_shard(shard: int, source: str, target: str, **options: Any) -> MoveReport:
    """Move store shard ``shard`` (``move_unit`` with the shard verbs)."""
    return await move_unit(SHARD_ROUTE, shard, source, target, **options)


async def move_coordinator(coordinator: int, source: str, target: str, **options: Any) -> MoveReport:
    """Move coordinator id ``coordinator`` between coordinator pods that place their ids by a record
    (``--coordinator-ids auto``), with its open transactions (``move_unit`` with the coordinator verbs)."""
    return await move_unit(COORDINATOR_ROUTE, coordinator, source, target, **options)


async def move_unit(
    route: UnitRoute,
    shard: int,
    source: str,
    target: str,
    *,
    token: str | None,
    others: Sequence[str] = (),
    move: str | None = None,
    publish: Publish | None = None,
    roll_back: bool = True,
    precopy: bool = True,
    precopy_bytes_per_second: int | None = None,
    tls: TlsClientSettings | None = None,
) -> MoveReport:
    """Move ``shard`` (a shard or coordinator id, by ``route``) from the pod at admin URL ``source`` to
    the pod at ``target`` (§12 steps 1-5);
    ``others``: every other pod of the resource (they take the new record last). ``move``: the id to
    use (give the one of an interrupted move to resume it). ``publish`` stores the new record where
    the resource keeps it, before any pod is given it. ``precopy`` (shards only): the target first
    copies the shard's closed files while the source serves (§12 "Pre-copy"), so the fence waits only
    for what changed since; ``precopy_bytes_per_second`` bounds that copy. A failure before the new
    record is written is rolled back (discard on the target, unfence on the source) unless
    ``roll_back`` is False; after it, the move can only go forward: call again with the same id.
    ``tls``: https:// pods are verified against its CA file and given its client certificate (the pods
    pull from each other with their own certificates)."""
    what = route.id_key
    move = move or f"{what}-{shard}-{uuid.uuid4().hex[:12]}"
    source, target = source.rstrip("/"), target.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, token, tls, route)
        record = await pods.placement(source)
        source_ordinal, target_ordinal = await pods.ordinal(source), await pods.ordinal(target)
        if source_ordinal == target_ordinal:
            raise MoveError("check", f"source and target are the same pod ({source_ordinal})")
        report = MoveReport(shard, move, source_ordinal, target_ordinal, id_key=what)
        owner = record.owner_of(shard)
        if owner == source_ordinal and record.member(target_ordinal) is None:
            # Clients are redirected to the address the record gives the new owner: without one they
            # could only wait until their operations time out.
            raise MoveError(
                "check",
                f"the placement record (epoch {record.epoch}) gives no address for pod {target_ordinal}, "
                f"so clients could not follow the {what} there: PUT a record with members first (start "
                "the store pods with --pulsar-urls, or let the operator place them)",
            )
        fenced_at = began = time.monotonic()
        if owner == source_ordinal:
            try:
                if precopy and route is SHARD_ROUTE:
                    body: dict[str, Any] = {"move": move, "source": source}
                    if precopy_bytes_per_second:
                        body["maxBytesPerSecond"] = precopy_bytes_per_second
                    copied = await pods.verb(target, shard, "precopy", body)
                    report.steps.append("precopy")
                    report.precopy_files, report.precopy_bytes = int(copied["files"]), int(copied["bytes"])
                fenced_at = time.monotonic()
                report.precopy_s = fenced_at - began
                manifest = await pods.verb(source, shard, "fence", {"move": move})
                report.steps.append("fence")
                report.topics = list(manifest.get("topics", []))
                receipt = await pods.verb(target, shard, "receive", {"move": move, "source": source})
                report.steps.append("receive")
                report.files, report.bytes = int(receipt["files"]), int(receipt["bytes"])
                report.pulled_bytes = int(receipt.get("pulledBytes", receipt["bytes"]))
            except MoveError as exc:
                if roll_back:
                    await _roll_back(pods, report, source, target)
                if report.rolled_back:
                    raise MoveError(
                        exc.step,
                        f"{exc.message}; rolled back (discarded on the target, unfenced on the source,"
                        " which serves it again)",
                        exc.status,
                    ) from exc
                raise
            record = record.with_owner(shard, target_ordinal)
            if publish is not None:
                await publish(record)
        elif owner != target_ordinal:
            raise MoveError(
                "check", f"{what} {shard} is owned by pod {owner} (epoch {record.epoch}), not by the source"
            )
        # The flip (again, when resuming): the target first, so the shard is never without a server
        # longer than between two calls; then the source, then everyone else.
        for base in (target, source, *others):
            await pods.call("placement", "PUT", f"{base.rstrip('/')}/admin/v1/placement", record.to_json())
            if base == target and owner == source_ordinal:
                report.pause_s = time.monotonic() - fenced_at
        report.steps.append("placement")
        report.epoch = record.epoch
        await pods.verb(source, shard, "release", {"move": move})
        report.steps.append("release")
        return report


async def _roll_back(pods: _Pods, report: MoveReport, source: str, target: str) -> None:
    """Undo a move that did not reach its new record; a step that fails here leaves the move as it
    is (repeat it with the same id, or roll back by hand: discard on the target, unfence on the source)."""
    try:
        await pods.verb(target, report.shard, "discard", {"move": report.move})
        await pods.verb(source, report.shard, "unfence", {"move": report.move})
    except MoveError:
        return
    report.rolled_back = True


async def unload(
    admin_url: str, topic: str, *, token: str | None, tls: TlsClientSettings | None = None
) -> dict[str, Any]:
    """Pulsar's ``topics unload``: fence and unfence the shard of ``topic`` on its owner, so every
    client of the shard's topics reconnects (and the topics are reopened from disk)."""
    base = admin_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, token, tls)
        record = await pods.placement(base)
        shard = shard_of(topic, record.shards)
        move = f"unload-{uuid.uuid4().hex[:12]}"
        manifest = await pods.verb(base, shard, "fence", {"move": move})
        await pods.verb(base, shard, "unfence", {"move": move})
        return {"shard": shard, "topics": manifest.get("topics", []), "unloaded": True}


async def list_shards(
    admin_urls: Sequence[str], *, tls: TlsClientSettings | None = None, route: UnitRoute = SHARD_ROUTE
) -> list[dict[str, Any]]:
    """``GET /admin/v1/shards`` (``/admin/v1/coordinators`` by ``route``) of each pod, with the URL it
    came from."""
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, None, tls, route)
        out = []
        for url in admin_urls:
            doc = await pods.call(route.path, "GET", f"{url.rstrip('/')}/admin/v1/{route.path}")
            out.append({"url": url, **(doc if isinstance(doc, dict) else {})})
        return out
