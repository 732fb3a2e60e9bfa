"""A store pod's side of placement (docs/contracts.md §12): which topics it serves by its copy of the
placement record, and the move verbs that hand a shard to another pod (fence, files, receive, release,
discard, unfence) with its listing (``GET /admin/v1/shards``).

Why one module: serving and moving are judged by the same state (the record and the move markers of
``PodPlacement``), and every verb must be idempotent for its move id and safe after a crash of either
pod at any step, which only holds if the steps and their order live in one place:

- fence (source): marker persisted first, then the shard's topics are closed (in-flight writes finish,
  snapshots written, ledgers closed, clients told to reconnect), then the manifest is built from disk;
  after a restart the marker keeps the shard closed and a repeated fence builds the same manifest.
- receive (target): every file is pulled into ``moves-in/<move>/data``, checked (size, CRC32C), fsync'd;
  the install plan is written, then each ledger directory and snapshot is renamed into place and the
  shard's registry and policy rows are merged; the "received" marker is persisted last. A crash before
  it repeats the whole receive (installs replace what an earlier attempt left).
- release (source, only once its record names another owner) and discard (target, only while it does
  not own the shard) delete files first, rows second, the marker last.
A pod started without ``--replicas`` and never given a record (every pod before placement existed, the
local fleet, the benchmarks) has no placement and serves every topic, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from crc32c import crc32c

from txnkeeper import statefile
from txnkeeper.admin.https import AdminHttps
from txnkeeper.admin.views import AdminRefusal
from txnkeeper.contract.placement import Member, Placement, PlacementError, PlacementKind, shard_of
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.ledger.names import decode_name
from txnkeeper.pendingack import pending_ack_log_name
from txnkeeper.protocol.rpc import ClientTls
from txnkeeper.server import shard_files as sf
from txnkeeper.server import shard_precopy as pc
from txnkeeper.server import shard_tier as tier
from txnkeeper.server.offload_settings import OffloadSettingsError
from txnkeeper.server.offload_topics import TopicOffloads
from txnkeeper.server.placement_state import MoveMarker, PlacementRefusal, PodPlacement
from txnkeeper.server.topic_policies import TopicPolicyStore
from txnkeeper.topic.service import TopicService
from txnkeeper.topicnames import name_problem

log = logging.getLogger(__name__)

PLAN_FILE = "install-plan.json"
MANIFEST_FILE = "manifest.json"
RECEIPT_FILE = "receipt.json"
RATE_WINDOW_S = 60.0
RATE_SAMPLE_S = 15.0
FETCH_TIMEOUT_S = 300.0
# Pre-copy: a pass that pulled more than this is followed by another (ledgers closed meanwhile), at
# most PRECOPY_PASSES in all; the source rolls a shard's open ledger over when it holds more than
# ROLL_OVER_BYTES, so what is left for the fence is what was written since the last pass.
PRECOPY_PASSES = 3
PRECOPY_AGAIN_BYTES = 4 << 20
ROLL_OVER_BYTES = 1 << 20
SEGMENT_CLOSE_WAIT_S = 30.0
TopicsClosed = Callable[[set[str]], None]


class ShardMoves:
    """The store pod's placement: the gate every topic use passes, and the §12 move verbs."""

    def __init__(
        self,
        data_dir: Path,
        placement: PodPlacement | None,
        *,
        ordinal: int,
        factory: ManagedLedgerFactory,
        admin_token: str | None,
        tls: ClientTls | None = None,
    ) -> None:
        """``tls``: the pod's own certificate and CA bundle, presented and checked when a receive
        pulls from an https:// source (mutual TLS, re-read on rotation: admin/https.py)."""
        self.data_dir = data_dir
        self.placement = placement
        self.ordinal = ordinal
        self._factory = factory
        self._token = admin_token
        self._https = AdminHttps(tls)
        self._topics: TopicService | None = None
        self._offloads: TopicOffloads | None = None
        self._policies: TopicPolicyStore | None = None
        # Told the topics a fence (or a new record) closed: the protocol handlers close their clients.
        self.on_closed: list[TopicsClosed] = []
        self._lock = asyncio.Lock()  # one verb at a time: they read and change the same markers
        self.moves_out = 0
        self.moves_in = 0
        self._listed: dict[str, frozenset[str]] = {}  # the paths of each fenced move's manifest
        self._closed_listed: dict[str, frozenset[str]] = {}  # closed files listed for a pre-copy
        self._checksums = pc.ChecksumCache()
        self._move_locks: dict[str, asyncio.Lock] = {}  # a pre-copy against receive/discard of its move
        self._samples: deque[tuple[float, dict[int, tuple[int, int]]]] = deque()
        self._sampler: asyncio.Task[None] | None = None
        self._opening: set[asyncio.Task[None]] = set()  # received shards being opened after a flip

    # --- wiring -----------------------------------------------------------------------------------
    def attach(self, topics: TopicService, offloads: TopicOffloads, policies: TopicPolicyStore) -> None:
        self._topics = topics
        self._offloads = offloads
        self._policies = policies

    @property
    def attached(self) -> bool:
        return self._topics is not None

    def gate(self, topic: str) -> None:
        """Raise the redirect (NotServedHereError) unless this pod serves ``topic`` now."""
        placement = self.placement
        if placement is not None:
            placement.check_topic(topic)

    def serves_topic(self, topic: str) -> bool:
        placement = self.placement
        return placement is None or placement.serves(placement.shard_of_topic(topic))

    async def start(self) -> None:
        """After the stores recovered: finish what a crash cut short (a flip this pod took before it
        cleared its "received" marker), then sample the shards' load for the listing."""
        placement = self.placement
        if placement is not None:
            for shard, marker in list(placement.markers.items()):
                if marker.state == "received" and placement.record.owner_of(shard) == self.ordinal:
                    await self._took_ownership(shard, marker.move)
        self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())

    async def close(self) -> None:
        tasks = [*self._opening, *([self._sampler] if self._sampler is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the record ---------------------------------------------------------------------------------
    def placement_doc(self) -> dict[str, Any]:
        if self.placement is None:
            raise AdminRefusal(
                404,
                "this pod holds no placement record (started without --replicas and never given one):"
                " it serves every topic; PUT /admin/v1/placement gives it one",
            )
        return self.placement.record.to_json()

    async def put_placement(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            record = Placement.from_json(body, "body")
        except PlacementError as exc:
            raise AdminRefusal(400, str(exc)) from exc
        if record.kind != "store-shards":
            raise AdminRefusal(400, f"this is a store pod: it takes a store-shards record, not {record.kind}")
        async with self._lock:
            placement = self.placement
            try:
                if placement is None:
                    # Held as epoch 0 until the put persists it: a pod never takes an older record.
                    placement = PodPlacement(
                        self.data_dir / "placement.json", self.ordinal, replace(record, epoch=0)
                    )
                    changed = placement.put(record)
                    self.placement = placement
                else:
                    changed = placement.put(record)
            except PlacementRefusal as exc:
                raise AdminRefusal(exc.status, str(exc)) from exc
            if changed:
                await self._record_changed()
        return {"epoch": record.epoch, "changed": changed}

    async def _record_changed(self) -> None:
        """Close open topics this pod no longer serves; finish moves into it that the record made
        final (the target's half of the flip)."""
        placement = self.placement
        assert placement is not None and self._topics is not None
        leaving = {t for t in self._topics.open_topics() if not self.serves_topic(t)}
        if leaving:
            await self._close_topics(leaving)
        for shard, marker in list(placement.markers.items()):
            if marker.state == "received" and placement.record.owner_of(shard) == self.ordinal:
                await self._took_ownership(shard, marker.move)

    async def _took_ownership(self, shard: int, move: str) -> None:
        placement = self.placement
        assert placement is not None and self._topics is not None
        placement.clear(shard, move)
        await asyncio.to_thread(sf.remove, self._incoming(move))
        topics = [t for t in self._topics.registered_topics() if self._shard(t) == shard]
        # Opened now, as a restart would (pending acks known before a consumer is served); in the
        # background: the flip's answer does not wait for the replays.
        self.moves_in += 1
        task = asyncio.get_running_loop().create_task(self._topics.open_registered(topics))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    # --- the listing --------------------------------------------------------------------------------
    def _shard(self, topic: str) -> int:
        assert self.placement is not None
        return shard_of(topic, self.placement.record.shards)

    def _stored_topics(self) -> list[str]:
        """Topics with state on this pod's disk or open (blocking: lists the ledger directory)."""
        assert self._topics is not None
        names = set(self._topics.registered_topics()) | set(self._topics.open_topics())
        names.update(n for n in self._factory.list_names() if not n.endswith(sf.PENDING_ACK_SUFFIX))
        return sorted(n for n in names if name_problem("topic", n) is None)

    def _shard_topics(self, shard: int) -> list[str]:
        return [t for t in self._stored_topics() if self._shard(t) == shard]

    def _units(self, topics: list[str]) -> list[str]:
        assert self._topics is not None
        rows = self._topics.registry_rows(topics)
        units: list[str] = []
        for topic in topics:
            units += sf.topic_units(topic, rows.get(topic, []))
        return units

    def _usage(self) -> dict[int, tuple[list[str], int]]:
        """Per shard with data here: its topics and their bytes on disk (blocking)."""
        topics: dict[int, list[str]] = {}
        sizes: dict[int, int] = {}
        for topic in self._stored_topics():
            shard = self._shard(topic)
            topics.setdefault(shard, []).append(topic)
            size = 0
            for rel in sf.list_files(self.data_dir, self._units([topic])):
                with contextlib.suppress(OSError):  # deleted meanwhile (a trim, a release)
                    size += (self.data_dir / rel).stat().st_size
            sizes[shard] = sizes.get(shard, 0) + size
        return {shard: (names, sizes[shard]) for shard, names in topics.items()}

    async def shards_doc(self) -> dict[str, Any]:
        placement = self.placement
        if placement is None or self._topics is None:
            return {"ordinal": self.ordinal, "epoch": 0, "shards": []}
        usage = await asyncio.to_thread(self._usage)
        self._record_sample(usage)
        record = placement.record
        held = set(usage) | set(placement.markers) | set(record.shards_of(self.ordinal))
        rates = self._rates()
        rows = []
        for shard in sorted(held):
            marker = placement.markers.get(shard)
            topics, size = usage.get(shard, ([], 0))
            state = "serving" if marker is None else marker.state
            row: dict[str, Any] = {
                "shard": shard,
                "owner": record.owner_of(shard),
                "state": state,
                "topics": topics,
                "bytes": size,
                "bytesInPerSecond": rates.get(shard, (0.0, 0.0))[0],
                "txnPerSecond": rates.get(shard, (0.0, 0.0))[1],
            }
            if marker is not None:
                row["move"] = marker.move
            rows.append(row)
        return {"ordinal": self.ordinal, "epoch": record.epoch, "shards": rows}

    def shard_bytes(self) -> dict[int, int]:
        """Bytes on disk per shard at the last sample (the txnkeeper_shard_bytes gauge)."""
        if not self._samples:
            return {}
        return {s: v[0] for s, v in self._samples[-1][1].items()}

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self._sample()
            except Exception:  # a listing without rates is still a listing
                log.exception("sampling the shards' load failed")
            await asyncio.sleep(RATE_SAMPLE_S)

    async def _sample(self) -> None:
        if self.placement is None or self._topics is None:
            return
        self._record_sample(await asyncio.to_thread(self._usage))

    def _record_sample(self, usage: dict[int, tuple[list[str], int]]) -> None:
        assert self._topics is not None
        ends = self._topics.txn_ends
        per_shard: dict[int, tuple[int, int]] = {}
        for shard, (topics, size) in usage.items():
            per_shard[shard] = (size, sum(ends.get(t, 0) for t in topics))
        now = time.monotonic()
        self._samples.append((now, per_shard))
        while self._samples and now - self._samples[0][0] > RATE_WINDOW_S + RATE_SAMPLE_S:
            self._samples.popleft()

    def _rates(self) -> dict[int, tuple[float, float]]:
        """(bytes/s written, txn ends/s) per shard over the last minute of samples (growth of its bytes
        on disk: a trim in the window makes it read low, never negative)."""
        if len(self._samples) < 2:
            return {}
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        span = max(t1 - t0, 1e-9)
        out = {}
        for shard, (size, ends) in last.items():
            size0, ends0 = first.get(shard, (size, ends))
            out[shard] = (round(max(size - size0, 0) / span, 3), round(max(ends - ends0, 0) / span, 3))
        return out

    # --- source: fence, files, release, unfence --------------------------------------------------------
    def _require(self, shard: int) -> PodPlacement:
        placement = self.placement
        if placement is None:
            raise AdminRefusal(
                409, "this pod holds no placement record: PUT /admin/v1/placement before moving shards"
            )
        if not 0 <= shard < placement.record.shards:
            raise AdminRefusal(
                404, f"shard {shard} does not exist: the record has 0..{placement.record.shards - 1}"
            )
        return placement

    def _owner_text(self, placement: PodPlacement, shard: int) -> str:
        owner = placement.record.owner_of(shard)
        member = placement.record.member(owner)
        where = f" at {member.address}" if member is not None else ""
        return f"pod {owner}{where} (placement epoch {placement.record.epoch})"

    async def fence(self, shard: int, move: str) -> dict[str, Any]:
        async with self._lock:
            placement = self._require(shard)
            if placement.record.owner_of(shard) != self.ordinal:
                raise AdminRefusal(
                    409,
                    f"shard {shard} is owned by {self._owner_text(placement, shard)}, not this pod"
                    f" ({self.ordinal}): fence it on its owner",
                )
            self._mark(placement, shard, move, "fenced")
            topics = await asyncio.to_thread(self._shard_topics, shard)
            self._leave_segments_open(self._units(topics))
            await self._close_topics(set(topics) | {t for t in self._open() if self._shard(t) == shard})
            return await self._manifest(shard, move)

    def _leave_segments_open(self, units: list[str]) -> None:
        """A fence does not wait for streaming offload segments to be finished (an upload inside the
        pause): they stay Assigned and the new owner streams their entries again (§9: an Assigned
        segment's objects are deleted and retried at the next open)."""
        names = {ml.directory.name: ml for ml in self._factory.open_ledgers()}
        for unit in units:
            ledger = names.get(unit.split("/", 1)[1]) if unit.startswith(sf.LEDGERS + "/") else None
            if ledger is not None and ledger.offloader is not None:
                ledger.offloader.finish_on_close = False

    def _open(self) -> list[str]:
        assert self._topics is not None
        return self._topics.open_topics()

    def _mark(self, placement: PodPlacement, shard: int, move: str, state: str) -> None:
        try:
            placement.mark(shard, move, "fenced" if state == "fenced" else "received")
        except PlacementRefusal as exc:
            raise AdminRefusal(exc.status, str(exc)) from exc

    async def _close_topics(self, topics: set[str]) -> None:
        """Tell the clients, close the topics (their queued writes finish), close their ledgers."""
        assert self._topics is not None
        if not topics:
            return
        for closed in self.on_closed:
            closed(topics)
        rows = self._topics.registry_rows(topics)
        await self._topics.close_topics(topics)
        for topic in topics:
            names = [topic, *(pending_ack_log_name(topic, s) for s in rows.get(topic, []))]
            for name in names:
                ledger = self._factory.opened(name)
                if ledger is not None:
                    await ledger.close()

    async def _manifest(self, shard: int, move: str) -> dict[str, Any]:
        """The fenced shard's files as they were on disk when it was fenced: built once per move and
        kept (``moves-out/<move>/manifest.json``), so a repeated fence answers the same manifest and a
        file that changed since (damaged on disk or in transit) is caught by the target's check."""
        kept_path = self.data_dir / sf.OUTGOING / sf.move_dir_name(move) / MANIFEST_FILE
        kept = await asyncio.to_thread(_read_json, kept_path)
        if kept is not None and kept.get("shard") == shard and kept.get("move") == move:
            return kept
        manifest = await self._build_manifest(shard, move)
        await asyncio.to_thread(_write_json, kept_path, manifest)
        return manifest

    async def _build_manifest(self, shard: int, move: str) -> dict[str, Any]:
        assert self._topics is not None and self._offloads is not None and self._policies is not None
        topics = await asyncio.to_thread(self._shard_topics, shard)
        chosen = set(topics)
        rows = {
            "shard": shard,
            "move": move,
            "registry": self._topics.registry_rows(topics),
            "offloadPolicies": self._offloads.rows(chosen),
            "topicPolicies": self._policies.rows(chosen),
        }
        rows_rel = sf.rows_path(move)
        await asyncio.to_thread(_write_json, self.data_dir / rows_rel, rows)

        def build() -> tuple[list[sf.ManifestFile], set[str]]:
            units = self._units(topics)
            paths = sf.list_files(self.data_dir, units)
            # Closed files summed for a pre-copy are not read again while unchanged on disk.
            files = self._checksums.files(self.data_dir, [*paths, rows_rel], remember=False)
            return files, tier.tier_held_files(self.data_dir, units)

        files, held = await asyncio.to_thread(build)
        assert self.placement is not None
        return {
            "shard": shard,
            "move": move,
            "epoch": self.placement.record.epoch,
            "files": [_tagged(f, held) for f in files],
            "topics": topics,
            "bytes": sum(f.size for f in files),
            "rows": rows_rel,
        }

    async def shard_file(self, shard: int, move: str, path: str) -> Path:
        """One file of the fenced shard's manifest (§12 step 2)."""
        placement = self._require(shard)
        marker = placement.markers.get(shard)
        closed = self._closed_listed.get(move, frozenset())
        if (
            path in closed
            and placement.record.owner_of(shard) == self.ordinal
            and marker
            in (
                None,
                MoveMarker(move, "fenced"),
            )
        ):
            return self.data_dir / path  # a closed file listed for this move's pre-copy
        if marker != MoveMarker(move, "fenced"):
            raise AdminRefusal(
                409,
                f"shard {shard} is not fenced for move {move!r} on this pod"
                + (f" (it is {marker.state} for move {marker.move!r})" if marker is not None else "")
                + ": files are served only between fence and release",
            )
        listed = self._listed.get(move)
        if listed is None:
            manifest = await self._manifest(shard, move)
            listed = self._listed[move] = frozenset(f["path"] for f in manifest["files"])
        if path not in listed:
            raise AdminRefusal(
                404, f"{path[:300]!r} is not a file of shard {shard}'s manifest for move {move!r}"
            )
        return self.data_dir / path

    async def release(self, shard: int, move: str) -> dict[str, Any]:
        async with self._lock:
            placement = self._require(shard)
            if placement.record.owner_of(shard) == self.ordinal:
                raise AdminRefusal(
                    409,
                    f"this pod's record (epoch {placement.record.epoch}) still names it the owner of shard"
                    f" {shard}: write the new record (PUT /admin/v1/placement) before releasing its copy",
                )
            marker = placement.markers.get(shard)
            _refuse_other_move(shard, marker, move)
            if marker is not None and marker.state != "fenced":
                raise AdminRefusal(409, f"shard {shard} was received here for move {move!r}: discard it")
            topics = await asyncio.to_thread(self._shard_topics, shard)
            await self._close_topics({t for t in self._open() if self._shard(t) == shard})
            units = self._units(topics)
            deleted = await asyncio.to_thread(self._delete_units, units)
            await self._drop_rows(set(topics))
            self._listed.pop(move, None)
            self._forget_closed(move)
            await asyncio.to_thread(sf.remove, self.data_dir / sf.OUTGOING / sf.move_dir_name(move))
            if marker is not None:
                placement.clear(shard, move)
                self.moves_out += 1
            return {"shard": shard, "move": move, "released": True, "topics": topics, "bytes": deleted}

    def _delete_units(self, units: list[str]) -> int:
        size = 0
        for unit in units:
            path = self.data_dir / unit
            for rel in sf.list_files(self.data_dir, [unit]):
                with contextlib.suppress(OSError):
                    size += (self.data_dir / rel).stat().st_size
            sf.remove(path)
        for directory in {(self.data_dir / u).parent for u in units}:
            if directory.is_dir():
                sf.fsync_dir(directory)
        return size

    async def _drop_rows(self, topics: set[str]) -> None:
        assert self._topics is not None and self._offloads is not None and self._policies is not None
        await self._topics.drop_registry(topics)
        await self._offloads.drop_rows(topics)
        await self._policies.drop_rows(topics)

    async def unfence(self, shard: int, move: str) -> dict[str, Any]:
        async with self._lock:
            placement = self._require(shard)
            if placement.record.owner_of(shard) != self.ordinal:
                raise AdminRefusal(
                    409,
                    f"shard {shard} is owned by {self._owner_text(placement, shard)}: this pod cannot take it"
                    " back; finish the move (release) instead",
                )
            marker = placement.markers.get(shard)
            if marker is not None:
                try:
                    placement.clear(shard, move)
                except PlacementRefusal as exc:
                    raise AdminRefusal(exc.status, str(exc)) from exc
            self._listed.pop(move, None)
            self._forget_closed(move)
            await asyncio.to_thread(sf.remove, self.data_dir / sf.OUTGOING / sf.move_dir_name(move))
            return {"shard": shard, "move": move, "state": "serving"}

    # --- pre-copy: closed files while the source serves ----------------------------------------------
    def _move_lock(self, move: str) -> asyncio.Lock:
        return self._move_locks.setdefault(move, asyncio.Lock())

    def _forget_closed(self, move: str) -> None:
        self._checksums.forget(self._closed_listed.pop(move, frozenset()))
        self._move_locks.pop(move, None)

    async def closed_files(self, shard: int, move: str) -> dict[str, Any]:
        """The source's listing for a pre-copy (no fence: the shard keeps serving): every closed,
        local ledger file of the shard's topics and pending-ack logs with size and CRC32C. First the
        shard's open ledgers holding more than ROLL_OVER_BYTES are rolled over, so that what the fence
        leaves to copy is only what is written after this listing. The paths are served by the file
        verb for this move until it is released or unfenced."""
        async with self._lock:
            placement = self._require(shard)
            if placement.record.owner_of(shard) != self.ordinal:
                raise AdminRefusal(
                    409,
                    f"shard {shard} is owned by {self._owner_text(placement, shard)}, not this pod"
                    f" ({self.ordinal}): pre-copy it from its owner",
                )
            marker = placement.markers.get(shard)
            _refuse_other_move(shard, marker, move)
            topics = await asyncio.to_thread(self._shard_topics, shard)
            units = self._units(topics)
            if marker is None:
                await self._roll_over(units)

            def build() -> tuple[list[sf.ManifestFile], set[str]]:
                paths = pc.closed_ledger_files(self.data_dir, units)
                files = self._checksums.files(self.data_dir, paths, remember=True)
                return files, tier.tier_held_files(self.data_dir, units)

            files, held = await asyncio.to_thread(build)
            self._closed_listed[move] = self._closed_listed.get(move, frozenset()) | {f.path for f in files}
            return {
                "shard": shard,
                "move": move,
                "epoch": placement.record.epoch,
                "closed": True,
                "files": [_tagged(f, held) for f in files],
                "topics": topics,
                "bytes": sum(f.size for f in files),
            }

    async def _roll_over(self, units: list[str]) -> None:
        """Before a pre-copy listing: roll over open ledgers of the shard holding more than
        ROLL_OVER_BYTES, and let a streaming offloader close its current segment now (Pulsar's
        manual offload), so neither the copy nor finishing that segment is left for the fence's
        close; with a deletion lag of 0 the ledgers it completes are not local any more and are read
        from the tier by the target (same tier settings), not copied."""
        names = {ml.directory.name: ml for ml in self._factory.open_ledgers()}
        for unit in units:
            ledger = names.get(unit.split("/", 1)[1]) if unit.startswith(sf.LEDGERS + "/") else None
            if ledger is None:
                continue
            facts = ledger.ledger_facts()
            if facts and not facts[-1].closed and facts[-1].size > ROLL_OVER_BYTES:
                with contextlib.suppress(Exception):  # closed meanwhile: the fence copies it whole
                    await ledger.rollover()
            offloader = ledger.offloader
            policy = offloader.policy if offloader is not None else None
            if (
                offloader is not None
                and policy is not None
                and policy.offloadMode == "streaming"
                and policy.managedLedgerOffloadThresholdInBytes >= 0  # automatic: streaming runs
            ):
                # Shielded: a pass is never cut short by this wait (it goes on in the background).
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(offloader.offload()), SEGMENT_CLOSE_WAIT_S)

    async def precopy(
        self, shard: int, move: str, source: str, max_bytes_per_second: int | None = None
    ) -> dict[str, Any]:
        """The target's pre-copy (before the fence): pulls the source's closed files into
        ``moves-in/<move>/precopy`` (checked, fsync'd, indexed), in passes until one pulls little.
        Nothing is installed or served; the receive takes every staged file whose size and CRC32C the
        fence's manifest repeats, ``discard`` deletes them. Repeatable: a pass pulls only what is not
        staged already. ``max_bytes_per_second``: a bound on what it pulls (the pre-copy shares the
        pods' CPU, disks and network with the shard's clients; the fence's copy is never bounded)."""
        async with self._lock:
            placement = self._require(shard)
            if placement.record.owner_of(shard) == self.ordinal:
                raise AdminRefusal(
                    409, f"this pod already owns shard {shard} (placement epoch {placement.record.epoch})"
                )
            marker = placement.markers.get(shard)
            _refuse_other_move(shard, marker, move, ": discard that move first")
            if marker is not None:  # received already: nothing left to pre-copy
                return {"shard": shard, "move": move, "passes": 0, "files": 0, "bytes": 0, "received": True}
        copies = pc.StagedCopies(self._incoming(move))
        pace = pc.Pace(max_bytes_per_second)
        passes, files, pulled = 0, 0, 0
        async with self._move_lock(move):
            while passes < PRECOPY_PASSES:
                listing = await self._fetch_manifest(shard, move, source, verb="closed")
                wanted = listing["files"]
                if self._has_tier():
                    # Its segments are complete in the tier: the receive checks this pod's tier has
                    # them and then takes the ledger from there (else it pulls the file then).
                    wanted = [e for e in wanted if not e.get("tierHeld")]
                todo = await asyncio.to_thread(copies.wanted, wanted)
                passes += 1
                if not todo:
                    break
                await asyncio.to_thread(sf.remove, copies.pass_dir)
                try:
                    await self._pull(shard, move, source, {"files": todo}, copies.pass_dir, pace=pace)
                except AdminRefusal:
                    # A closed file can go between listing and pull (a trim; offloaded and deleted):
                    # the next pass lists again; the last pass's failure is the answer.
                    if passes >= PRECOPY_PASSES:
                        raise
                    continue
                await asyncio.to_thread(copies.adopt_pass, todo)
                size = sum(int(e["size"]) for e in todo)
                files, pulled = files + len(todo), pulled + size
                if size < PRECOPY_AGAIN_BYTES:
                    break
            staged = await asyncio.to_thread(copies.index)
        return {
            "shard": shard,
            "move": move,
            "passes": passes,
            "files": files,
            "bytes": pulled,
            "stagedFiles": len(staged),
            "stagedBytes": sum(v[0] for v in staged.values()),
        }

    # --- target: receive, discard ------------------------------------------------------------------
    def _incoming(self, move: str) -> Path:
        return self.data_dir / sf.INCOMING / sf.move_dir_name(move)

    async def receive(self, shard: int, move: str, source: str) -> dict[str, Any]:
        async with self._lock, self._move_lock(move):
            placement = self._require(shard)
            if placement.record.owner_of(shard) == self.ordinal:
                raise AdminRefusal(
                    409, f"this pod already owns shard {shard} (placement epoch {placement.record.epoch})"
                )
            marker = placement.markers.get(shard)
            incoming = self._incoming(move)
            if marker is not None and marker.move == move and marker.state == "received":
                receipt = await asyncio.to_thread(_read_json, incoming / RECEIPT_FILE)
                if receipt is not None:
                    return receipt
            _refuse_other_move(shard, marker, move, ": discard that move first")
            manifest = await self._fetch_manifest(shard, move, source)
            staged = incoming / "data"
            # Only the staged copy goes: an install plan left by an attempt that crashed is what a
            # discard needs to find what that attempt installed.
            await asyncio.to_thread(sf.remove, staged)
            copies = pc.StagedCopies(incoming)
            reused, todo, changed = await asyncio.to_thread(copies.link_into, manifest["files"], staged)
            if changed:
                log.warning(
                    "shard %d, move %r: %d pre-copied file(s) changed on the source since (%s): pulled again",
                    shard, move, len(changed), ", ".join(changed[:5]),
                )  # fmt: skip
            held = [e for e in todo if e.get("tierHeld")] if self._has_tier() else []
            todo = [e for e in todo if e not in held]
            await self._pull(shard, move, source, {**manifest, "files": todo}, staged)
            from_tier, rest = await self._from_tier(manifest, staged, held)
            await self._pull(shard, move, source, {**manifest, "files": rest}, staged)
            todo += rest
            await self._check_tier(shard, move, manifest, staged)
            answer = await self._install(shard, move, manifest, staged)
            answer.update(
                fromTier=len(from_tier),
                fromTierBytes=sum(int(e["size"]) for e in from_tier),
                pulled=len(todo),
                pulledBytes=sum(int(e["size"]) for e in todo),
                precopied=len(reused),
                precopiedBytes=sum(int(e["size"]) for e in reused),
                changedSincePrecopy=changed,
            )
            self._mark(placement, shard, move, "received")
            await asyncio.to_thread(_write_json, incoming / RECEIPT_FILE, answer)
            await asyncio.to_thread(sf.remove, staged)
            await asyncio.to_thread(sf.remove, copies.root)
            return answer

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _fetch_manifest(
        self, shard: int, move: str, source: str, verb: str = "fence"
    ) -> dict[str, Any]:
        """The manifest, by repeating the fence on the source (idempotent for the same move); with
        ``verb="closed"`` the listing of the shard's closed files for a pre-copy (no fence)."""
        url = f"{source.rstrip('/')}/admin/v1/shards/{shard}/{verb}"
        try:
            timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(
                    url, json={"move": move}, headers=self._headers(), ssl=self._https.ssl_for(url)
                ) as response,
            ):
                text = await response.text()
                if response.status != 200:
                    raise AdminRefusal(
                        502,
                        f"the source refused the manifest ({url}: HTTP {response.status}: {text[:500]})",
                    )
        except aiohttp.ClientError as exc:
            why = await self._https.explain(exc, url)
            raise AdminRefusal(
                502, f"the source {source} cannot be reached ({why}); retry the receive"
            ) from exc
        try:
            manifest = json.loads(text)
            files = manifest["files"]
            for entry in files:
                if not sf.safe_relative(entry["path"]) or not isinstance(entry["size"], int):
                    raise ValueError(f"unusable path {entry['path']!r}")
                if not isinstance(entry["crc32c"], int):
                    raise ValueError("crc32c must be an integer")
            if manifest["shard"] != shard or manifest["move"] != move:
                raise ValueError("it is for another shard or move")
        except (ValueError, KeyError, TypeError) as exc:
            raise AdminRefusal(502, f"the source's manifest ({url}) is not usable: {exc}") from exc
        return dict(manifest)

    async def _pull(
        self,
        shard: int,
        move: str,
        source: str,
        manifest: dict[str, Any],
        staged: Path,
        *,
        pace: pc.Pace | None = None,
    ) -> None:
        """Every file into ``staged``, each checked against the manifest; nothing is installed on a
        mismatch (the refusal names the file and both checksums). ``pace``: a pre-copy's bandwidth
        bound, told every chunk."""
        base = f"{source.rstrip('/')}/admin/v1/shards/{shard}/files"
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for entry in manifest["files"]:
                rel = entry["path"]
                target = staged / rel
                await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
                params = {"move": move, "path": rel}
                crc, size = 0, 0
                try:
                    async with http.get(
                        base, params=params, headers=self._headers(), ssl=self._https.ssl_for(base)
                    ) as response:
                        if response.status != 200:
                            text = await response.text()
                            raise AdminRefusal(
                                502, f"the source refused {rel} (HTTP {response.status}: {text[:300]})"
                            )
                        handle = await asyncio.to_thread(target.open, "wb")
                        try:
                            async for chunk in response.content.iter_chunked(sf.CHUNK):
                                crc = crc32c(chunk, crc)
                                size += len(chunk)
                                await asyncio.to_thread(handle.write, chunk)
                                if pace is not None:
                                    await pace.took(len(chunk))
                                    if size % pc.WRITEBACK_BYTES < len(chunk):
                                        # Written back in small steps, not one burst at the file's
                                        # fsync that the clients' own fsyncs would queue behind.
                                        await asyncio.to_thread(pc.write_back, handle)
                            await asyncio.to_thread(handle.flush)
                            await asyncio.to_thread(os.fsync, handle.fileno())
                        finally:
                            handle.close()
                except aiohttp.ClientError as exc:
                    why = await self._https.explain(exc, base)
                    raise AdminRefusal(
                        502, f"pulling {rel} from {source} failed ({why}); retry the receive"
                    ) from exc
                if size != entry["size"] or crc != entry["crc32c"]:
                    await asyncio.to_thread(sf.remove, staged)
                    raise AdminRefusal(
                        502,
                        f"shard {shard}, move {move!r}: file {rel} arrived with {size} bytes and CRC32C"
                        f" {crc:#010x}, the source's manifest says {entry['size']} bytes and CRC32C"
                        f" {entry['crc32c']:#010x}; nothing was installed: retry the receive (if it"
                        " fails again the source's copy changed or is damaged: unfence it there)",
                    )
        await asyncio.to_thread(sf.fsync_tree, staged)

    def _has_tier(self) -> bool:
        assert self._offloads is not None
        try:
            return self._offloads.tier_of(None) is not None
        except OffloadSettingsError:
            return False

    async def _from_tier(
        self, manifest: dict[str, Any], staged: Path, held: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Of the files the source's segments hold completely (deletion lag not passed), those whose
        segments this pod's tier has: not copied, their ledgers marked offloaded in the staged metadata
        (read from the tier, as after the source's own deletion). Answers (taken from the tier, still
        to pull)."""
        assert self._offloads is not None
        if not held:
            return [], []
        uuids, ledgers = await asyncio.to_thread(tier.tier_uuids_of, staged, [e["path"] for e in held])
        rows = await asyncio.to_thread(
            _read_json, staged / manifest.get("rows", sf.rows_path(manifest["move"]))
        )
        overrides = (rows or {}).get("offloadPolicies", {})
        usable: set[str] = set()
        for unit, needed in uuids.items():
            name = decode_name(unit.split("/", 1)[1]) or unit
            override = overrides.get(name) if isinstance(overrides, dict) else None
            try:
                config = self._offloads.tier_of(override if isinstance(override, dict) else None)
            except OffloadSettingsError:
                continue
            if config is not None and not await tier.missing_objects(config, needed):
                await asyncio.to_thread(tier.mark_offloaded, staged, unit, ledgers[unit])
                usable.add(unit)
        taken = [
            e
            for e in held
            if sf.unit_of(e["path"]) in usable
            and _ledger_id(e["path"]) in ledgers.get(sf.unit_of(e["path"]), [])
        ]
        return taken, [e for e in held if e not in taken]

    async def _check_tier(self, shard: int, move: str, manifest: dict[str, Any], staged: Path) -> None:
        """Ledgers the shard holds only in the tier move as metadata: refuse (nothing installed)
        unless this pod's tier has every object of the segments they need."""
        assert self._offloads is not None
        units = sorted({sf.unit_of(e["path"]) for e in manifest["files"]})
        needed = await asyncio.to_thread(tier.tier_segments, staged, units)
        if not needed:
            return
        rows = await asyncio.to_thread(_read_json, staged / manifest.get("rows", sf.rows_path(move)))
        overrides = (rows or {}).get("offloadPolicies", {})
        for unit, uuids in needed.items():
            name = decode_name(unit.split("/", 1)[1]) or unit
            override = overrides.get(name) if isinstance(overrides, dict) else None
            try:
                config = self._offloads.tier_of(override if isinstance(override, dict) else None)
            except OffloadSettingsError as exc:
                raise AdminRefusal(
                    502, f"shard {shard}, move {move!r}: {name}'s offload settings: {exc}"
                ) from exc
            if config is None:
                raise AdminRefusal(
                    409,
                    f"shard {shard}, move {move!r}: {name} holds ledgers only in the offload tier, and this"
                    " pod has no offload settings: give it the source's tier (the pods of one resource"
                    " share it), then retry the move; nothing was installed",
                )
            missing = await tier.missing_objects(config, uuids)
            if missing:
                where = config.fileSystemURI or config.managedLedgerOffloadBucket
                raise AdminRefusal(502, tier.describe(shard, move, where, missing, name))

    async def _install(self, shard: int, move: str, manifest: dict[str, Any], staged: Path) -> dict[str, Any]:
        assert self._topics is not None and self._offloads is not None and self._policies is not None
        rows_rel = manifest.get("rows", sf.rows_path(move))
        paths = [e["path"] for e in manifest["files"] if e["path"] != rows_rel]
        units = sorted({sf.unit_of(p) for p in paths})
        topics = [t for t in manifest.get("topics", []) if isinstance(t, str)]
        rows = await asyncio.to_thread(_read_json, staged / rows_rel)
        if rows is None:
            raise AdminRefusal(502, f"the manifest of move {move!r} has no shard rows file {rows_rel}")
        for unit in units:
            name = unit.split("/", 1)[1]
            if unit.startswith(sf.LEDGERS + "/") and any(
                ml.directory.name == name for ml in self._factory.open_ledgers()
            ):
                raise AdminRefusal(
                    409, f"{unit} is open on this pod: it cannot be replaced by a received copy"
                )
        plan = {"shard": shard, "move": move, "units": units, "topics": topics}
        await asyncio.to_thread(_write_json, self._incoming(move) / PLAN_FILE, plan)

        def install() -> None:
            for unit in units:
                destination = self.data_dir / unit
                destination.parent.mkdir(parents=True, exist_ok=True)
                sf.remove(destination)
                (staged / unit).rename(destination)
            for directory in {(self.data_dir / u).parent for u in units}:
                sf.fsync_dir(directory)

        await asyncio.to_thread(install)
        try:
            await self._topics.merge_registry(_rows(rows, "registry"))
            await self._offloads.merge_rows(_rows(rows, "offloadPolicies"))
            await self._policies.merge_rows(_rows(rows, "topicPolicies"))
        except (ValueError, statefile.StateShapeError) as exc:
            raise AdminRefusal(502, f"the shard rows of move {move!r} are not usable: {exc}") from exc
        return {
            "shard": shard,
            "move": move,
            "files": len(manifest["files"]),
            "bytes": sum(int(e["size"]) for e in manifest["files"]),
            "topics": topics,
        }

    async def discard(self, shard: int, move: str) -> dict[str, Any]:
        async with self._lock, self._move_lock(move):
            placement = self._require(shard)
            if placement.record.owner_of(shard) == self.ordinal:
                raise AdminRefusal(
                    409,
                    f"this pod owns shard {shard} (placement epoch {placement.record.epoch}): its copy is"
                    " the one served, not a received one",
                )
            marker = placement.markers.get(shard)
            if marker is not None and (marker.move != move or marker.state != "received"):
                raise AdminRefusal(
                    409,
                    f"shard {shard} is {marker.state} for move {marker.move!r} here, not received for"
                    f" {move!r}",
                )
            incoming = self._incoming(move)
            plan = await asyncio.to_thread(_read_json, incoming / PLAN_FILE)
            deleted = 0
            if plan is not None:
                units = [u for u in plan.get("units", []) if isinstance(u, str) and sf.safe_relative(u)]
                deleted = await asyncio.to_thread(self._delete_units, units)
                await self._drop_rows({t for t in plan.get("topics", []) if isinstance(t, str)})
            if marker is not None:
                placement.clear(shard, move)
            await asyncio.to_thread(sf.remove, incoming)
            return {"shard": shard, "move": move, "discarded": True, "bytes": deleted}


def _tagged(entry: sf.ManifestFile, held: set[str]) -> dict[str, Any]:
    """A manifest entry; ``tierHeld``: a closed ledger's file whose every entry is in Offloaded
    segments (a target sharing the tier reads it from there instead of copying it)."""
    doc = entry.to_json()
    if entry.path in held:
        doc["tierHeld"] = True
    return doc


def _ledger_id(path: str) -> int:
    return int(Path(path).stem)


def _rows(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be an object")
    return value


def _write_json(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as handle:
        json.dump(body, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    sf.fsync_dir(path.parent)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def initial_placement(
    data_dir: Path,
    kind: PlacementKind,
    *,
    ordinal: int,
    replicas: int | None,
    shards: int | None,
    members: Mapping[int, Member] | None = None,
) -> PodPlacement | None:
    """The pod's placement at start: its persisted copy (the flags only have to agree with it on an
    explicit --shards: after scaling, --replicas no longer divides the shard count, and the record is
    what the pod was given), else the first record its flags describe, else None (no --replicas and
    never given one: it serves every topic, as before placement)."""
    path = data_dir / "placement.json"
    doc = statefile.read(path, "placement", frozenset({1}))
    if doc is not None:
        body = statefile.obj(doc.body, "placement state")
        try:
            held = Placement.from_json(body.get("record"), f"{path}: record")
        except PlacementError as exc:
            raise statefile.StateFileError(path, str(exc)) from exc
        if shards is not None and held.shards != shards:
            raise statefile.StateFileError(
                path,
                f"it holds a record of {held.shards} shards, but this pod was started with --shards {shards}",
                "start the pod with the shard count of its resource, or without --shards",
            )
        return PodPlacement.load(data_dir, kind, ordinal, held)
    if replicas is None:
        return None
    try:
        initial = Placement.initial(kind, replicas, shards, members)
    except PlacementError as exc:
        raise statefile.StateFileError(path, str(exc), "fix --replicas/--shards") from exc
    return PodPlacement.load(data_dir, kind, ordinal, initial)


def _refuse_other_move(shard: int, marker: MoveMarker | None, move: str, advice: str = "") -> None:
    """Every verb of one move refuses a shard that this pod holds for another move (409)."""
    if marker is not None and marker.move != move:
        raise AdminRefusal(
            409, f"shard {shard} is {marker.state} for move {marker.move!r} here, not {move!r}{advice}"
        )
