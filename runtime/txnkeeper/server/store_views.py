"""The admin API's view of this pod's stores (transaction logs and pending-ack logs)."""

from __future__ import annotations

from typing import Any

from txnkeeper.pendingack import PendingAckStore
from txnkeeper.txnlog import TransactionLogStore


class _StoreViewBase:
    _store: TransactionLogStore | PendingAckStore
    kind = ""

    @property
    def name(self) -> str:
        return self._store.name

    def batched_write_stat(self) -> dict[str, Any]:
        return self._store.batched_write_stat()

    def internal_stats(self) -> dict[str, Any]:
        return self._store.internal_stats()

    async def rollover(self) -> int:
        return await self._store.rollover()

    async def ledger_report(self) -> dict[str, Any]:
        formats = await self._store.live_entry_formats()
        return {
            "name": self.name,
            "kind": self.kind,
            "ledgers": self._store.ledger_ids(),
            "oldestLiveLedger": self._store.oldest_live_ledger(),
            "currentLedger": self._store.current_ledger_id(),
            **formats.to_json(),
        }


class TxnLogView(_StoreViewBase):
    kind = "txnlog"

    def __init__(self, store: TransactionLogStore) -> None:
        self._store = store
        self.coordinator_id = store.coordinator_id

    def ref(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "coordinatorId": self.coordinator_id}


class PendingAckView(_StoreViewBase):
    kind = "pendingack"

    def __init__(self, store: PendingAckStore) -> None:
        self._store = store
        self.topic = store.topic
        self.subscription = store.subscription

    def ref(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "topic": self.topic, "subscription": self.subscription}
