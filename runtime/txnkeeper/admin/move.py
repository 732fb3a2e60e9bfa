"""Moving one store shard between two pods by the §12 admin verbs (docs/contracts.md §12), and Pulsar's
"unload" (fence + unfence: the shard's clients reconnect), as one async function each: what
``txnkeeper admin shards move|unload`` runs, and what the local fleet's driver calls.

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

from txnkeeper.contract.placement import Placement, PlacementError, shard_of

Publish = Callable[[Placement], Awaitable[None]]
STEP_TIMEOUT_S = 600.0


class MoveError(Exception):
    """A step failed: ``step`` names it, the message says what the pod answered."""

    def __init__(self, step: str, message: str, status: int = 0) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.status = status


@dataclass
class MoveReport:
    shard: int
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

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
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

    def __init__(self, http: aiohttp.ClientSession, token: str | None) -> None:
        self._http = http
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call(self, step: str, method: str, url: str, body: Any = None) -> Any:
        try:
            async with self._http.request(method, url, json=body, headers=self._headers) as response:
                text = await response.text()
                if response.status != 200:
                    raise MoveError(
                        step, f"{url} answered HTTP {response.status}: {text[:1000]}", response.status
                    )
        except aiohttp.ClientError as exc:
            raise MoveError(step, f"{url} cannot be reached: {exc}") from exc
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
        doc = await self.call("shards", "GET", f"{base}/admin/v1/shards")
        if not isinstance(doc, dict) or not isinstance(doc.get("ordinal"), int):
            raise MoveError("shards", f"{base}/admin/v1/shards names no pod ordinal")
        return int(doc["ordinal"])

    async def verb(self, base: str, shard: int, verb: str, body: dict[str, Any]) -> Any:
        return await self.call(verb, "POST", f"{base}/admin/v1/shards/{shard}/{verb}", body)


async def move_shard(
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
) -> MoveReport:
    """Move ``shard`` from the pod at admin URL ``source`` to the pod at ``target`` (§12 steps 1-5);
    ``others``: every other pod of the resource (they take the new record last). ``move``: the id to
    use (give the one of an interrupted move to resume it). ``publish`` stores the new record where
    the resource keeps it, before any pod is given it. ``precopy``: the target first copies the
    shard's closed files while the source serves (§12 "Pre-copy"), so the fence waits only for what
    changed since; ``precopy_bytes_per_second`` bounds that copy. A failure before the new record
    is written is rolled back (discard on the target, unfence on the source) unless ``roll_back`` is
    False; after it, the move can only go forward: call again with the same id."""
    move = move or f"shard-{shard}-{uuid.uuid4().hex[:12]}"
    source, target = source.rstrip("/"), target.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, token)
        record = await pods.placement(source)
        source_ordinal, target_ordinal = await pods.ordinal(source), await pods.ordinal(target)
        if source_ordinal == target_ordinal:
            raise MoveError("check", f"source and target are the same pod ({source_ordinal})")
        report = MoveReport(shard, move, source_ordinal, target_ordinal)
        owner = record.owner_of(shard)
        if owner == source_ordinal and record.member(target_ordinal) is None:
            # Clients are redirected to the address the record gives the new owner: without one they
            # could only wait until their operations time out.
            raise MoveError(
                "check",
                f"the placement record (epoch {record.epoch}) gives no address for pod {target_ordinal}, "
                "so clients could not follow the shard there: PUT a record with members first (start "
                "the store pods with --pulsar-urls, or let the operator place them)",
            )
        fenced_at = began = time.monotonic()
        if owner == source_ordinal:
            try:
                if precopy:
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
            except MoveError:
                if roll_back:
                    await _roll_back(pods, report, source, target)
                raise
            record = record.with_owner(shard, target_ordinal)
            if publish is not None:
                await publish(record)
        elif owner != target_ordinal:
            raise MoveError(
                "check", f"shard {shard} is owned by pod {owner} (epoch {record.epoch}), not by the source"
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


async def unload(admin_url: str, topic: str, *, token: str | None) -> dict[str, Any]:
    """Pulsar's ``topics unload``: fence and unfence the shard of ``topic`` on its owner, so every
    client of the shard's topics reconnects (and the topics are reopened from disk)."""
    base = admin_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, token)
        record = await pods.placement(base)
        shard = shard_of(topic, record.shards)
        move = f"unload-{uuid.uuid4().hex[:12]}"
        manifest = await pods.verb(base, shard, "fence", {"move": move})
        await pods.verb(base, shard, "unfence", {"move": move})
        return {"shard": shard, "topics": manifest.get("topics", []), "unloaded": True}


async def list_shards(admin_urls: Sequence[str]) -> list[dict[str, Any]]:
    """``GET /admin/v1/shards`` of each pod, with the URL it came from."""
    timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pods = _Pods(http, None)
        out = []
        for url in admin_urls:
            doc = await pods.call("shards", "GET", f"{url.rstrip('/')}/admin/v1/shards")
            out.append({"url": url, **(doc if isinstance(doc, dict) else {})})
        return out
