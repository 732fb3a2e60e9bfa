"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else, one ``EndTxnOnStore`` per store pod per transaction, so many ends to one store share a
connection and its coalesced writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.pool import ConnectionPool

REQUEST_TIMEOUT = 30.0


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self) -> None:
        self._pool = ConnectionPool(REQUEST_TIMEOUT)

    def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
    ) -> Awaitable[api.Command]:
        # Filled in place (passing built parts as arguments copies each of them).
        command = api.Command()
        body = command.end_txn_on_store
        body.txn_id.most = txn_id.most
        body.txn_id.least = txn_id.least
        body.action = api.COMMIT if commit else api.ABORT
        body.topics.extend(topics)
        for topic, subscription in subscriptions:
            ref = body.subscriptions.add()
            ref.topic = topic
            ref.subscription = subscription
        return self._pool.request(address, command)

    async def close(self) -> None:
        await self._pool.close()
