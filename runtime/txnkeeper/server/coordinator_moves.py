"""Moving a coordinator id between coordinator pods (docs/contracts.md §12): the admin verbs' work on
one pod (fence, files, receive, unfence, discard, release, list), and what the pod does when its
placement record changes.

Why a coordinator id can move whole: everything a coordinator is lives in files of its own, its
transaction log's ledger directory, its log snapshot and its TxnID reservation (``{c}.sequence``); the
only shared file is the pod's route table (``routes.json``, topic -> store address), whose rows are
exported with the id (``{c}.routes-export``, the same checksummed format) and added to the target's
table, where it has no row of its own for a topic (a stale row is corrected by the store's redirect).
The source closes the coordinator before it hands the files over, so they do not change while they
are copied; the target opens it from them once its record names it owner: the replay resumes every
open transaction (its timeout and its end are the new owner's job) and every decided end.

Every verb is idempotent for the same move id and safe to repeat after either pod or the caller died:
the fenced/received markers are persisted with the pod's record (``server/placement_state.py``), and
a receive that did not reach "received" starts over from the source's still-fenced copy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from crc32c import crc32c

from txnkeeper import statefile
from txnkeeper.admin.https import AdminHttps
from txnkeeper.admin.views import AdminRefusal
from txnkeeper.contract.placement import Placement, PlacementError
from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.coordinator.routes import ROUTES_KIND, ROUTES_VERSION, RouteTable
from txnkeeper.coordinator.snapshot import snapshot_path
from txnkeeper.ledger.lock import LOCK_FILE
from txnkeeper.ledger.names import encode_name
from txnkeeper.protocol.rpc import ClientTls
from txnkeeper.server.placement_state import PlacementRefusal, PodPlacement
from txnkeeper.txnlog import transaction_log_name

log = logging.getLogger(__name__)

QUIESCE_SECONDS = 5.0  # how long a fence lets the ends in progress finish before closing the log
PULL_TIMEOUT = aiohttp.ClientTimeout(total=600, sock_connect=10, sock_read=60)
CHUNK = 1 << 20
RATE_WINDOW = 60.0  # seconds the txn/s of GET /admin/v1/coordinators is measured over
RATE_SAMPLE_EVERY = 5.0
MANIFEST_KIND = "coordinator-move-manifest"
MANIFEST_VERSION = 1
_MANIFEST_REMEDY = (
    "the move cannot go on from this source: roll it back (POST .../discard on the target, .../unfence "
    "here), which removes the file, and move the coordinator id again"
)


class CoordinatorHost(Protocol):
    """What the moves need of the pod: its open coordinators, opening and closing one, its routes."""

    coordinators: dict[int, TransactionCoordinator]

    @property
    def route_table(self) -> RouteTable: ...

    async def open_coordinator(self, coordinator_id: int) -> None: ...

    async def close_coordinator(self, coordinator_id: int, quiesce: float) -> None: ...


def _crc32c_of(path: Path) -> tuple[int, int]:
    crc = 0
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            crc = crc32c(chunk, crc)
            size += len(chunk)
    return size, crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CoordinatorMoves:
    """The move verbs for the coordinator ids of one pod, and its reaction to record changes."""

    def __init__(
        self,
        host: CoordinatorHost,
        placement: PodPlacement,
        data_dir: Path,
        token: str | None,
        *,
        tls: ClientTls | None = None,
    ) -> None:
        """``tls``: the pod's own certificate and CA bundle, presented and checked when a receive
        pulls from an https:// source (mutual TLS, re-read on rotation: admin/https.py)."""
        self._host = host
        self.placement = placement
        self._data = data_dir
        self._state = data_dir / "coordinator"
        self._token = token
        self._https = AdminHttps(tls)
        self._locks: dict[int, asyncio.Lock] = {}
        self._rates: dict[int, deque[tuple[float, int]]] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._opening: set[asyncio.Task[None]] = set()

    # --- which ids this pod opens -------------------------------------------------------------------
    def ids_to_open(self) -> list[int]:
        """The ids this pod serves by its record: owned, not fenced, and held (received, or files
        on disk, or the resource's first record, whose ids start empty)."""
        record = self.placement.record
        ids = []
        for c in self.placement.record.shards_of(self.placement.ordinal):
            marker = self.placement.markers.get(c)
            if marker is not None and marker.state == "fenced":
                continue
            if self._installing(c).exists():
                log.error(
                    "coordinator %d: this pod holds a half-installed copy (a receive that did not "
                    "finish): not opened; receive it again (POST /admin/v1/coordinators/%d/receive)",
                    c,
                    c,
                )
                continue
            if marker is not None or record.epoch == 1 or self._holds(c):
                ids.append(c)
            else:
                log.error(
                    "placement epoch %d names this pod owner of coordinator %d, but it holds no copy of "
                    "it: not opened (receive it with POST /admin/v1/coordinators/%d/receive)",
                    record.epoch,
                    c,
                    c,
                )
        return ids

    async def opened(self, coordinator_id: int) -> None:
        """After the pod opened ``coordinator_id`` as owner: a "received" marker has done its job."""
        marker = self.placement.markers.get(coordinator_id)
        if marker is not None and marker.state == "received":
            self.placement.clear(coordinator_id, marker.move)
            self._export_path(coordinator_id).unlink(missing_ok=True)

    def record_changed(self, record: Placement) -> None:
        """The pod took a new record: open the ids it now owns and holds, close those it no longer
        owns (a record written without a fence: they are refused from now on)."""
        task = asyncio.get_running_loop().create_task(self._follow_record())
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _follow_record(self) -> None:
        owned = set(self.ids_to_open())
        for c in sorted(owned - set(self._host.coordinators)):
            async with self._lock(c):
                if c in self._host.coordinators or c not in set(self.ids_to_open()):
                    continue
                try:
                    await self._host.open_coordinator(c)
                    await self.opened(c)
                except Exception:
                    log.exception("opening coordinator %d after a placement change failed", c)
        for c in sorted(set(self._host.coordinators) - owned):
            async with self._lock(c):
                if c in self._host.coordinators and c not in set(self.ids_to_open()):
                    log.warning("placement names another owner of coordinator %d: closing it here", c)
                    await self._host.close_coordinator(c, QUIESCE_SECONDS)

    # --- the verbs ----------------------------------------------------------------------------------
    def _refuse_unless_owner(self, c: int, what_then: str) -> None:
        """409 unless the record makes this pod the owner of ``c`` (``what_then`` ends the message)."""
        record = self.placement.record
        if record.owner_of(c) != self.placement.ordinal:
            raise AdminRefusal(
                409,
                f"coordinator {c} is owned by pod {record.owner_of(c)} per placement epoch "
                f"{record.epoch}{what_then}",
            )

    async def fence(self, c: int, move: str) -> dict[str, Any]:
        self._check_id(c)
        async with self._lock(c):
            self._refuse_unless_owner(c, ", not this pod: fence it on its owner")
            self._mark(c, move, "fenced")
            if c in self._host.coordinators:
                await self._host.close_coordinator(c, QUIESCE_SECONDS)
            export = self._export_path(c)
            if not export.exists():
                rows = self._host.route_table.rows()
                await asyncio.to_thread(
                    statefile.write, export, ROUTES_KIND, ROUTES_VERSION, {"routes": rows}
                )
            return await asyncio.to_thread(self._fenced_manifest, c, move)

    def manifest(self, c: int, move: str) -> dict[str, Any]:
        """The fence's answer again (GET .../files?move=ID without a path): only while fenced for it."""
        self._check_id(c)
        self._require_fenced(c, move)
        return self._fenced_manifest(c, move)

    def file(self, c: int, move: str, path: str) -> Path:
        self._check_id(c)
        self._require_fenced(c, move)
        if path not in {f["path"] for f in self._fenced_manifest(c, move)["files"]}:
            raise AdminRefusal(404, f"{path!r} is not a file of coordinator {c}'s move {move!r}")
        return self._data / path

    async def receive(self, c: int, move: str, source: str) -> dict[str, Any]:
        self._check_id(c)
        if not source.startswith(("http://", "https://")):
            raise AdminRefusal(
                400,
                f"source must be the source pod's admin URL (http://host:port or https://host:port),"
                f" not {source!r}",
            )
        async with self._lock(c):
            record = self.placement.record
            if record.owner_of(c) == self.placement.ordinal:
                raise AdminRefusal(409, f"this pod owns coordinator {c} (placement epoch {record.epoch})")
            held = self.placement.markers.get(c)
            if held is not None and held.move == move and held.state == "received":
                await asyncio.to_thread(self._installing(c).unlink, True)  # a crash right after marking
                return self._held_summary(c)
            if held is not None:
                raise _other_move(c, held.state, held.move, move)
            summary = await self._pull(c, move, source.rstrip("/"))
            self._mark(c, move, "received")
            await asyncio.to_thread(self._installing(c).unlink, True)
            return summary

    async def unfence(self, c: int, move: str) -> dict[str, Any]:
        self._check_id(c)
        async with self._lock(c):
            self._refuse_unless_owner(c, ": the move is done, release it instead")
            self._clear(c, move)
            self._forget_move(c)
            if c not in self._host.coordinators:
                await self._host.open_coordinator(c)
            return {"coordinator": c, "move": move, "state": "serving"}

    async def discard(self, c: int, move: str) -> dict[str, Any]:
        self._check_id(c)
        async with self._lock(c):
            record = self.placement.record
            if record.owner_of(c) == self.placement.ordinal:
                raise AdminRefusal(409, f"this pod owns coordinator {c} (placement epoch {record.epoch})")
            held = self.placement.markers.get(c)
            if held is not None and held.move != move:
                raise _other_move(c, held.state, held.move, move)
            await asyncio.to_thread(self._delete_copy, c)
            self._clear(c, move)
            return {"coordinator": c, "move": move, "state": "discarded"}

    async def release(self, c: int, move: str) -> dict[str, Any]:
        self._check_id(c)
        async with self._lock(c):
            record = self.placement.record
            if record.owner_of(c) == self.placement.ordinal:
                raise AdminRefusal(
                    409,
                    f"this pod still owns coordinator {c} (placement epoch {record.epoch}): release only "
                    "once the record names the new owner (PUT /admin/v1/placement)",
                )
            held = self.placement.markers.get(c)
            if held is not None and held.move != move:
                raise _other_move(c, held.state, held.move, move)
            if c in self._host.coordinators:
                await self._host.close_coordinator(c, QUIESCE_SECONDS)
            await asyncio.to_thread(self._delete_copy, c)
            self._clear(c, move)
            return {"coordinator": c, "move": move, "state": "released"}

    def placement_json(self) -> dict[str, Any]:
        return self.placement.to_json()

    def put_placement(self, raw: object) -> dict[str, Any]:
        """Take a record from the placement writer (PUT /admin/v1/placement on a coordinator pod)."""
        try:
            record = Placement.from_json(raw, "body")
        except PlacementError as exc:
            raise AdminRefusal(400, str(exc)) from exc
        try:
            changed = self.placement.put(record)
        except PlacementRefusal as exc:
            raise AdminRefusal(exc.status, str(exc)) from exc
        return {"epoch": self.placement.record.epoch, "changed": changed}

    def listing(self) -> dict[str, Any]:
        record = self.placement.record
        now = time.monotonic()
        rows = []
        for c, owner in enumerate(record.owners):
            coordinator = self._host.coordinators.get(c)
            marker = self.placement.markers.get(c)
            state: str
            if marker is not None:
                state = marker.state
            elif coordinator is not None:
                state = "serving"
            else:
                state = "elsewhere" if owner != self.placement.ordinal else "closed"
            row: dict[str, Any] = {"coordinator": c, "owner": owner, "state": state}
            if marker is not None:
                row["move"] = marker.move
            if coordinator is not None:
                row["openTxns"] = coordinator.ongoing_count
                row["txnPerSecond"] = self._rate(c, coordinator, now)
            rows.append(row)
        return {"epoch": record.epoch, "ordinal": self.placement.ordinal, "coordinators": rows}

    # --- rates --------------------------------------------------------------------------------------
    def start_sampling(self) -> None:
        self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())

    async def close(self) -> None:
        for task in [*self._opening, *([self._sampler] if self._sampler else [])]:
            task.cancel()
        await asyncio.gather(
            *self._opening, *([self._sampler] if self._sampler else []), return_exceptions=True
        )

    async def _sample_forever(self) -> None:
        while True:
            now = time.monotonic()
            for c, coordinator in list(self._host.coordinators.items()):
                self._rate(c, coordinator, now)
            await asyncio.sleep(RATE_SAMPLE_EVERY)

    def _rate(self, c: int, coordinator: TransactionCoordinator, now: float) -> float:
        """Transactions begun per second over the last minute (from samples of the begun count)."""
        samples = self._rates.setdefault(c, deque())
        samples.append((now, coordinator.created_count))
        while len(samples) > 1 and now - samples[0][0] > RATE_WINDOW:
            samples.popleft()
        first_at, first = samples[0]
        span = now - first_at
        return round((coordinator.created_count - first) / span, 3) if span > 0 else 0.0

    # --- files --------------------------------------------------------------------------------------
    def _ledger_dir(self, c: int) -> Path:
        return self._data / "ledgers" / encode_name(transaction_log_name(c))

    def _export_path(self, c: int) -> Path:
        return self._state / f"{c}.routes-export"

    def _singles(self, c: int) -> list[Path]:
        state = self._state
        return [snapshot_path(state, c), state / f"{c}.sequence", self._export_path(c)]

    def _forget_move(self, c: int) -> None:
        """The source's own records of a move: the exported routes and the fence's manifest."""
        self._export_path(c).unlink(missing_ok=True)
        self._manifest_path(c).unlink(missing_ok=True)

    def _holds(self, c: int) -> bool:
        return self._ledger_dir(c).is_dir()

    def _paths(self, c: int) -> list[str]:
        """The move's files, relative to the data directory, in a stable order."""
        found: list[Path] = []
        ledger = self._ledger_dir(c)
        if ledger.is_dir():
            found += sorted(
                p
                for p in ledger.rglob("*")
                if p.is_file() and p.name != LOCK_FILE and not p.name.endswith(".tmp")
            )
        found += [p for p in self._singles(c) if p.is_file()]
        return [str(p.relative_to(self._data)) for p in found]

    def _is_file_of(self, c: int, rel: str) -> bool:
        """Whether ``rel`` is where a file of coordinator ``c`` lives (a received manifest names
        nothing else: no other coordinator's, no pod-wide file)."""
        path = self._data / rel
        singles = self._singles(c)
        return path in singles or (
            self._ledger_dir(c) in path.parents and path.name != LOCK_FILE and not path.name.endswith(".tmp")
        )

    def _manifest_path(self, c: int) -> Path:
        return self._state / f"{c}.move-manifest"

    def _fenced_manifest(self, c: int, move: str) -> dict[str, Any]:
        """The manifest as the fence computed it, kept beside the files (a checksummed state file):
        a repeated fence answers the same, and a file that changes on the source's disk afterwards is
        caught by the target's check instead of being copied with a fresh checksum."""
        path = self._manifest_path(c)
        doc = statefile.read(path, MANIFEST_KIND, frozenset({MANIFEST_VERSION}), remedy=_MANIFEST_REMEDY)
        if doc is not None:
            body = statefile.obj(doc.body, "move manifest")
            if body.get("move") == move:
                return body
        manifest = self._manifest(c, move)
        statefile.write(path, MANIFEST_KIND, MANIFEST_VERSION, manifest)
        return manifest

    def _manifest(self, c: int, move: str) -> dict[str, Any]:
        files = []
        for rel in self._paths(c):
            size, crc = _crc32c_of(self._data / rel)
            files.append({"path": rel, "size": size, "crc32c": crc})
        return {
            "coordinator": c,
            "move": move,
            "epoch": self.placement.record.epoch,
            "files": files,
            "bytes": sum(f["size"] for f in files),
        }

    def _held_summary(self, c: int) -> dict[str, Any]:
        paths = self._paths(c)
        return {"files": len(paths), "bytes": sum((self._data / p).stat().st_size for p in paths)}

    def _delete_copy(self, c: int) -> None:
        self._forget_move(c)
        shutil.rmtree(self._ledger_dir(c), ignore_errors=True)
        shutil.rmtree(self._staging(c), ignore_errors=True)
        for path in self._singles(c):
            path.unlink(missing_ok=True)
        self._installing(c).unlink(missing_ok=True)
        for directory in (self._data / "ledgers", self._state):
            if directory.is_dir():
                _fsync_dir(directory)

    def _installing(self, c: int) -> Path:
        """Present from the start of an install until "received" is persisted: a copy it marks is
        never opened (the files may be half replaced)."""
        return self._state / f"{c}.installing"

    def _staging(self, c: int) -> Path:
        return self._state / f"receiving-{c}"

    async def _pull(self, c: int, move: str, source: str) -> dict[str, Any]:
        """Fetch the manifest and every file into staging, check each, then install them."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        base = f"{source}/admin/v1/coordinators/{c}/files"
        staging = self._staging(c)
        await asyncio.to_thread(shutil.rmtree, staging, True)
        try:
            async with aiohttp.ClientSession(timeout=PULL_TIMEOUT, headers=headers) as session:
                files = await self._source_manifest(session, c, move, source)
                for entry in files:
                    await self._fetch(session, base, move, entry, staging)
        except aiohttp.ClientError as exc:
            why = await self._https.explain(exc, base)
            raise AdminRefusal(
                502, f"pulling coordinator {c} from {source} failed ({why}); nothing was installed: retry"
            ) from exc
        await asyncio.to_thread(self._install, c, [e["path"] for e in files], staging)
        export = self._export_path(c)
        if export.is_file():
            table = RouteTable(export)
            await asyncio.to_thread(table.load)
            await self._host.route_table.add_missing(table.rows())
        return {"files": len(files), "bytes": sum(e["size"] for e in files)}

    async def _source_manifest(
        self, session: aiohttp.ClientSession, c: int, move: str, source: str
    ) -> list[dict[str, Any]]:
        base = f"{source}/admin/v1/coordinators/{c}/files"
        async with session.get(base, params={"move": move}, ssl=self._https.ssl_for(base)) as response:
            if response.status != 200:
                text = await response.text()
                raise AdminRefusal(502, f"{source} refused the manifest ({response.status}: {text})")
            manifest = await response.json()
        files = _checked_manifest(manifest, c, move, source)
        for entry in files:
            if not self._is_file_of(c, entry["path"]):
                raise AdminRefusal(
                    502, f"the source's manifest names {entry['path']!r}, not a file of coordinator {c}"
                )
        return files

    async def _fetch(
        self, session: aiohttp.ClientSession, base: str, move: str, entry: dict[str, Any], staging: Path
    ) -> None:
        rel = entry["path"]
        target = staging / rel
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        crc = 0
        size = 0
        params = {"move": move, "path": rel}
        async with session.get(base, params=params, ssl=self._https.ssl_for(base)) as response:
            if response.status != 200:
                raise AdminRefusal(
                    502, f"the source refused {rel} ({response.status}: {await response.text()})"
                )
            with target.open("wb") as out:
                async for chunk in response.content.iter_chunked(CHUNK):
                    crc = crc32c(chunk, crc)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        if size != entry["size"] or crc != entry["crc32c"]:
            raise AdminRefusal(
                502,
                f"{rel} arrived damaged: {size} bytes with crc32c {crc}, the source's manifest says "
                f"{entry['size']} bytes with crc32c {entry['crc32c']}; nothing was installed: receive again",
            )

    def _install(self, c: int, paths: list[str], staging: Path) -> None:
        """Replace whatever this pod holds of ``c`` (a leftover of an unfinished receive: it does not
        own ``c``) by the checked staged copy."""
        sentinel = self._installing(c)
        sentinel.write_bytes(b"")
        _fsync_dir(sentinel.parent)
        shutil.rmtree(self._ledger_dir(c), ignore_errors=True)
        for path in self._singles(c):
            path.unlink(missing_ok=True)
        touched: set[Path] = set()
        for rel in paths:
            destination = self._data / rel
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, destination)
            touched.add(destination.parent)
        for directory in sorted(touched, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(directory)
        _fsync_dir(self._data / "ledgers")
        shutil.rmtree(staging, ignore_errors=True)

    # --- markers ------------------------------------------------------------------------------------
    def _lock(self, c: int) -> asyncio.Lock:
        return self._locks.setdefault(c, asyncio.Lock())

    def _check_id(self, c: int) -> None:
        count = self.placement.record.shards
        if not 0 <= c < count:
            raise AdminRefusal(404, f"coordinator {c} does not exist: this resource has ids 0..{count - 1}")

    def _require_fenced(self, c: int, move: str) -> None:
        held = self.placement.markers.get(c)
        if held is None or held.state != "fenced" or held.move != move:
            now = f"{held.state} for move {held.move!r}" if held else "not fenced"
            raise AdminRefusal(
                409, f"coordinator {c} is {now}: its files are served only while fenced for {move!r}"
            )

    def _mark(self, c: int, move: str, state: str) -> None:
        try:
            self.placement.mark(c, move, state)  # type: ignore[arg-type]
        except PlacementRefusal as exc:
            raise AdminRefusal(exc.status, str(exc)) from exc

    def _clear(self, c: int, move: str) -> None:
        try:
            self.placement.clear(c, move)
        except PlacementRefusal as exc:
            raise AdminRefusal(exc.status, str(exc)) from exc


def _other_move(c: int, state: str, held: str, move: str) -> AdminRefusal:
    return AdminRefusal(
        409, f"coordinator {c} is {state} for move {held!r}, not {move!r}: finish or roll back that one"
    )


def _checked_manifest(manifest: object, c: int, move: str, source: str) -> list[dict[str, Any]]:
    """The manifest's file entries, each checked (a path inside the data directory, sizes, crcs)."""
    where = f"the manifest of coordinator {c} from {source}"
    if not isinstance(manifest, dict) or manifest.get("coordinator") != c or manifest.get("move") != move:
        raise AdminRefusal(502, f"{where} is not for coordinator {c}, move {move!r}: {str(manifest)[:200]}")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise AdminRefusal(502, f"{where} has no file list")
    checked = []
    for entry in files:
        if not isinstance(entry, dict):
            raise AdminRefusal(502, f"{where}: a file entry is not an object")
        rel, size, crc = entry.get("path"), entry.get("size"), entry.get("crc32c")
        if (
            not isinstance(rel, str)
            or not rel
            or rel.startswith("/")
            or ".." in Path(rel).parts
            or not isinstance(size, int)
            or not isinstance(crc, int)
        ):
            raise AdminRefusal(
                502, f"{where}: file entry {str(entry)[:200]} is not a relative path, size, crc32c"
            )
        checked.append({"path": rel, "size": size, "crc32c": crc})
    return checked
