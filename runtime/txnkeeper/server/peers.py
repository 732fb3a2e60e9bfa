"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else, so many ends to one store share a connection and its coalesced writes.
"""

from __future__ import annotations

from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.pool import ConnectionPool

REQUEST_TIMEOUT = 30.0


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self) -> None:
        self._pool = ConnectionPool(REQUEST_TIMEOUT)

    async def _request(self, address: str, command: api.Command) -> None:
        await self._pool.request(address, command)

    async def end_on_partition(self, address: str, topic: str, txn_id: TxnID, commit: bool) -> None:
        body = api.EndTxnOnPartition(topic=topic, txn_id=api.TxnId(most=txn_id.most, least=txn_id.least))
        body.action = api.COMMIT if commit else api.ABORT
        await self._request(address, api.Command(end_txn_on_partition=body))

    async def end_on_subscription(
        self, address: str, topic: str, subscription: str, txn_id: TxnID, commit: bool
    ) -> None:
        body = api.EndTxnOnSubscription(
            topic=topic, subscription=subscription, txn_id=api.TxnId(most=txn_id.most, least=txn_id.least)
        )
        body.action = api.COMMIT if commit else api.ABORT
        await self._request(address, api.Command(end_txn_on_subscription=body))

    async def close(self) -> None:
        await self._pool.close()
