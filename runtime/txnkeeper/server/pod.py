"""The runtime of one pod: opens its stores, recovers its services, serves the protocol and admin API.

Start order matters for readiness: the admin API comes up first (``/health`` answers, ``/ready`` says
why not yet), then every store is opened and replayed and the services recover, then the client port
listens; only then is the pod ready. Close runs the other way and flushes every writer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from txnkeeper import memtrim
from txnkeeper.admin.app import HttpServerLog, build_admin_app
from txnkeeper.admin.coordinator_moves import add_coordinator_routes
from txnkeeper.admin.views import AdminRefusal, FormatLevelRefusal, StoreView, TopicRefusal
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.contract.formats import Feature, FeatureUnavailableError, has_feature
from txnkeeper.contract.placement import Member, Placement
from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.coordinator.recovery import highest_sequence, recovered_transactions
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.coordinator.snapshot import TxnLogSnapshots, snapshot_path
from txnkeeper.coordinator.snapshot import read as read_snapshot
from txnkeeper.errors import (
    InvalidTxnStatusError,
    NotServedHereError,
    ServiceError,
    TxnNotFoundError,
    UnavailableError,
)
from txnkeeper.ledger import ManagedLedgerFactory, io_stats
from txnkeeper.ledger.metadata import METADATA_FILE
from txnkeeper.ledger.names import encode_name
from txnkeeper.ledger.offload.restore import (
    RestoreRequestError,
    inventory,
    request_restore,
    restore_if_requested,
    restore_requested,
)
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.protocol.auth import SECRET_FLAG, ClusterSecret
from txnkeeper.protocol.pulsar_frames import FRAME_PADDING
from txnkeeper.protocol.pulsar_server import pulsar_wire
from txnkeeper.protocol.rpc import split_address
from txnkeeper.protocol.server import ProtocolServer
from txnkeeper.release import BATCHED_LEVEL, format_level
from txnkeeper.server.blocks import PendingBudget
from txnkeeper.server.config import ServeConfig
from txnkeeper.server.coordinator_moves import CoordinatorMoves
from txnkeeper.server.handler import PodHandler
from txnkeeper.server.heap_trimmer import HeapTrimmer
from txnkeeper.server.offload_topics import TopicOffloads
from txnkeeper.server.peers import StorePeers
from txnkeeper.server.placement_state import PodPlacement, pod_ordinal
from txnkeeper.server.pulsar_coordinator import PulsarCoordinators
from txnkeeper.server.pulsar_handler import PulsarPodHandler
from txnkeeper.server.pulsar_pacing import BeginPacing
from txnkeeper.server.pulsar_placement import PulsarPlacement, address_of
from txnkeeper.server.pulsar_txns import TxnRegistrations
from txnkeeper.server.shard_moves import ShardMoves, initial_placement
from txnkeeper.server.store_views import PendingAckView, TxnLogView
from txnkeeper.server.tls_reload import TlsCollector, TlsReloader, TlsSite
from txnkeeper.server.topic_policies import TopicPolicyStore
from txnkeeper.server.topic_policies import collect as topic_policy_metrics
from txnkeeper.server.topic_reads import TopicReads
from txnkeeper.topic.partition import BLOCK_BYTES_BUCKETS
from txnkeeper.topic.pending_ack_log import PendingAckLogAdapter
from txnkeeper.topic.service import TopicLedger, TopicService
from txnkeeper.topic.tailcache import TailCacheBudget
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import TransactionLogStore, transaction_log_name

log = logging.getLogger(__name__)
# How long an admin abort waits for every participant to apply the end before it answers 202 (the
# abort is decided and durable by then; the coordinator keeps delivering it).
ADMIN_ABORT_WAIT_S = 10.0


class PodRuntime:
    """Everything one ``txnkeeper serve`` process runs (implements the admin API's ``PodView``)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.pod_name = config.pod_name
        self.role = config.role
        self.release = config.release
        self.format_level = format_level(config.release)
        self._txnlog_batch = config.txnlog_batch
        self._pending_ack_batch = config.pending_ack_batch
        if self.format_level < BATCHED_LEVEL:
            # A level-1 release cannot write batched entries: start with batching off, whatever was asked.
            if self._txnlog_batch.enabled or self._pending_ack_batch.enabled:
                log.warning("release %s is format level 1: batched writes stay disabled", config.release)
            self._txnlog_batch = replace(self._txnlog_batch, enabled=False)
            self._pending_ack_batch = replace(self._pending_ack_batch, enabled=False)
        self._factory: ManagedLedgerFactory | None = None
        self._txn_logs: dict[int, TransactionLogStore] = {}
        self._snapshots: dict[int, TxnLogSnapshots] = {}
        self.coordinators: dict[int, TransactionCoordinator] = {}
        self.topics: TopicService | None = None
        self._secret = ClusterSecret(config.cluster_secret) if config.cluster_secret else None
        # TLS (server/tls_reload.py): its files are re-read while the pod runs.
        self._tls = TlsReloader(config.tls) if config.tls is not None else None
        self._tls_collector: TlsCollector | None = None
        self._peers = StorePeers(self._secret, tls=self._peer_tls())
        self._protocol: ProtocolServer | None = None
        self._admin_runner: web.AppRunner | None = None
        self._admin_site: web.TCPSite | None = None
        self._not_ready = "starting"
        self._collector: _PodCollector | None = None
        self.offloads: TopicOffloads | None = None  # store pods: PIP-76 offload of topic ledgers
        self.policies: TopicPolicyStore | None = None  # store pods: retention, message TTL, backlog quota
        self.reads: TopicReads | None = None  # store pods: bulk reads of topics (the Spark data source)
        self.client_address = ""
        self.admin_address = ""
        self.registrations: TxnRegistrations | None = None  # store pods: Pulsar transactions
        self.pacing: BeginPacing | None = None  # coordinator pods: Pulsar clients' begins
        # Coordinator pods: the route table their coordinators share, and with --coordinator-ids auto
        # the placement record of the coordinator ids and their moves (contracts §12).
        self.routes: RouteTable | None = None
        self._coordinator_state = Path()
        self.placement: PodPlacement | None = None
        self.coordinator_moves: CoordinatorMoves | None = None
        self.shards: ShardMoves | None = None  # store pods: placement and shard moves (§12)
        self.heap_trimmer = HeapTrimmer()

    # --- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._tls is not None:
            self._tls.start()
            self._tls_collector = TlsCollector(self._tls)
            REGISTRY.register(self._tls_collector)
        await self._start_admin()
        try:
            self._not_ready = "recovering stores"
            data = self.config.data_dir
            data.mkdir(parents=True, exist_ok=True)
            self._check_data_features(data / "ledgers")
            if has_feature(self.release, Feature.OFFLOAD_SEGMENTS):
                # A downgrade asked for the tier-only ledgers back: before any ledger opens (§5).
                self._not_ready = "restoring offloaded ledgers"
                await restore_if_requested(data, data / "ledgers")
                self._not_ready = "recovering stores"
            self._factory = ManagedLedgerFactory(data / "ledgers")
            if self.role == "coordinator":
                await self._start_coordinators(data / "coordinator")
            else:
                await self._start_store(data / "store")
            if self._secret is None:
                log.warning(
                    "no cluster secret (%s): this pod refuses every transactional request", SECRET_FLAG
                )
            self.pacing = BeginPacing() if self.role == "coordinator" else None
            handler = PodHandler(
                self.coordinators,
                self.topics,
                self._secret,
                client_key=self.config.client_token_key,
                coordinator_placement=self.placement,
                pacing=self.pacing,
            )
            placement = self.config.pulsar
            pulsar_coordinators = PulsarCoordinators(
                self.coordinators,
                placement,
                lambda: self.client_address,
                authenticates=self.config.client_token_key is not None,
                record=lambda: self.placement.record if self.placement is not None else None,
                pacing=self.pacing,
            )
            if self.topics is not None:
                self.registrations = TxnRegistrations(
                    self._secret, placement, self._store_address, tls=self._peer_tls()
                )
            pulsar_handler = PulsarPodHandler(
                self.topics,
                pulsar_coordinators,
                placement,
                self._pulsar_url,
                store_url_of=self._placed_store_url,
                registrations=self.registrations,
                client_key=self.config.client_token_key,
                pod_name=self.pod_name,
                # A frame holds the message plus Pulsar's framing: clients are told what fits.
                max_message_size=max(1, self.config.connection_limits.max_frame_size - FRAME_PADDING),
            )
            self._protocol = ProtocolServer(
                handler,
                self.config.connection_limits,
                other_wire=pulsar_wire(pulsar_handler),
                tls=self._listener_tls("client"),
            )
            if self.shards is not None:  # a fenced shard's clients are told to go (§12)
                self.shards.on_closed += [handler.topics_closed, pulsar_handler.topics_closed]
            handler.share_pending_budget(
                PendingBudget(self._protocol.stats, self.config.connection_limits.max_pending_bytes)
            )
            host, port = split_address(self.config.listen)
            await self._protocol.start(host, port)
            self.client_address = f"{host}:{self._protocol.port}"
            self._collector = _PodCollector(self)
            REGISTRY.register(self._collector)
            self._write_ports_file()
            self.heap_trimmer.start()
            self._not_ready = ""
        except BaseException as exc:
            self._not_ready = f"start failed: {exc}"
            raise

    def _pulsar_url(self) -> str:
        """This pod's Pulsar service URL when no --pulsar-urls name the pods (server/pulsar_config.py)."""
        return f"pulsar://{self._reachable_address()}"

    def _placed_store_url(self, topic: str) -> str | None:
        """The Pulsar URL of ``topic``'s owner by this pod's placement record (None: no record, or
        the owner's URL is unknown to it: the --pulsar-urls rule answers)."""
        shards = self.shards
        placement = shards.placement if shards is not None else None
        if placement is None:
            return None
        owner = placement.record.owner_of_topic(topic)
        member = placement.record.member(owner)
        if member is not None and member.pulsar_url:
            return member.pulsar_url
        if owner != placement.ordinal:
            return None
        urls = self.config.pulsar.store_urls
        return urls[owner] if owner < len(urls) else self._pulsar_url()

    def _reachable_address(self) -> str:
        host, _, port = self.client_address.rpartition(":")
        return f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}"

    def _store_address(self, topic: str) -> str:
        """This store pod's address for ``topic`` as coordinators reach it (where ends go): by its
        placement record when it has one (a topic moved here is not where --pulsar-urls put it)."""
        placement = self.shards.placement if self.shards is not None else None
        if placement is not None and placement.record.owner_of_topic(topic) == placement.ordinal:
            member = placement.record.member(placement.ordinal)
            if member is not None:
                return member.address
        return self.config.pulsar.store_address(topic) or self._reachable_address()

    def _check_data_features(self, root: Path) -> None:
        """Refuse data this release cannot read (docs/contracts.md §4), before any ledger is opened."""
        if has_feature(self.release, Feature.OFFLOAD_SEGMENTS):
            return
        needing = inventory(root).needs_offload
        if needing:
            first = needing[0]
            raise FeatureUnavailableError(
                self.release,
                Feature.OFFLOAD_SEGMENTS,
                f"the data in {first.directory} (managed ledger {first.name!r}, metadata version "
                f"{first.metadata_version} with offload segments; {len(needing)} managed ledger(s) in all)"
                " (to downgrade, first restore tier-only ledgers with a 3.x pod: docs/contracts.md §5)",
            )

    async def offload_summary(self) -> dict[str, Any]:
        """Every managed ledger's offload state, read from its metadata file (§5)."""
        root = self.config.data_dir / "ledgers"
        summary = (await asyncio.get_running_loop().run_in_executor(None, inventory, root)).to_json()
        return {
            "pod": self.pod_name,
            "release": self.release,
            "formatLevel": self.format_level,
            "restoreRequested": restore_requested(self.config.data_dir),
            "automaticOffload": self._automatic_offload(),
            **summary,
            "unreadableTierData": self.offloads.unreadable() if self.offloads is not None else [],
        }

    def ledger_index_bytes(self) -> int | None:
        """Memory the offset indexes of every open managed ledger take (None: this pod has none)."""
        if self._factory is None:
            return None
        return sum(ml.index_bytes() for ml in self._factory.open_ledgers())

    def _automatic_offload(self) -> bool:
        """Whether any open managed ledger offloads by itself (threshold >= 0): a downgrade must not
        roll a pod that could still create tier-only ledgers after it was found clean."""
        if self._factory is None:
            return False
        return any(
            ml.offloader is not None and ml.offloader.policy.managedLedgerOffloadThresholdInBytes >= 0
            for ml in self._factory.open_ledgers()
        )

    async def request_offload_restore(self, properties: dict[str, Any]) -> None:
        """Record a restore request carried out at the next start (POST /admin/v1/offload/restore)."""
        if not has_feature(self.release, Feature.OFFLOAD_SEGMENTS):
            raise FormatLevelRefusal(
                f"release {self.release} has no offload: its data holds no offloaded ledger to restore"
            )
        tiers = self.offloads.tiers() if self.offloads is not None else []
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, request_restore, self.config.data_dir, properties, tiers
            )
        except RestoreRequestError as exc:
            raise ValueError(str(exc)) from exc

    async def _start_admin(self) -> None:
        app = build_admin_app(
            self,
            self.config.admin_token,
            lambda: self.offloads,
            lambda: self.policies,
            lambda: self.reads,
            shards=(lambda: self.shards if self.shards is not None and self.shards.attached else None)
            if self.role == "store"
            else None,
            tls=self._tls.report if self._tls is not None else None,
        )
        add_coordinator_routes(app, lambda: self.coordinator_moves)
        self._admin_runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=HttpServerLog())
        await self._admin_runner.setup()
        host, port = split_address(self.config.admin_listen)
        admin_tls = self._listener_tls("admin")
        if admin_tls is not None:
            self._admin_site = TlsSite(self._admin_runner, host, port, admin_tls)
        else:
            self._admin_site = web.TCPSite(self._admin_runner, host, port, reuse_address=True)
        await self._admin_site.start()
        # Not asyncio.Server on every loop (uvloop has its own class): only its sockets are used.
        sockets = getattr(self._admin_site._server, "sockets", None)
        if not sockets:
            raise RuntimeError(f"admin API did not bind {self.config.admin_listen}")
        self.admin_address = f"{host}:{sockets[0].getsockname()[1]}"

    async def _start_coordinators(self, state_dir: Path) -> None:
        self._coordinator_state = state_dir
        self.routes = RouteTable(state_dir / "routes.json")
        self.routes.load()
        ids: list[int] | tuple[int, ...] = self.config.coordinator_ids
        placed = self.config.coordinator_placement
        if placed is not None:
            # --coordinator-ids auto: the ids this pod's placement record gives it (contracts §12).
            count, replicas = placed
            initial = Placement.initial("coordinator-ids", replicas, count)
            ordinal = pod_ordinal(self.pod_name)
            self.placement = PodPlacement.load(self.config.data_dir, "coordinator-ids", ordinal, initial)
            moves = CoordinatorMoves(
                self, self.placement, self.config.data_dir, self.config.admin_token, tls=self._peer_tls()
            )
            self.coordinator_moves = moves
            ids = moves.ids_to_open()
        for coordinator_id in ids:
            await self.open_coordinator(coordinator_id)
            if self.coordinator_moves is not None:
                await self.coordinator_moves.opened(coordinator_id)
        if self.coordinator_moves is not None and self.placement is not None:
            self.placement.on_change(self.coordinator_moves.record_changed)
            self.coordinator_moves.start_sampling()

    @property
    def route_table(self) -> RouteTable:
        assert self.routes is not None, "a coordinator pod's routes are loaded at its start"
        return self.routes

    async def open_coordinator(self, coordinator_id: int) -> None:
        """Open coordinator ``coordinator_id`` from its log and snapshot and start serving it."""
        assert self._factory is not None and self.routes is not None
        state_dir = self._coordinator_state
        path = snapshot_path(state_dir, coordinator_id)
        snapshot = await asyncio.to_thread(read_snapshot, path, transaction_log_name(coordinator_id))
        store = await TransactionLogStore.open(
            self._factory,
            coordinator_id,
            self._txnlog_batch,
            self.format_level,
            snapshots=True,
            snapshot=snapshot,
        )
        self._txn_logs[coordinator_id] = store
        snapshots = self._snapshots[coordinator_id] = TxnLogSnapshots(path, store)
        replayed = await store.replay()
        sequence = SequenceAllocator(state_dir / f"{coordinator_id}.sequence")
        sequence.load(highest_sequence(replayed, coordinator_id))
        coordinator = TransactionCoordinator(
            coordinator_id, store, sequence, self.routes, self._peers, timeouts=self.config.txn_timeouts
        )
        coordinator.recover(recovered_transactions(replayed))
        self.coordinators[coordinator_id] = coordinator
        # Replayed records no snapshot covered: covered by a fresh one soon (in the background,
        # so readiness does not wait for it), so the next restart does not replay them again.
        snapshots.start(due=store.replayed_records >= snapshots.threshold)

    async def close_coordinator(self, coordinator_id: int, quiesce: float) -> None:
        """Stop serving ``coordinator_id`` (it moves to another pod): refused from now on, the ends in
        progress get ``quiesce`` seconds to finish, then the log is flushed, snapshotted and closed, so
        its files stay as they are until they are released."""
        coordinator = self.coordinators.pop(coordinator_id, None)
        if coordinator is not None:
            left = await coordinator.quiesce(quiesce)
            if left:
                log.warning(
                    "coordinator %d: %d end(s) still in progress after %.1fs; the next owner resumes them",
                    coordinator_id,
                    left,
                    quiesce,
                )
            await coordinator.close()
        snapshots = self._snapshots.pop(coordinator_id, None)
        if snapshots is not None:
            await snapshots.close()
        store = self._txn_logs.pop(coordinator_id, None)
        if store is not None:
            await store.close()

    async def _start_store(self, state_dir: Path) -> None:
        factory = self._factory
        assert factory is not None

        root = factory.root

        def ledger_exists(topic: str) -> bool:
            # Checked without opening (an end for a topic this pod never held must not create it).
            return (root / encode_name(topic) / METADATA_FILE).is_file()

        shards = self.shards = ShardMoves(
            self.config.data_dir,
            initial_placement(
                self.config.data_dir,
                "store-shards",
                ordinal=pod_ordinal(self.pod_name),
                replicas=self.config.replicas,
                shards=self.config.shards,
                members=_store_members(self.config.pulsar),
            ),
            ordinal=pod_ordinal(self.pod_name),
            factory=factory,
            admin_token=self.config.admin_token,
            tls=self._peer_tls(),
        )

        def served_topic_exists(topic: str) -> bool:
            # The admin's topic verbs: a topic of a shard another pod serves is named as such (409).
            try:
                shards.gate(topic)
            except NotServedHereError as exc:
                raise TopicRefusal(409, str(exc)) from exc
            return ledger_exists(topic)

        offloads = TopicOffloads(self.config.offload, state_dir, factory, served_topic_exists)
        self.offloads = offloads
        policies = TopicPolicyStore(
            self.config.topic_policies,
            state_dir,
            factory,
            served_topic_exists,
            lambda: self.topics.partitions() if self.topics is not None else {},
        )

        async def open_ledger(topic: str) -> TopicLedger:
            return await factory.open(topic, offloads.ledger_config(topic))

        async def open_pending_ack(topic: str, subscription: str) -> PendingAckLogAdapter:
            store = await PendingAckStore.open(
                factory, topic, subscription, self._pending_ack_batch, self.format_level
            )
            return PendingAckLogAdapter(store)

        self.topics = TopicService(
            state_dir / "subscriptions.json",
            open_ledger,
            open_pending_ack,
            ledger_exists,
            single_key=self.config.single_key,
            policies=policies.policies_of,
            check_interval=policies.pod.check_interval_seconds,
            stored_topics=factory.list_names,  # (pending-ack logs are skipped by their name)
            tail_cache=TailCacheBudget(self.config.tail_cache_bytes),
            gate=shards.gate,
        )
        await self.topics.recover()
        self.policies = policies
        self.reads = TopicReads(factory, self.topics, served_topic_exists)
        shards.attach(self.topics, offloads, policies)
        await shards.start()

    def _write_ports_file(self) -> None:
        path = self.config.ports_file
        if path is None:
            return
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"listen": self.client_address, "admin": self.admin_address}))
        tmp.replace(path)

    async def close(self) -> None:
        """Graceful: stop taking requests, stop services, flush and close every store."""
        self._not_ready = "shutting down"
        if self._collector is not None:
            REGISTRY.unregister(self._collector)
            self._collector = None
        await self.heap_trimmer.close()
        if self._protocol is not None:
            await self._protocol.close()
        if self.coordinator_moves is not None:
            await self.coordinator_moves.close()
        for coordinator in self.coordinators.values():
            await coordinator.close()
        await self._peers.close()
        if self.registrations is not None:
            await self.registrations.close()
        if self.shards is not None:
            await self.shards.close()
        if self.topics is not None:
            await self.topics.close()
        for coordinator_id, snapshots in self._snapshots.items():
            try:
                await snapshots.close()
            except Exception as exc:  # the log stays the truth: the next start replays more
                log.error("final transaction log snapshot of coordinator %d failed: %s", coordinator_id, exc)
        for store in self._txn_logs.values():
            await store.close()
        if self._factory is not None:
            await self._factory.close()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        if self._tls is not None:
            await self._tls.close()
        if self._tls_collector is not None:
            REGISTRY.unregister(self._tls_collector)
            self._tls_collector = None

    def _listener_tls(self, listener: str) -> TlsReloader | None:
        tls = self._tls
        return tls if tls is not None and tls.config.serves(listener) else None

    def _peer_tls(self) -> TlsReloader | None:
        return self._listener_tls("peers")

    # --- PodView -----------------------------------------------------------------------------------
    def readiness(self) -> str | None:
        if self._not_ready:
            return self._not_ready
        if self._protocol is None or not self._protocol.listening:
            return "client port is not listening"
        return None

    def stores(self) -> list[StoreView]:
        views: list[StoreView] = [TxnLogView(s) for _, s in sorted(self._txn_logs.items())]
        views += [PendingAckView(a.store) for _, a in sorted(self._pending_ack_adapters().items())]
        return views

    def _pending_ack_adapters(self) -> dict[tuple[str, str], PendingAckLogAdapter]:
        if self.topics is None:
            return {}
        return {
            k: v for k, v in self.topics.pending_ack_handles().items() if isinstance(v, PendingAckLogAdapter)
        }

    def coordinator_array(self) -> list[dict[str, Any]]:
        result = []
        for coordinator_id, store in sorted(self._txn_logs.items()):
            coordinator = self.coordinators.get(coordinator_id)
            result.append(
                {
                    "coordinatorId": coordinator_id,
                    "state": coordinator.state if coordinator else "None",
                    "leastSigBits": coordinator.least_sig_bits if coordinator else 0,
                    "ongoingTxnSize": coordinator.ongoing_count if coordinator else 0,
                    "transactionLogBatchedWriteStat": store.batched_write_stat(),
                }
            )
        return result

    def subscription_array(self) -> list[dict[str, Any]]:
        return [
            {
                "topic": topic,
                "subscription": sub,
                "transactionPendingAckBatchedWriteStat": a.store.batched_write_stat(),
            }
            for (topic, sub), a in sorted(self._pending_ack_adapters().items())
        ]

    def batch_log_configs(self) -> tuple[BatchedWriteConfig, BatchedWriteConfig]:
        return self._txnlog_batch, self._pending_ack_batch

    async def set_batch_log(self, txnlog: BatchedWriteConfig, pending_ack: BatchedWriteConfig) -> None:
        if self.format_level < BATCHED_LEVEL and (txnlog.enabled or pending_ack.enabled):
            raise FormatLevelRefusal(
                f"release {self.release} runs at format level {self.format_level}: it cannot write batched"
                " entries; upgrade this pod to a 2.x release before enabling the batch log"
            )
        self._txnlog_batch = txnlog
        self._pending_ack_batch = pending_ack
        for store in self._txn_logs.values():
            await store.configure(txnlog)
        for adapter in self._pending_ack_adapters().values():
            await adapter.store.configure(pending_ack)

    def coordinator_log(self, coordinator_id: int) -> StoreView | None:
        store = self._txn_logs.get(coordinator_id)
        return TxnLogView(store) if store is not None else None

    def pending_ack_log(self, topic: str, subscription: str) -> StoreView | None:
        adapter = self._pending_ack_adapters().get((topic, subscription))
        return PendingAckView(adapter.store) if adapter is not None else None

    def metrics_text(self) -> bytes:
        return generate_latest(REGISTRY)

    async def abort_transaction(self, most: int, least: int) -> tuple[int, dict[str, Any]]:
        txn_id = TxnID(most, least)
        coordinator = self.coordinators.get(most)
        if coordinator is None:
            if not self.coordinators:
                raise AdminRefusal(
                    404, "this pod hosts no transaction coordinator (role store); ask a coordinator pod"
                )
            hosted = ", ".join(str(c) for c in sorted(self.coordinators))
            raise AdminRefusal(
                404, f"coordinator {most} is not hosted on this pod (it hosts {hosted}); ask the pod that is"
            )
        try:
            already, ended = coordinator.abort_by_admin(txn_id)
        except TxnNotFoundError as exc:
            raise AdminRefusal(404, f"{exc}: never begun, or ended long ago") from exc
        except InvalidTxnStatusError as exc:
            raise AdminRefusal(409, f"{exc}; only an open transaction can be aborted") from exc
        except UnavailableError as exc:
            raise AdminRefusal(503, f"{exc}; retry once the pod is ready") from exc
        answer: dict[str, Any] = {"txnId": str(txn_id), "status": "ABORTED", "alreadyEnded": already}
        try:
            await asyncio.wait_for(asyncio.shield(ended), ADMIN_ABORT_WAIT_S)
        except TimeoutError:
            return 202, {**answer, "status": "ABORTING"}  # decided; delivered to the stores as they answer
        except ServiceError as exc:  # the decision could not be logged: nothing changed
            raise AdminRefusal(503, f"aborting {txn_id} failed: {exc}; retry") from exc
        return 200, answer

    async def topic_writers(self, topic: str) -> dict[str, Any] | None:
        topics = self.topics
        if topics is None:
            return None
        partition = topics.partitions().get(topic)
        if partition is None:
            return None
        settings = topics.single_key
        return {
            "topic": topic,
            "singleKeyTransactions": {
                "enabled": settings.enabled,
                "maxBlockBytes": settings.max_block_bytes,
                "writerInactivityMinutes": settings.writer_inactivity_minutes,
                "maxWritersPerTopic": settings.max_writers_per_topic,
            },
            "writers": partition.writers.rows_for_admin(),
            "sessionsWithoutWrites": partition.writers.sessions_without_writes(),
        }


