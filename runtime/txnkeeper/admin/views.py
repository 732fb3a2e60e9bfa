"""What the admin API reads and changes on a pod, as protocols the pod runtime implements.

Why: the HTTP layer only translates requests and shapes documents; the pod runtime owns the stores.
Keeping the seam explicit lets the API be served by any role (coordinator or store pod).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.ledger.position import Position


class FormatLevelRefusal(Exception):
    """Enabling batched writes was asked of a level-1 release (HTTP 409)."""


class StoreView(Protocol):
    """One store on the pod: a coordinator's transaction log or a subscription's pending-ack log."""

    @property
    def kind(self) -> str: ...  # "txnlog" | "pendingack"

    @property
    def name(self) -> str: ...  # managed-ledger name

    def ref(self) -> dict[str, Any]: ...  # StoreRef of contracts §5

    def batched_write_stat(self) -> dict[str, Any]: ...

    def internal_stats(self) -> dict[str, Any]: ...  # {managedLedgerName, managedLedgerInternalStats}

    async def rollover(self) -> int: ...  # returns lastBatchedLedger (largest id before the rollover)

    async def ledger_report(self) -> dict[str, Any]: ...  # one entry of GET /admin/v1/stores/ledgers


class PodView(Protocol):
    """The pod as the admin API sees it."""

    pod_name: str
    role: str
    release: str
    format_level: int

    def readiness(self) -> str | None: ...  # None when ready, else the reason

    def stores(self) -> list[StoreView]: ...

    def coordinator_array(self) -> list[dict[str, Any]]: ...

    def subscription_array(self) -> list[dict[str, Any]]: ...

    def batch_log_configs(self) -> tuple[BatchedWriteConfig, BatchedWriteConfig]: ...  # (txnlog, pendingack)

    async def set_batch_log(self, txnlog: BatchedWriteConfig, pending_ack: BatchedWriteConfig) -> None: ...

    def coordinator_log(self, coordinator_id: int) -> StoreView | None: ...

    def pending_ack_log(self, topic: str, subscription: str) -> StoreView | None: ...

    async def offload_summary(self) -> dict[str, Any]: ...  # GET /admin/v1/offload/summary

    # POST /admin/v1/offload/restore: ValueError = bad settings (400), FormatLevelRefusal (409).
    async def request_offload_restore(self, properties: dict[str, Any]) -> None: ...

    def metrics_text(self) -> bytes: ...

    # A topic's single-routing-key writers and idempotent producers (None: not a topic of this pod).
    async def topic_writers(self, topic: str) -> dict[str, Any] | None: ...

    # POST /admin/v3/transactions/abortTransaction/{most}/{least}: {"txnId", "status", "alreadyEnded"},
    # and the HTTP status (200 applied everywhere, 202 decided and still being delivered); AdminRefusal.
    async def abort_transaction(self, most: int, least: int) -> tuple[int, dict[str, Any]]: ...


class AdminRefusal(Exception):
    """A verb cannot be done (HTTP ``status``: 400 bad input, 404 no such thing here, 409 not
    possible in this state, 503 a store failed or is not ready); the message says why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TopicRefusal(AdminRefusal):
    """A topic verb cannot be done (400 bad input, 404 no such topic or override here, 409 not
    possible in this state, 503 the blob store failed)."""


class OffloadRefusal(TopicRefusal):
    """An offload verb cannot be done (see ``TopicRefusal``)."""


class TopicOffloadView(Protocol):
    """PIP-76 offload of a store pod's topics (`txnkeeper admin topics ...`), served by store pods."""

    async def offload(self, topic: str) -> dict[str, Any]: ...  # manual offload; the segments it closed

    async def status(self, topic: str) -> dict[str, Any]: ...  # OffloadProcessStatus + mode, lag, counts

    async def segments(self, topic: str) -> dict[str, Any]: ...

    async def internal_stats(self, topic: str) -> dict[str, Any]: ...  # with real `offloaded` flags

    def policies(self, topic: str) -> dict[str, Any]: ...  # pod's, topic's and effective settings

    async def set_policies(self, topic: str, settings: dict[str, Any]) -> dict[str, Any]: ...

    async def remove_policies(self, topic: str) -> dict[str, Any]: ...


class TopicPolicyView(Protocol):
    """Pulsar's topic policies of a store pod's topics (`txnkeeper admin topics retention|message-ttl|
    backlog-quota get|set|remove`): ``verb`` is one of those three names."""

    def get(self, verb: str, topic: str) -> dict[str, Any]: ...  # pod's, topic's and effective settings

    async def set(self, verb: str, topic: str, settings: dict[str, Any]) -> dict[str, Any]: ...

    async def remove(self, verb: str, topic: str) -> dict[str, Any]: ...


class TopicReadView(Protocol):
    """What a bulk reader of a store pod's topics asks (the Spark data source; contracts §5)."""

    async def read_state(self, topic: str) -> dict[str, Any]: ...  # layout, aborted set, max read position

    # (durable entries of the ledger, entries from ``start`` on), bounded by both limits
    async def read_entries(
        self, topic: str, start: Position, max_entries: int, max_bytes: int
    ) -> tuple[int, list[bytes]]: ...


class ShardAdminView(Protocol):
    """A pod's placement record and the shard move verbs (docs/contracts.md §12), served by store pods.
    Every method raises ``AdminRefusal`` (400 bad input, 404 no such shard or file, 409 not in this
    state, 502 the source pod failed or sent something that does not match its manifest)."""

    def placement_doc(self) -> dict[str, Any]: ...  # GET /admin/v1/placement: the record

    async def put_placement(self, body: dict[str, Any]) -> dict[str, Any]: ...  # {"epoch", "changed"}

    async def shards_doc(self) -> dict[str, Any]: ...  # GET /admin/v1/shards

    async def fence(self, shard: int, move: str) -> dict[str, Any]: ...  # the manifest

    async def unfence(self, shard: int, move: str) -> dict[str, Any]: ...

    async def receive(self, shard: int, move: str, source: str) -> dict[str, Any]: ...

    async def closed_files(self, shard: int, move: str) -> dict[str, Any]: ...  # pre-copy listing

    async def precopy(
        self, shard: int, move: str, source: str, max_bytes_per_second: int | None
    ) -> dict[str, Any]: ...

    async def discard(self, shard: int, move: str) -> dict[str, Any]: ...

    async def release(self, shard: int, move: str) -> dict[str, Any]: ...

    async def shard_file(self, shard: int, move: str, path: str) -> Path: ...  # one manifest file
