"""What the coordinator needs from below (its log) and from the edge (reaching stores).

Why ports: the coordinator's rules are tested without disks or sockets, and the service never imports
the protocol layer above it; the server wires a store-backed log and a network sink into these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from txnkeeper.coordinator.state import TxnMeta
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb
from txnkeeper.txnid import TxnID

# A transaction as the log replay left it (not yet deleted, so not wholly ended). The replay builds it
# with lists of its own, and the coordinator adopts it as its live state as it is.
RecoveredTxn = TxnMeta


class TxnLog(Protocol):
    """The coordinator's transaction log (a TransactionLogStore underneath)."""

    def append(self, entry: meta_pb.TransactionMetadataEntry) -> Awaitable[object]: ...

    def append_all(self, entries: Sequence[meta_pb.TransactionMetadataEntry]) -> Sequence[Awaitable[object]]:
        """Records of one transaction, in order (one ``append`` each); each one's awaitable."""

    async def delete_txn(self, txn_id: TxnID) -> None: ...

    async def delete_txns(self, txn_ids: list[TxnID]) -> None: ...


class EndTxnSink(Protocol):
    """Delivers the end of a transaction to one store pod: every partition (``topics``) and
    subscription of it that the pod serves, in one request (success once all have applied it).
    ``deadline_ms`` is the txn's timeout deadline: the store fences the txn out of what it does not hold
    until then."""

    def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
        *,
        deadline_ms: int = 0,
    ) -> Awaitable[object]: ...

    def end_on_store_then(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        ends: tuple[Sequence[str], Sequence[tuple[str, str]], int],
        then: Callable[[BaseException | None], None],
    ) -> None:
        """``end_on_store`` (``ends``: topics, subscriptions, deadline) that calls ``then(None)``
        once the store applied it, or ``then(error)``, instead of resolving a future: the usual end
        costs no future and no callback turn of its own."""