class _PodCollector(Collector):
    """txnkeeper's own service metrics, read from the live objects at scrape time."""

    def __init__(self, pod: PodRuntime) -> None:
        self._pod = pod

    def collect(self) -> Iterator[Metric]:
        pod = self._pod
        yield ready_metric(pod.readiness())
        if pod.coordinators:
            ongoing = GaugeMetricFamily(
                "txnkeeper_coordinator_ongoing_transactions", "Open or ending", labels=["coordinator_id"]
            )
            # Ends decided and not yet applied everywhere: a growing figure means the store pods
            # apply ends slower than clients ask for them (the end latency grows with it).
            ending = GaugeMetricFamily(
                "txnkeeper_coordinator_ending_transactions",
                "Committing or aborting: decided, being delivered to their participants",
                labels=["coordinator_id"],
            )
            created = CounterMetricFamily(
                "txnkeeper_coordinator_created_transactions", "Begun", labels=["coordinator_id"]
            )
            committed = CounterMetricFamily(
                "txnkeeper_coordinator_committed_transactions", "Committed", labels=["coordinator_id"]
            )
            aborted = CounterMetricFamily(
                "txnkeeper_coordinator_aborted_transactions", "Aborted", labels=["coordinator_id"]
            )
            timed_out = CounterMetricFamily(
                "txnkeeper_coordinator_timed_out_transactions",
                "Aborted by timeout",
                labels=["coordinator_id"],
            )
            durations = HistogramMetricFamily(
                "txnkeeper_coordinator_txn_duration_seconds",
                "Committed and aborted txns, from begin to their end applied on every participant",
                labels=["coordinator_id"],
            )
            for cid, c in pod.coordinators.items():
                label = [str(cid)]
                durations.add_metric(label, *c.durations.snapshot())
                ongoing.add_metric(label, c.ongoing_count)
                ending.add_metric(label, c.ending_count)
                created.add_metric(label, c.created_count)
                committed.add_metric(label, c.committed_count)
                aborted.add_metric(label, c.aborted_count)
                timed_out.add_metric(label, c.timed_out_count)
            yield from (ongoing, ending, created, committed, aborted, timed_out, durations)
        if pod.topics is not None:
            published = CounterMetricFamily(
                "txnkeeper_topic_published_messages", "Messages written", labels=["topic"]
            )
            open_txns = GaugeMetricFamily(
                "txnkeeper_topic_ongoing_transactions", "Unresolved txns", labels=["topic"]
            )
            # Each kept outcome holds ~220 bytes: an aborted txn's until its marker's ledger is
            # trimmed, a committed one's until its deadline + 20 s (docs/contracts.md, "Kept outcomes").
            kept = GaugeMetricFamily(
                "txnkeeper_topic_kept_txn_outcomes",
                "Ended txns whose outcome is held in memory (aborted: until their marker's ledger is trimmed;"
                " committed: until their deadline + 20 s)",
                labels=["topic"],
            )
            # How long the oldest open transaction has held back the topic's later messages: alert on
            # it, then abort the transaction (txnkeeper admin transactions abort) if it must not wait.
            oldest = GaugeMetricFamily(
                "txnkeeper_topic_oldest_open_txn_age_seconds",
                "Seconds since the first message of the topic's oldest open transaction (0: none open)",
                labels=["topic"],
            )
            # Kept aborted outcomes grow with the data of a topic nobody subscribes to when no retention
            # trims it (docs/contracts.md "Kept outcomes"): the alert on that growth needs this count.
            subscriptions = GaugeMetricFamily(
                "txnkeeper_topic_subscriptions", "Durable subscriptions (cursors)", labels=["topic"]
            )
            now = time.time()
            for topic, partition in pod.topics.partitions().items():
                subscriptions.add_metric([topic], len(partition.subscriptions))
                published.add_metric([topic], partition.published_count)
                open_txns.add_metric([topic], partition.buffer.ongoing)
                kept.add_metric([topic], partition.buffer.ended_count)
                oldest.add_metric([topic], round(partition.buffer.oldest_open_age_s(now), 3))
            yield from (published, open_txns, kept, oldest, subscriptions)
            yield from topic_policy_metrics(pod.topics.partitions().items())
        protocol = pod._protocol
        if protocol is not None:
            stats = protocol.stats
            yield GaugeMetricFamily(
                "txnkeeper_server_open_connections",
                "Client protocol connections open",
                value=stats.open_connections,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_pending_bytes",
                "Bytes of incomplete frames buffered across connections",
                value=stats.pending_bytes,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_write_paused_connections",
                "Connections whose requests are not read until their peer reads its answers",
                value=stats.write_paused,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_unsent_bytes",
                "Answers and pushed messages not yet read by peers, all connections together",
                value=stats.unsent_bytes,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_request_bytes",
                "Bytes of requests read, not answered yet (sends awaiting their write), all connections",
                value=stats.request_bytes,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_request_held_connections",
                "Connections not read until their own (or all connections') unanswered requests are answered",
                value=stats.request_held,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_push_paused_connections",
                "Connections whose consumers get no messages until their peer reads (or the budget frees)",
                value=stats.push_paused,
            )
            yield GaugeMetricFamily(
                "txnkeeper_server_handshaking_connections",
                "Connections that have not completed a request yet",
                value=stats.handshaking,
            )
            yield CounterMetricFamily(
                "txnkeeper_server_accepted_connections", "Connections accepted", value=stats.accepted
            )
            refused = CounterMetricFamily(
                "txnkeeper_server_refused_connections", "Connections refused at accept", labels=["reason"]
            )
            for reason, count in sorted(stats.refused.items()):
                refused.add_metric([reason], count)
            closed = CounterMetricFamily(
                "txnkeeper_server_closed_connections", "Connections closed by a limit", labels=["reason"]
            )
            for reason, count in sorted(stats.closed.items()):
                closed.add_metric([reason], count)
            yield from (refused, closed)
        if pod.offloads is not None:
            yield from pod.offloads.collect()
        if pod.shards is not None:
            yield from _shard_metrics(pod.shards)
        yield from _ledger_metrics()
        yield from _heap_metrics(pod.heap_trimmer)
        if pod.registrations is not None:
            yield from _registration_metrics(pod.registrations)
        if pod.pacing is not None:
            yield from _pacing_metrics(pod.pacing)
        index_bytes = pod.ledger_index_bytes()
        if index_bytes is not None:
            yield GaugeMetricFamily(
                "txnkeeper_store_ledger_index_bytes",
                "Memory the open managed ledgers' offset indexes take (dense while written, sparse closed)",
                value=index_bytes,
            )
        if pod.topics is not None:
            yield from _tail_cache_metrics(pod.topics.tail_cache)
            yield from _srk_metrics(pod.topics)
            yield GaugeMetricFamily(
                "txnkeeper_store_txn_fences",
                "Txns ended on topics/subscriptions this pod does not hold, fenced until their deadline",
                value=pod.topics.fence_count,
            )


