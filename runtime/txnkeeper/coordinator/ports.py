"""What the coordinator needs from below (its log) and from the edge (reaching stores).

Why ports: the coordinator's rules are tested without disks or sockets, and the service never imports
the protocol layer above it; the server wires a store-backed log and a network sink into these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from txnkeeper.coordinator.state import TxnStatus
from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb


@dataclass(slots=True)
class RecoveredTxn:
    """A transaction as the log replay left it (not yet deleted, so not wholly ended)."""

    txn_id: TxnID
    status: TxnStatus
    timeout_ms: int
    start_time_ms: int
    last_modification_ms: int
    partitions: list[str] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)


class TxnLog(Protocol):
    """The coordinator's transaction log (a TransactionLogStore underneath)."""

    def append(self, entry: meta_pb.TransactionMetadataEntry) -> Awaitable[object]: ...

    async def delete_txn(self, txn_id: TxnID) -> None: ...

    async def delete_txns(self, txn_ids: list[TxnID]) -> None: ...


class EndTxnSink(Protocol):
    """Delivers the end of a transaction to one store pod: every partition (``topics``) and
    subscription of it that the pod serves, in one request (success once all have applied it)."""

    def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
    ) -> Awaitable[object]: ...
