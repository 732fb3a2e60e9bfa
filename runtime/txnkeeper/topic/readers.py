"""Readers: Pulsar's non-durable subscriptions, kept in memory only.

Why: a Pulsar ``Reader`` (and any consumer with ``durable=false``) reads a topic from a position it
chooses without leaving state behind: nothing is persisted, no pending-ack log exists, the topic's
ledgers are not held for it, and it ends with its connection. It is dispatched exactly like a durable
subscription (the same ``Subscription``: markers skipped, aborted messages skipped, open transactions
waited for), over a cursor that lives in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from txnkeeper.aio import resolved
from txnkeeper.errors import BadRequestError
from txnkeeper.ledger.ackset import mask_without
from txnkeeper.ledger.cursor import CursorState, LedgerLayout
from txnkeeper.ledger.position import Position
from txnkeeper.topic.ports import IndexAck
from txnkeeper.txnid import TxnID


class ReaderCursor:
    """An in-memory cursor (the ``Cursor`` a subscription uses), starting after ``start``."""

    def __init__(self, layout: LedgerLayout, start: Position) -> None:
        self._layout = layout
        self._state = CursorState(start)

    def mark_delete_position(self) -> Position | None:
        return self._state.mark_delete

    def is_deleted(self, position: Position) -> bool:
        return self._state.is_deleted(position)

    def holds(self, position: Position) -> bool:
        return 0 <= position.entry_id < self._layout.confirmed_entries(position.ledger_id)

    async def mark_delete(self, position: Position) -> None:
        if position > self._state.mark_delete:
            self._state.set_mark_delete(position)

    async def delete(self, positions: Iterable[Position]) -> None:
        for position in positions:
            self._state.delete_entry(position)
        self._state.advance(self._layout)

    async def reset(self, position: Position) -> None:
        self._state = CursorState(position)

    def ack_set(self, position: Position) -> list[int] | None:
        return self._state.ack_set(position)

    async def delete_round(
        self, positions: Iterable[Position], batch_indexes: Iterable[tuple[Position, int, Iterable[int]]]
    ) -> None:
        for position in positions:
            self._state.delete_entry(position)
        for position, batch_size, indexes in batch_indexes:
            if not self._state.is_deleted(position):
                self._state.keep_indexes(position, mask_without(batch_size, indexes), batch_size)
        self._state.advance(self._layout)


class ReaderAcks:
    """A reader's pending-ack log: there is none, so transactional acks are refused."""

    def log_ack(
        self,
        txn_id: TxnID,
        positions: list[Position],
        cumulative: bool,
        index_acks: list[IndexAck] | None = None,
    ) -> asyncio.Future[Any]:
        raise BadRequestError(
            "a reader (non-durable subscription) cannot acknowledge in a transaction: use a durable"
            " subscription"
        )

    def log_end(self, txn_id: TxnID, commit: bool) -> asyncio.Future[Any]:
        return resolved(None)

    async def delete_txn(self, txn_id: TxnID) -> None:
        return None

    async def delete_txns(self, txn_ids: list[TxnID]) -> None:
        return None