def _store_members(pulsar: PulsarPlacement) -> dict[int, Member]:
    """The first record's members from --pulsar-urls (pod i at its i-th URL), else none known."""
    return {i: Member(address_of(url), pulsar_url=url) for i, url in enumerate(pulsar.store_urls)}


def _shard_metrics(shards: ShardMoves) -> Iterator[Metric]:
    """txnkeeper_shard_*: bytes on disk per shard held here, and the moves this pod took part in."""
    size = GaugeMetricFamily(
        "txnkeeper_shard_bytes", "Bytes on disk of the shard's topics on this pod", labels=["shard"]
    )
    for shard, value in sorted(shards.shard_bytes().items()):
        size.add_metric([str(shard)], value)
    yield size
    moves = CounterMetricFamily(
        "txnkeeper_shard_moves", "Shard moves this pod completed, by direction", labels=["direction"]
    )
    moves.add_metric(["out"], shards.moves_out)
    moves.add_metric(["in"], shards.moves_in)
    yield moves
    if shards.placement is not None:
        yield GaugeMetricFamily(
            "txnkeeper_placement_epoch",
            "Epoch of the placement record this pod serves by",
            value=shards.placement.record.epoch,
        )


def ready_metric(not_ready: str | None) -> Metric:
    """txnkeeper_pod_ready from the pod's readiness (None: ready, else why not). /metrics answers
    before the pod is ready (the admin API starts first): a pod stuck recovering is up for Prometheus,
    and only this gauge tells the "not ready" alert (docs/monitoring.md)."""
    return GaugeMetricFamily(
        "txnkeeper_pod_ready",
        "1 when /ready answers 200 (the client port serves), else 0",
        value=0 if not_ready else 1,
    )


