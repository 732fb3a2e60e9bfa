"""A producer of one topic; sends are pipelined on the connection to the topic's store.

Given a ``producer_name`` the producer is idempotent (``idempotence.SequencedSends``: Pulsar's producer
name + sequence id), so a send re-sent after a lost receipt or a reconnect is written once.
``send_atomic`` (PDP-44's ``writeEvents``) writes several events as one block through a
``BlockAppender``: all of them or none, once, with contiguous message ids.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from txnkeeper.client.appender import DEFAULT_MAX_TXN_BYTES, MAX_EVENT_BYTES, BlockAppender
from txnkeeper.client.errors import ClientClosedError, MaxTransactionSizeExceededError
from txnkeeper.client.idempotence import SequencedSends
from txnkeeper.client.message import MessageId
from txnkeeper.client.transaction import Transaction
from txnkeeper.pb import txnkeeper_api_pb2 as api

if TYPE_CHECKING:
    from txnkeeper.client.placement import StoreRouter
    from txnkeeper.protocol.pool import ConnectionPool

DEFAULT_RESYNC_TIMEOUT = 30.0  # seconds a producer tries to get its unanswered sends answered


class Producer:
    def __init__(
        self,
        connections: ConnectionPool,
        topic: str,
        router: StoreRouter,
        *,
        producer_name: str | None = None,
        resync_timeout: float = DEFAULT_RESYNC_TIMEOUT,
    ) -> None:
        if producer_name is not None and not producer_name:
            raise ValueError("producer_name must not be empty (leave it out for a non-idempotent producer)")
        self._connections = connections
        self.topic = topic
        self._router = router
        self.producer_name = producer_name
        self._resync_timeout = resync_timeout
        self._sequenced: SequencedSends | None = None
        # send_atomic's writers, one per key (the store takes the key from the writer's session)
        self._appenders: dict[str, BlockAppender] = {}
        self._opening_appenders: dict[str, asyncio.Future[None]] = {}
        self._closed = False

    @property
    def store_address(self) -> str:
        """The store pod this producer's topic is served by now (redirects move it)."""
        return self._router.address(self.topic)

    @property
    def last_sequence_id(self) -> int:
        """The sequence id of the latest send of a named producer (they start at 0; -1: none yet)."""
        return self._sequenced.last_sequence_id if self._sequenced is not None else -1

    async def open_sequenced(self) -> None:
        """Make a named producer's sends idempotent: take the name on the store (fencing any older
        producer of it) and continue after the name's last persisted sequence id."""
        assert self.producer_name is not None
        sequenced = SequencedSends(
            self._connections,
            self.topic,
            self._router,
            self.producer_name,
            resend_timeout=self._resync_timeout,
        )
        await sequenced.open()
        self._sequenced = sequenced

    def send(
        self, data: bytes, *, key: str = "", txn: Transaction | None = None
    ) -> asyncio.Future[MessageId]:
        """Write one message; the future resolves once it is durable (inside ``txn``: visible when it
        commits). Sent at the call (after the transaction registered the partition with its
        coordinator), so sends started together are pipelined without a task each."""
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"message data must be bytes, not {type(data).__name__}")
        if txn is None and self._sequenced is not None:
            return self._sequenced.send(bytes(data), key)
        # Filled in place (passing a built Produce as an argument would copy it, payload included).
        command = api.Command()
        body = command.produce
        body.topic = self.topic
        body.payload = bytes(data)
        body.key = key
        router = self._router
        if txn is None:
            return router.request_then(self.topic, command, _receipt)
        registration = txn.partition_registration(self.topic, self.store_address)

        def produce() -> Awaitable[api.Command]:
            body.txn_id.CopyFrom(txn.pb_id)
            body.ticket.CopyFrom(txn.ticket(registration, self.topic, ""))
            return router.request(self.topic, command)

        return txn.operation(registration, produce, _receipt)

    async def send_atomic(self, events: list[bytes], *, key: str = "") -> list[MessageId]:
        """Write ``events`` as one block (PDP-44's ``writeEvents``): the store applies all of them or
        none, once, with contiguous message ids (returned in order) and ``key`` as each one's key.
        Calls on one producer are applied in call order, one block on the wire at a time."""
        self._check_open()
        if not events:
            raise ValueError("send_atomic needs at least one event")
        payloads: list[bytes] = []
        for event in events:
            if not isinstance(event, bytes | bytearray | memoryview):
                raise TypeError(f"event data must be bytes, not {type(event).__name__}")
            if len(event) > MAX_EVENT_BYTES:
                raise ValueError(f"an event is at most {MAX_EVENT_BYTES} bytes (one frame), got {len(event)}")
            payloads.append(bytes(event))
        size = sum(len(p) for p in payloads)
        if size > DEFAULT_MAX_TXN_BYTES:
            raise MaxTransactionSizeExceededError(
                f"send_atomic of {size} bytes is above the {DEFAULT_MAX_TXN_BYTES}-byte limit of a block: "
                "nothing was sent; split the events into several calls"
            )
        appender = await self._block_appender(key)
        return await appender.append(payloads)

    async def _block_appender(self, key: str) -> BlockAppender:
        """The writer id for ``send_atomic`` with ``key``: one per key (the key is the writer's)."""
        appenders = self._appenders
        appender = appenders.get(key)
        if appender is None:
            appender = BlockAppender(
                self._connections,
                self.topic,
                self._router,
                uuid.uuid4().hex,
                key=key,
                resync_timeout=self._resync_timeout,
            )
            appenders[key] = appender
            opening: asyncio.Future[None] = asyncio.ensure_future(appender.open())
            self._opening_appenders[key] = opening
        else:
            opening = self._opening_appenders[key]
        try:
            await asyncio.shield(opening)
        except BaseException:
            if appenders.get(key) is appender and opening.done():
                del appenders[key]
            raise
        return appender

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"producer of {self.topic} is closed")

    async def abandon(self) -> None:
        """Stop at once (the client is closing): unanswered sends and blocks fail with
        ``ClientClosedError`` (their outcome is unknown)."""
        self._closed = True
        if self._sequenced is not None:
            await self._sequenced.close()
        for appender in self._appenders.values():
            await appender.close()

    async def close(self) -> None:
        """Stop sending; waits for the answers of sends and blocks already sent."""
        self._closed = True
        if self._sequenced is not None:
            await self._sequenced.drained()
            await self._sequenced.close()
        for appender in self._appenders.values():
            await appender.drained()
            await appender.close()


def _receipt(response: api.Command) -> MessageId:
    return MessageId.from_pb(response.produce_receipt.message_id)
