"""Idempotent sends of a named producer (Pulsar's producer name + sequence id de-duplication).

Why: a plain send whose receipt is lost (connection cut, store killed) leaves the application two bad
choices, send again (maybe twice) or not (maybe never). A named producer numbers its sends; the store
remembers the last sequence id it persisted for the name and answers a send at or below it as a
duplicate without writing. So this class re-sends every unanswered send after a reconnect with the
same sequence id, and the application's send resolves once, with the message's id.

Sequence ids continue from the store's record for the name, learned when the producer opens (a
restarted application keeps its name and so its de-duplication).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from txnkeeper.client.errors import ClientClosedError
from txnkeeper.client.message import MessageId
from txnkeeper.errors import ConnectionClosedError, RequestTimeoutError, ServiceError, UnavailableError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection

if TYPE_CHECKING:
    from txnkeeper.protocol.pool import ConnectionPool

log = logging.getLogger(__name__)

RESEND_BACKOFF = (0.05, 1.0)  # seconds: first retry, cap
_DOUBTFUL = (ConnectionClosedError, RequestTimeoutError, UnavailableError)
# What a duplicate resolves to when the store no longer knows the original message's id (Pulsar's
# client does the same: the send is known to be persisted, its position is not).
UNKNOWN_MESSAGE_ID = MessageId(-1, -1)


class SequencedSends:
    """Sends of producer ``producer_name`` to ``topic``, each with the next sequence id."""

    def __init__(
        self,
        connections: ConnectionPool,
        topic: str,
        store_address: str,
        producer_name: str,
        *,
        resend_timeout: float,
    ) -> None:
        self._connections = connections
        self.topic = topic
        self.store_address = store_address
        self.producer_name = producer_name
        self._resend_timeout = resend_timeout
        self.last_sequence_id = -1  # the last sequence id assigned (they start at 0)
        self._unanswered: OrderedDict[int, tuple[api.Command, asyncio.Future[MessageId]]] = OrderedDict()
        self._conn: RpcConnection | None = None
        self._session = 0
        self._resending: asyncio.Task[None] | None = None
        self._doubt_since: float | None = None  # when the oldest unanswered doubt began
        self._failure: ServiceError | None = None

    async def open(self, last_persisted: int) -> None:
        """Continue after ``last_persisted``, the store's last sequence id for the name (-1: none)."""
        self.last_sequence_id = last_persisted
        self._use(await self._connections.get(self.store_address))

    def send(self, payload: bytes, key: str) -> asyncio.Future[MessageId]:
        if self._failure is not None:
            raise self._failure
        self.last_sequence_id += 1
        sequence_id = self.last_sequence_id
        command = api.Command()
        body = command.produce
        body.topic = self.topic
        body.payload = payload
        body.key = key
        body.producer_name = self.producer_name
        body.sequence_id = sequence_id
        result: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        self._unanswered[sequence_id] = (command, result)
        conn = self._conn
        if self._resending is None and conn is not None and conn.is_open:
            self._send(conn, sequence_id, command)
        else:
            self._start_resend()
        return result

    def _use(self, conn: RpcConnection) -> None:
        self._conn = conn
        self._session += 1
        conn.closed.add_done_callback(lambda _: self._lost(conn))

    def _send(self, conn: RpcConnection, sequence_id: int, command: api.Command) -> None:
        session = self._session
        conn.request(command, self._resend_timeout).add_done_callback(
            lambda response: self._answered(session, sequence_id, response)
        )

    def _answered(self, session: int, sequence_id: int, response: asyncio.Future[api.Command]) -> None:
        failure = asyncio.CancelledError() if response.cancelled() else response.exception()
        if session != self._session or sequence_id not in self._unanswered:
            return  # sent again on a newer session; that answer counts
        if isinstance(failure, _DOUBTFUL):
            self._start_resend()
            return
        _, result = self._unanswered.pop(sequence_id)
        self._doubt_since = None
        if failure is not None:
            result.set_exception(failure)
            result.exception()
            return
        receipt = response.result().produce_receipt
        if receipt.HasField("message_id"):
            message_id = MessageId.from_pb(receipt.message_id)
        else:
            message_id = UNKNOWN_MESSAGE_ID
        if not result.done():
            result.set_result(message_id)

    def _lost(self, conn: RpcConnection) -> None:
        if conn is self._conn:
            self._conn = None
            if self._unanswered and self._failure is None:
                self._start_resend()

    def _start_resend(self) -> None:
        if self._resending is None and self._failure is None:
            self._conn = None
            self._session += 1
            self._resending = asyncio.get_running_loop().create_task(self._resend())

    async def _resend(self) -> None:
        if self._doubt_since is None:
            self._doubt_since = time.monotonic()
        deadline = self._doubt_since + self._resend_timeout
        delay = RESEND_BACKOFF[0]
        while True:
            try:
                if time.monotonic() > deadline:
                    raise RequestTimeoutError("its sends got no answer in time")
                conn = await self._connections.get(self.store_address)
                break
            except _DOUBTFUL as exc:
                if time.monotonic() + delay > deadline:
                    self._resending = None
                    self._fail(
                        RequestTimeoutError(
                            f"producer {self.producer_name} of {self.topic}: no answer from "
                            f"{self.store_address} within {self._resend_timeout}s ({exc}); the outcome "
                            "of its unanswered sends is unknown (a producer with the same name sending "
                            "them again writes each at most once)"
                        )
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESEND_BACKOFF[1])
        self._resending = None
        self._use(conn)
        # In sequence order, with their original sequence ids: the store de-duplicates those it holds.
        for sequence_id, (command, _) in list(self._unanswered.items()):
            self._send(conn, sequence_id, command)
        log.info("producer %s of %s: re-sent %d sends", self.producer_name, self.topic, len(self._unanswered))

    def _fail(self, failure: ServiceError) -> None:
        if self._failure is None:
            self._failure = failure
        unanswered, self._unanswered = self._unanswered, OrderedDict()
        for _, result in unanswered.values():
            if not result.done():
                result.set_exception(failure)
                result.exception()

    async def drained(self) -> None:
        if self._unanswered:
            await asyncio.wait([result for _, result in self._unanswered.values()])

    async def close(self) -> None:
        if self._failure is None:
            self._failure = ClientClosedError(f"producer {self.producer_name} of {self.topic} is closed")
        if self._resending is not None:
            self._resending.cancel()
        self._fail(self._failure)