def _ledger_metrics() -> Iterator[Metric]:
    """txnkeeper_ledger_*: this process's group commits (every managed ledger's, ledger/io_stats.py)."""
    appends = HistogramMetricFamily(
        "txnkeeper_ledger_append_seconds",
        "Append to acknowledgement (durable), each append counted with its group's oldest wait",
    )
    appends.add_metric([], *io_stats.APPEND.snapshot())
    fsyncs = HistogramMetricFamily("txnkeeper_ledger_fsync_seconds", "fdatasync of one group commit's data")
    fsyncs.add_metric([], *io_stats.FSYNC.snapshot())
    watermark = CounterMetricFamily(
        "txnkeeper_ledger_watermark_writes", "Confirmed-entry watermark writes (fsynced, ledger/watermark.py)"
    )
    watermark.add_metric([], io_stats.WATERMARK.writes)
    errors = CounterMetricFamily(
        "txnkeeper_ledger_watermark_errors",
        "Watermark updates that failed (mark: the written mark; confirm: the fsynced write)",
        labels=["kind"],
    )
    for kind in ("mark", "confirm"):
        errors.add_metric([kind], io_stats.WATERMARK.errors[kind])
    yield from (appends, fsyncs, watermark, errors)


def _pacing_metrics(pacing: BeginPacing) -> Iterator[Metric]:
    """txnkeeper_pulsar_*: a coordinator pod's pacing of Pulsar clients' begins (server/pulsar_pacing.py)."""
    yield GaugeMetricFamily(
        "txnkeeper_pulsar_unconfirmed_registrations",
        "Partitions and subscriptions Pulsar clients registered that no store confirmed yet",
        value=pacing.unconfirmed,
    )
    yield CounterMetricFamily(
        "txnkeeper_pulsar_held_begins",
        "NEW_TXNs held while their connection had too many registrations on their way to a store",
        value=pacing.begins_held,
    )


