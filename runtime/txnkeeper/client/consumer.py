"""A consumer of one subscription (shared): messages are pushed by the store within granted permits.

The consumer grants ``receiver_queue_size`` permits and tops them up as the application receives. If
its connection is lost it resubscribes with backoff, dropping its local queue (the store redelivers
everything that was not acknowledged). When the store cannot read the subscription's next entries
(offloaded tier data damaged or unreachable) it says so (a ConsumerError push, repeated while it lasts):
``receive`` raises that error (``DataUnreadableError``, naming the position) once the messages received
before it were handed out, and returns messages again when the store resumes delivery.

When the topic moves to another store pod (placement, contracts §12), a subscribe is redirected to the
pod that serves it now; a consumer whose pod stops serving the topic (its connection closed for the
move, a ``NOT_SERVED_HERE`` push, or an ack refused that way) resubscribes there as after a lost
connection, and a refused ack is sent again once it has (the moved subscription knows the message ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from txnkeeper.client.errors import ClientClosedError
from txnkeeper.client.message import Message, MessageId
from txnkeeper.client.placement import MAX_HOPS, following, is_placement, same
from txnkeeper.client.transaction import Transaction
from txnkeeper.errors import NotServedHereError, ServiceError, UnavailableError, from_error_frame
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection

if TYPE_CHECKING:
    from txnkeeper.client.placement import StoreRouter
    from txnkeeper.protocol.pool import ConnectionPool

log = logging.getLogger(__name__)

RESUBSCRIBE_BACKOFF = (0.05, 1.0)
T = TypeVar("T")


class Consumer:
    def __init__(
        self,
        connections: ConnectionPool,
        topic: str,
        subscription: str,
        *,
        router: StoreRouter,
        consumer_id: int,
        queue_size: int,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"receiver_queue_size must be >= 1, got {queue_size}")
        self._connections = connections
        self.topic = topic
        self.subscription = subscription
        self._router = router
        self.consumer_id = consumer_id
        self._queue_size = queue_size
        # None: the store's error (``_error``) comes next; at most one is queued, the newest error wins.
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self._error: ServiceError | None = None
        self._conn: RpcConnection | None = None
        self._consumed_since_flow = 0
        self._closed = False
        self._resubscriber: asyncio.Task[None] | None = None

    @property
    def store_address(self) -> str:
        """The store pod the consumer's topic is served by now (redirects move it)."""
        return self._router.address(self.topic)

    async def subscribe(self) -> None:
        """Subscribe at the pod that serves the topic (following redirects, waiting out a move)."""
        what = f"subscription {self.subscription!r} of {self.topic}"
        await self._router.at_owner(self.topic, self._subscribe_at, what)

    async def _subscribe_at(self, address: str) -> None:
        conn = await self._connections.get(address)
        # Messages may arrive in the same read as the Subscribe response, before this coroutine
        # resumes: the consumer must already accept pushes from this connection.
        self._conn = conn
        self._consumed_since_flow = 0
        try:
            await conn.request(
                api.Command(
                    subscribe=api.Subscribe(
                        topic=self.topic,
                        subscription=self.subscription,
                        consumer_id=self.consumer_id,
                        permits=self._queue_size,
                    )
                )
            )
        except BaseException:
            if self._conn is conn:
                self._conn = None
            raise
        conn.closed.add_done_callback(lambda _: self._connection_lost(conn))

    def _connection_lost(self, conn: RpcConnection) -> None:
        if self._closed or conn is not self._conn:
            return
        self._conn = None
        self._drop_queue()
        self._resubscriber = asyncio.get_running_loop().create_task(self._resubscribe())

    def _not_served(self, conn: RpcConnection, failure: NotServedHereError) -> None:
        """The pod behind ``conn`` no longer serves the topic: resubscribe where it is served."""
        if failure.owner_address:
            self._router.moved(self.topic, failure.owner_address)
        if conn is self._conn and not self._closed:
            log.info("%s/%s not served at %s now: %s", self.topic, self.subscription, conn.address, failure)
            self._connection_lost(conn)

    async def _resubscribe(self) -> None:
        delay = RESUBSCRIBE_BACKOFF[0]
        while not self._closed:
            try:
                await self.subscribe()
                return
            except ServiceError as exc:
                log.info("resubscribing %s/%s failed (%s); retrying", self.topic, self.subscription, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESUBSCRIBE_BACKOFF[1])

    def on_message(self, conn: RpcConnection, message: api.Message) -> None:
        """A message the store pushed (routed by consumer id); one from a stale connection is dropped."""
        if conn is not self._conn:
            return
        self._queue.put_nowait(
            Message(
                MessageId.from_pb(message.message_id),
                message.payload,
                message.key,
                message.topic or self.topic,
                message.redelivery_count,
            )
        )

    def on_error(self, conn: RpcConnection, failure: api.ConsumerError) -> None:
        """The store cannot read what comes next (pushed again while that lasts): ``receive`` raises it."""
        if conn is not self._conn:
            return
        error = from_error_frame(failure.error)
        if is_placement(error):
            assert isinstance(error, NotServedHereError)
            self._not_served(conn, error)
            return
        if not str(error):
            error = type(error)(
                f"the store cannot deliver what comes next on {self.topic} (subscription "
                f"{self.subscription!r}); it gave no reason",
                error.code,
            )
        if self._error is None:
            self._queue.put_nowait(None)
        self._error = error

    def _drop_queue(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
        self._error = None

    async def receive(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """The next message; raises TimeoutError after ``timeout`` seconds without one, and the store's
        ``DataUnreadableError`` when it cannot read the next entries (module docstring)."""
        if self._closed:
            raise ClientClosedError(f"consumer {self.subscription} of {self.topic} is closed")
        queue = self._queue
        if not queue.empty():
            # A queued message needs no waiting: no wait_for task and timer on the common path.
            message = queue.get_nowait()
        elif timeout is None:
            message = await queue.get()
        else:
            message = await asyncio.wait_for(queue.get(), timeout)
        if message is None:
            error, self._error = self._error, None
            assert error is not None
            raise error
        self._consumed_since_flow += 1
        if self._consumed_since_flow >= max(1, self._queue_size // 2) and self._conn is not None:
            self._conn.notify(
                api.Command(flow=api.Flow(consumer_id=self.consumer_id, permits=self._consumed_since_flow))
            )
            self._consumed_since_flow = 0
        return message

    def acknowledge(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> asyncio.Future[None]:
        """Acknowledge one message (inside ``txn``: pending until it commits); sent at the call, the
        future resolves once the store made the ack durable."""
        return self._ack([_id(message)], cumulative=False, txn=txn)

    def acknowledge_cumulative(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> asyncio.Future[None]:
        return self._ack([_id(message)], cumulative=True, txn=txn)

    def _ack(self, ids: list[MessageId], cumulative: bool, txn: Transaction | None) -> asyncio.Future[None]:
        command = api.Command()
        body = command.ack
        body.consumer_id = self.consumer_id
        for message_id in ids:
            added = body.message_ids.add()
            added.ledger_id = message_id.ledger_id
            added.entry_id = message_id.entry_id
        body.ack_type = api.CUMULATIVE if cumulative else api.INDIVIDUAL
        if txn is None:
            return self._request_ack(command, _nothing)
        registration = txn.subscription_registration(self.topic, self.subscription, self.store_address)

        def ack() -> Awaitable[api.Command]:
            body.txn_id.CopyFrom(txn.pb_id)
            body.ticket.CopyFrom(txn.ticket(registration, self.topic, self.subscription))
            return self._request_ack(command)

        return txn.operation(registration, ack, _nothing)

    def _request_ack(
        self,
        command: api.Command,
        convert: Callable[[api.Command], T] = same,  # type: ignore[assignment]
    ) -> asyncio.Future[T]:
        conn = self._conn
        if conn is None or not conn.is_open:
            # Typed and UNAVAILABLE: the application can tell "retry later" by the code.
            raise UnavailableError(
                f"consumer {self.subscription} of {self.topic} is reconnecting; ack again later"
            )
        return following(conn.request(command), partial(self._ack_where_served, conn, command), convert)

    async def _ack_where_served(
        self, conn: RpcConnection, command: api.Command, failure: NotServedHereError
    ) -> api.Command:
        """An ack refused because the pod stopped serving the topic: resubscribe where it is served
        now, then send the ack there (message ids are the same on the pod the topic moved to)."""
        timeout = self._router.operation_timeout
        deadline = time.monotonic() + timeout
        for _ in range(MAX_HOPS + 1):
            self._not_served(conn, failure)
            resubscriber = self._resubscriber
            try:
                if resubscriber is not None and not resubscriber.done():
                    left = max(0.0, deadline - time.monotonic())
                    await asyncio.wait_for(asyncio.shield(resubscriber), left)
            except TimeoutError:
                pass
            current = self._conn
            if current is None or not current.is_open:
                raise UnavailableError(
                    f"consumer {self.subscription} of {self.topic} is still resubscribing where the topic "
                    f"is served now ({failure}); ack again later"
                )
            try:
                return await current.request(command, timeout)
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                conn, failure = current, exc
        raise failure

    async def redeliver_unacknowledged_messages(self) -> None:
        conn = self._conn
        if conn is None:
            return
        self._drop_queue()
        await conn.request(api.Command(redeliver=api.RedeliverUnacknowledged(consumer_id=self.consumer_id)))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._resubscriber is not None:
            self._resubscriber.cancel()
        conn = self._conn
        self._conn = None
        if conn is not None and conn.is_open:
            with contextlib.suppress(ServiceError):
                await conn.request(
                    api.Command(close_consumer=api.CloseConsumer(consumer_id=self.consumer_id))
                )


def _id(message: Message | MessageId) -> MessageId:
    return message.message_id if isinstance(message, Message) else message


def _nothing(response: api.Command) -> None:
    return None
