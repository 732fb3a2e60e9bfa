"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else, so many ends to one store share a connection and its coalesced writes.
"""

from __future__ import annotations

import asyncio

from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection, connect

REQUEST_TIMEOUT = 30.0


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self) -> None:
        self._connections: dict[str, RpcConnection] = {}
        self._connecting: dict[str, asyncio.Future[RpcConnection]] = {}

    async def _connection(self, address: str) -> RpcConnection:
        conn = self._connections.get(address)
        if conn is not None and conn.is_open:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[RpcConnection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            conn = await connect(address)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._connecting[address]
        self._connections[address] = conn
        future.set_result(conn)
        return conn

    async def _request(self, address: str, command: api.Command) -> None:
        conn = await self._connection(address)
        await conn.request(command, REQUEST_TIMEOUT)

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
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()