def _registration_metrics(registrations: TxnRegistrations) -> Iterator[Metric]:
    """txnkeeper_pulsar_registration_*: a store pod's confirmations of Pulsar clients' transaction
    registrations with their coordinators (server/pulsar_txns.py), and the requests carrying them."""
    yield CounterMetricFamily(
        "txnkeeper_pulsar_registration_confirmations",
        "(transaction, partition or subscription) registrations confirmed with a coordinator",
        value=registrations.confirmations,
    )
    yield CounterMetricFamily(
        "txnkeeper_pulsar_registration_requests",
        "Requests to coordinators carrying those confirmations (batched per event-loop turn)",
        value=registrations.requests,
    )


def _heap_metrics(trimmer: HeapTrimmer) -> Iterator[Metric]:
    """txnkeeper_process_heap_bytes: the C heap in use, free (kept between live chunks) and mmapped;
    txnkeeper_process_heap_trims: the periodic returns of its free pages (server/heap_trimmer.py)."""
    usage = memtrim.heap_usage()
    if usage is None:
        return
    yield CounterMetricFamily(
        "txnkeeper_process_heap_trims",
        "Periodic returns of the C heap's free pages to the OS",
        value=trimmer.trims,
    )
    yield CounterMetricFamily(
        "txnkeeper_process_heap_trim_seconds",
        "Time the periodic returns of free heap pages took (in a worker thread)",
        value=trimmer.seconds,
    )
    heap = GaugeMetricFamily(
        "txnkeeper_process_heap_bytes",
        "The C heap (glibc mallinfo2, every object over 512 bytes): in use, free but kept, mmapped",
        labels=["state"],
    )
    heap.add_metric(["in_use"], usage.in_use)
    heap.add_metric(["free"], usage.free)
    heap.add_metric(["mmapped"], usage.mmapped)
    yield heap


