"""A producer of one topic; sends are pipelined on the connection to the topic's store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from txnkeeper.client.errors import ClientClosedError
from txnkeeper.client.futures import then
from txnkeeper.client.message import MessageId
from txnkeeper.client.transaction import Transaction
from txnkeeper.pb import txnkeeper_api_pb2 as api

if TYPE_CHECKING:
    from txnkeeper.protocol.pool import ConnectionPool


class Producer:
    def __init__(self, connections: ConnectionPool, topic: str, store_address: str) -> None:
        self._connections = connections
        self.topic = topic
        self.store_address = store_address
        self._closed = False

    def send(
        self, data: bytes, *, key: str = "", txn: Transaction | None = None
    ) -> asyncio.Future[MessageId]:
        """Write one message; the future resolves once it is durable (inside ``txn``: visible when it
        commits). Sent at the call (after the transaction registered the partition with its
        coordinator), so sends started together are pipelined without a task each."""
        if self._closed:
            raise ClientClosedError(f"producer of {self.topic} is closed")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"message data must be bytes, not {type(data).__name__}")
        # Filled in place (passing a built Produce as an argument would copy it, payload included).
        command = api.Command()
        body = command.produce
        body.topic = self.topic
        body.payload = bytes(data)
        body.key = key
        connections = self._connections
        if txn is None:
            return then(connections.request(self.store_address, command), _receipt)
        registration = txn.partition_registration(self.topic, self.store_address)

        def produce() -> Awaitable[api.Command]:
            body.txn_id.CopyFrom(txn.pb_id)
            body.ticket.CopyFrom(txn.ticket(registration, self.topic, ""))
            return connections.request(self.store_address, command)

        return txn.operation(registration, produce, _receipt)

    async def close(self) -> None:
        self._closed = True


def _receipt(response: api.Command) -> MessageId:
    return MessageId.from_pb(response.produce_receipt.message_id)
