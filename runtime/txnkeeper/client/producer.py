"""A producer of one topic; sends are pipelined on the connection to the topic's store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from txnkeeper.client.errors import ClientClosedError
from txnkeeper.client.message import MessageId
from txnkeeper.client.transaction import Transaction
from txnkeeper.pb import txnkeeper_api_pb2 as api

if TYPE_CHECKING:
    from txnkeeper.client.client import Client


class Producer:
    def __init__(self, client: Client, topic: str, store_address: str) -> None:
        self._client = client
        self.topic = topic
        self.store_address = store_address
        self._closed = False

    async def send(self, data: bytes, *, key: str = "", txn: Transaction | None = None) -> MessageId:
        """Write one message; returns once durable (inside ``txn``: visible when it commits)."""
        if self._closed:
            raise ClientClosedError(f"producer of {self.topic} is closed")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"message data must be bytes, not {type(data).__name__}")
        body = api.Produce(topic=self.topic, payload=bytes(data), key=key)
        if txn is None:
            response = await self._client.connections.request(self.store_address, api.Command(produce=body))
            return MessageId.from_pb(response.produce_receipt.message_id)
        txn.op_started()
        failure: BaseException | None = None
        try:
            await txn.register_partition(self.topic, self.store_address)
            body.txn_id.most = txn.txn_id.most
            body.txn_id.least = txn.txn_id.least
            response = await self._client.connections.request(self.store_address, api.Command(produce=body))
            return MessageId.from_pb(response.produce_receipt.message_id)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            txn.op_finished(failure)

    async def close(self) -> None:
        self._closed = True