def _tail_cache_metrics(budget: TailCacheBudget) -> Iterator[Metric]:
    """txnkeeper_store_tail_cache_*: all topics' recently written entries kept in memory."""
    yield GaugeMetricFamily(
        "txnkeeper_store_tail_cache_bytes",
        "Payloads plus 240 bytes each of the entries all topics keep in memory (--tail-cache-bytes)",
        value=budget.bytes,
    )
    yield GaugeMetricFamily(
        "txnkeeper_store_tail_cache_entries", "Entries all topics keep in memory", value=budget.entries
    )
    yield CounterMetricFamily(
        "txnkeeper_store_tail_cache_evicted_entries",
        "Entries dropped from memory to stay within the budget (their readers read the disk)",
        value=budget.evicted,
    )


def _srk_metrics(topics: TopicService) -> Iterator[Metric]:
    """txnkeeper_srk_*: single-routing-key blocks and writers, per topic."""
    commits = CounterMetricFamily("txnkeeper_srk_commits", "Blocks committed", labels=["topic"])
    events = CounterMetricFamily("txnkeeper_srk_events", "Events committed in blocks", labels=["topic"])
    duplicates = CounterMetricFamily(
        "txnkeeper_srk_duplicate_blocks", "Blocks answered as duplicates, not written", labels=["topic"]
    )
    duplicate_sends = CounterMetricFamily(
        "txnkeeper_srk_duplicate_sends", "Idempotent produces answered as duplicates", labels=["topic"]
    )
    orphans = CounterMetricFamily(
        "txnkeeper_srk_orphan_aborts", "Marker-less blocks aborted by recovery", labels=["topic"]
    )
    sizes = HistogramMetricFamily("txnkeeper_srk_block_bytes", "Committed block sizes", labels=["topic"])
    writers = GaugeMetricFamily("txnkeeper_srk_writers", "Writers and producers remembered", labels=["topic"])
    for topic, partition in topics.partitions().items():
        stats = partition.block_stats
        label = [topic]
        commits.add_metric(label, stats.commits)
        events.add_metric(label, stats.events)
        duplicates.add_metric(label, stats.duplicate_blocks)
        duplicate_sends.add_metric(label, stats.duplicate_sends)
        orphans.add_metric(label, stats.orphan_aborts)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*BLOCK_BYTES_BUCKETS, None), stats.block_bytes_counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound is None else str(bound), cumulative))
        sizes.add_metric(label, buckets, stats.block_bytes_sum)
        writers.add_metric(label, len(partition.writers.durable))
    yield from (commits, events, duplicates, duplicate_sends, orphans, sizes, writers)
