"""A client-side transaction: registers partitions and subscriptions with its coordinator before
using them, tracks its in-flight operations, and commits only when every one of them succeeded.

Why the bookkeeping: the coordinator can only end a transaction on partitions and subscriptions it
knows, and a commit must not race an unfinished send or ack; if any operation failed (for example an
ack conflict), committing would lose that operation, so ``commit`` aborts instead and says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from txnkeeper.client.errors import TransactionFailedError
from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.errors import InvalidTxnStatusError, ServiceError

if TYPE_CHECKING:
    from txnkeeper.client.client import Client


class Transaction:
    """Begun with ``Client.new_transaction``; pass it to ``send`` and ``acknowledge``."""

    def __init__(self, client: Client, txn_id: TxnID, coordinator_address: str) -> None:
        self._client = client
        self.txn_id = txn_id
        self._coordinator = coordinator_address
        self._registered: dict[object, asyncio.Future[api.Command]] = {}
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: BaseException | None = None
        self.state = "OPEN"
        self._end_attempt: bool | None = None
        self._pb: api.TxnId | None = None

    def __repr__(self) -> str:
        return f"Transaction{self.txn_id}[{self.state}]"

    @property
    def _pb_id(self) -> api.TxnId:
        # Built once: every request of the transaction copies it into its own message.
        pb = self._pb
        if pb is None:
            pb = self._pb = api.TxnId(most=self.txn_id.most, least=self.txn_id.least)
        return pb

    def _check_open(self) -> None:
        if self.state != "OPEN":
            raise InvalidTxnStatusError(f"transaction {self.txn_id} is {self.state}")

    async def register_partition(self, topic: str, store_address: str) -> None:
        await self._register(
            ("p", topic),
            lambda: api.Command(
                add_partition=api.AddPartitionToTxn(
                    txn_id=self._pb_id, topics=[topic], store_address=store_address
                )
            ),
        )

    async def register_subscription(self, topic: str, subscription: str, store_address: str) -> None:
        await self._register(
            ("s", topic, subscription),
            lambda: api.Command(
                add_subscription=api.AddSubscriptionToTxn(
                    txn_id=self._pb_id,
                    subscriptions=[api.SubscriptionRef(topic=topic, subscription=subscription)],
                    store_address=store_address,
                )
            ),
        )

    async def _register(self, key: object, command: Callable[[], api.Command]) -> None:
        self._check_open()
        existing = self._registered.get(key)
        if existing is None:
            # The pool sends at the call and hands back the response future: no task per request.
            existing = asyncio.ensure_future(self._client.connections.request(self._coordinator, command()))
            self._registered[key] = existing
        elif existing.done() and not existing.cancelled() and existing.exception() is None:
            return
        try:
            # Shielded: the registration is shared by every operation on that topic, so one caller
            # giving up must not cancel it for the others.
            await asyncio.shield(existing)
        except BaseException:
            if self._registered.get(key) is existing:
                del self._registered[key]
            raise

    def op_started(self) -> None:
        self._check_open()
        self._in_flight += 1
        self._idle.clear()

    def op_finished(self, failure: BaseException | None) -> None:
        if failure is not None and self._failure is None:
            self._failure = failure
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def commit(self) -> None:
        """Commit once every send/ack of the transaction finished; aborts (and raises) if one failed.

        If a commit's outcome was unknown (an error reached the client, e.g. a timeout), calling commit
        again retries it: the coordinator answers a repeated end idempotently.
        """
        if self.state == "COMMITTED":
            return
        if self.state == "ERROR" and self._end_attempt is True:
            await self._end(commit=True)
            return
        self._check_open()
        self.state = "COMMITTING"
        await self._idle.wait()
        if self._failure is not None:
            self.state = "OPEN"
            cause = self._failure
            await self.abort()
            raise TransactionFailedError(
                f"transaction {self.txn_id} aborted: an operation failed: {cause}"
            ) from cause
        await self._end(commit=True)

    async def abort(self) -> None:
        if self.state == "ABORTED":
            return
        if self.state not in ("OPEN", "ERROR"):
            raise InvalidTxnStatusError(f"transaction {self.txn_id} is {self.state}")
        if self.state == "ERROR" and self._end_attempt is True:
            raise InvalidTxnStatusError(
                f"transaction {self.txn_id} was being committed; retry commit() instead"
            )
        self.state = "ABORTING"
        await self._idle.wait()
        await self._end(commit=False)

    async def _end(self, commit: bool) -> None:
        self._end_attempt = commit
        body = api.EndTxn(txn_id=self._pb_id)
        body.action = api.COMMIT if commit else api.ABORT
        try:
            await self._client.connections.request(self._coordinator, api.Command(end_txn=body))
        except ServiceError:
            self.state = "ERROR"
            raise
        self.state = "COMMITTED" if commit else "ABORTED"
