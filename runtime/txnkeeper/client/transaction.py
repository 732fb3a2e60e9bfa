"""A client-side transaction: registers partitions and subscriptions with its coordinator before
using them, tracks its in-flight operations, and commits only when every one of them succeeded.

Why the bookkeeping: the coordinator can only end a transaction on partitions and subscriptions it
knows, and a commit must not race an unfinished send or ack; if any operation failed (for example an
ack conflict), committing would lose that operation, so ``commit`` aborts instead and says why.

The transaction's coordinator id may move to another coordinator pod while it is open (placement,
contracts §12): a request answered ``NOT_SERVED_HERE`` goes to the owner it names (and the transaction
remembers that pod), or, while the id is being moved, again after a short wait. Nothing refused was
applied, so re-sending an add or an end there is safe (an end is idempotent anyway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar, cast

from txnkeeper.aio import failure_of, settle
from txnkeeper.client.errors import TransactionFailedError
from txnkeeper.client.futures import converted
from txnkeeper.client.placement import Redirects, following, is_placement
from txnkeeper.errors import InvalidTxnStatusError, NotServedHereError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.txnid import TxnID

if TYPE_CHECKING:
    from txnkeeper.protocol.pool import ConnectionPool

T = TypeVar("T")


class Transaction:
    """Begun with ``Client.new_transaction``; pass it to ``send`` and ``acknowledge``."""

    def __init__(
        self,
        connections: ConnectionPool,
        txn_id: TxnID,
        coordinator_address: str,
        owner_token: bytes = b"",
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        operation_timeout: float = 30.0,
    ) -> None:
        self._connections = connections
        self._operation_timeout = operation_timeout
        # The loop its futures belong to (``loop`` saves asking asyncio, a getpid() system call, for
        # every operation; a Transaction lives on the loop it was begun on).
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self.txn_id = txn_id
        # Proves to the coordinator that this client began the txn (sent with every add and the end).
        self.owner_token = owner_token
        self.coordinator_address = coordinator_address
        self._registered: dict[object, asyncio.Future[api.Command]] = {}
        self._in_flight = 0
        # Created only when an end has to wait for operations still in flight (rarely: callers
        # usually await their sends and acks first), not an Event per transaction.
        self._idle_waiter: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self.state = "OPEN"
        self._end_attempt: bool | None = None
        self._pb: api.TxnId | None = None
        # The registration made with the begin, and its tickets by (topic, subscription or "").
        self._begun: asyncio.Future[api.Command] | None = None
        self._begun_tickets: dict[tuple[str, str], api.TxnTicket] = {}
        # (topic, subscription or None, store address, registration) not sent yet
        self._unsent: list[tuple[str, str | None, str, asyncio.Future[api.Command]]] = []

    def __repr__(self) -> str:
        return f"Transaction{self.txn_id}[{self.state}]"

    @property
    def pb_id(self) -> api.TxnId:
        """The id as the wire carries it (producers and consumers copy it into their requests)."""
        # Built once: every request of the transaction copies it into its own message.
        pb = self._pb
        if pb is None:
            pb = self._pb = api.TxnId(most=self.txn_id.most, least=self.txn_id.least)
        return pb

    def _check_open(self) -> None:
        if self.state != "OPEN":
            raise InvalidTxnStatusError(f"transaction {self.txn_id} is {self.state}")

    def registered_at_begin(self, store_address: str, begun: api.Command) -> None:
        """Record the partitions/subscriptions the coordinator registered with the begin (NewTxn with
        topics/subscriptions; ``begun`` is its response): their sends and acks use its tickets without
        an AddToTxn. One resolved registration shared by all, read in place (no copy of the tickets)."""
        registration: asyncio.Future[api.Command] = self._loop.create_future()
        registration.set_result(begun)
        self._begun = registration
        registered = self._registered
        tickets = self._begun_tickets
        for ticket in begun.new_txn_response.tickets:
            topic, subscription = ticket.topic, ticket.subscription
            tickets[(topic, subscription)] = ticket
            if subscription:
                registered[("s", topic, subscription)] = registration
            else:
                registered[("p", topic)] = registration

    def partition_registration(self, topic: str, store_address: str) -> asyncio.Future[api.Command]:
        """Registers ``topic`` with the coordinator once per transaction; a send waits on the future."""
        return self._registration(("p", topic), topic, None, store_address)

    def subscription_registration(
        self, topic: str, subscription: str, store_address: str
    ) -> asyncio.Future[api.Command]:
        """Registers the subscription with the coordinator once per transaction; an ack waits on it."""
        return self._registration(("s", topic, subscription), topic, subscription, store_address)

    def _registration(
        self, key: object, topic: str, subscription: str | None, store_address: str
    ) -> asyncio.Future[api.Command]:
        """The (shared) registration of a partition or subscription with the coordinator: sent once
        per transaction, again only if an earlier attempt failed.

        Registrations asked for in the same event-loop turn (a send and an ack started together) go
        out as one AddToTxn per store pod at the end of the turn: one request instead of two.
        """
        self._check_open()
        existing = self._registered.get(key)
        if existing is not None and not (
            existing.done() and (existing.cancelled() or existing.exception() is not None)
        ):
            return existing
        registration: asyncio.Future[api.Command] = self._loop.create_future()
        self._registered[key] = registration
        if not self._unsent:
            self._loop.call_soon(self._send_registrations)
        self._unsent.append((topic, subscription, store_address, registration))
        return registration

    def _send_registrations(self) -> None:
        unsent, self._unsent = self._unsent, []
        by_store: dict[str, api.AddToTxn] = {}
        waiting: dict[str, list[asyncio.Future[api.Command]]] = {}
        for topic, subscription, store_address, registration in unsent:
            body = by_store.get(store_address)
            if body is None:
                body = by_store[store_address] = api.AddToTxn(
                    store_address=store_address, owner_token=self.owner_token
                )
                body.txn_id.CopyFrom(self.pb_id)
                waiting[store_address] = []
            if subscription is None:
                body.topics.append(topic)
            else:
                ref = body.subscriptions.add()
                ref.topic = topic
                ref.subscription = subscription
            waiting[store_address].append(registration)
        for store_address, body in by_store.items():
            registrations = waiting[store_address]
            try:
                response = self.coordinator_request(api.Command(add_to_txn=body))
            except Exception as exc:
                _settle_all(registrations, exc, None)
                continue
            response.add_done_callback(partial(_registered, registrations))

    def coordinator_request(self, command: api.Command) -> asyncio.Future[api.Command]:
        """Send ``command`` to the transaction's coordinator, following it when its id moved."""
        first = self._connections.request(self.coordinator_address, command)
        return following(first, partial(self._follow_coordinator, command))

    async def _follow_coordinator(self, command: api.Command, failure: NotServedHereError) -> api.Command:
        what = f"{command.WhichOneof('body')} of transaction {self.txn_id}"
        redirects = Redirects(what, self._operation_timeout)
        while True:
            owner = await redirects.after(failure)
            if owner is not None:
                self.coordinator_address = owner
            try:
                return await self._connections.request(self.coordinator_address, command)
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                failure = exc

    def ticket(
        self, registration: asyncio.Future[api.Command], topic: str, subscription: str
    ) -> api.TxnTicket:
        """The coordinator's ticket for ``topic`` (and ``subscription``) from a resolved registration
        (the store refuses a transactional produce or ack without it)."""
        if registration is self._begun:
            found = self._begun_tickets.get((topic, subscription))
            if found is not None:
                return found
        granted = registration.result()
        tickets = (
            granted.txn_tickets.tickets
            if granted.WhichOneof("body") == "txn_tickets"
            else granted.new_txn_response.tickets
        )
        for ticket in tickets:
            if ticket.topic == topic and ticket.subscription == subscription:
                return ticket
        return api.TxnTicket()  # the store says what is missing

    def operation(
        self,
        registration: asyncio.Future[api.Command],
        send: Callable[[], Awaitable[api.Command]],
        convert: Callable[[api.Command], T],
    ) -> asyncio.Future[T]:
        """Run one send or ack of this transaction: once ``registration`` succeeded, ``send()``; the
        future resolves to ``convert(response)``.

        Chained by callbacks (no coroutine or task per operation), and counted in flight from the
        call until the response, so ``commit`` waits for it. An operation that failed, or whose
        caller cancelled the returned future, makes ``commit`` abort instead (the caller cannot know
        whether it took effect).
        """
        self.op_started()
        result: asyncio.Future[T] = self._loop.create_future()
        if registration.done():
            # Registered already (with the begin, or by an earlier operation): sent now, not from a
            # callback a loop turn later.
            self._registered_then(send, convert, result, registration)
        else:
            registration.add_done_callback(partial(self._registered_then, send, convert, result))
        return result

    def _registered_then(
        self,
        send: Callable[[], Awaitable[api.Command]],
        convert: Callable[[api.Command], T],
        result: asyncio.Future[T],
        registration: asyncio.Future[api.Command],
    ) -> None:
        failure = failure_of(registration)
        if failure is None:
            try:
                response = asyncio.ensure_future(send())
            except Exception as exc:
                failure = exc
            else:
                response.add_done_callback(partial(self._responded, convert, result))
                return
        self._operation_done(result, failure, None)

    def _responded(
        self,
        convert: Callable[[api.Command], T],
        result: asyncio.Future[T],
        response: asyncio.Future[api.Command],
    ) -> None:
        failure, value = converted(convert, response)
        self._operation_done(result, failure, value)

    def _operation_done(
        self, result: asyncio.Future[T], failure: BaseException | None, value: T | None
    ) -> None:
        if failure is None and result.cancelled():
            failure = asyncio.CancelledError()
        self.op_finished(failure)
        settle(result, failure, cast(T, value))

    def op_started(self) -> None:
        self._check_open()
        self._in_flight += 1

    def op_finished(self, failure: BaseException | None) -> None:
        if failure is not None and self._failure is None:
            self._failure = failure
        self._in_flight -= 1
        waiter = self._idle_waiter
        if self._in_flight == 0 and waiter is not None:
            self._idle_waiter = None
            settle(waiter, None, None)

    async def _operations_done(self) -> None:
        """Wait until no send or ack of this transaction is in flight."""
        while self._in_flight:
            waiter = self._idle_waiter
            if waiter is None:
                waiter = self._idle_waiter = self._loop.create_future()
            await asyncio.shield(waiter)  # a cancelled end must not cancel the shared waiter

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
        if self._in_flight:
            await self._operations_done()
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
        if self._in_flight:
            await self._operations_done()
        await self._end(commit=False)

    async def _end(self, commit: bool) -> None:
        self._end_attempt = commit
        command = api.Command()
        body = command.end_txn
        body.txn_id.CopyFrom(self.pb_id)
        body.action = api.COMMIT if commit else api.ABORT
        body.owner_token = self.owner_token
        try:
            await self.coordinator_request(command)
        except ServiceError:
            self.state = "ERROR"
            raise
        self.state = "COMMITTED" if commit else "ABORTED"


def _registered(
    registrations: list[asyncio.Future[api.Command]], response: asyncio.Future[api.Command]
) -> None:
    failure = failure_of(response)
    _settle_all(registrations, failure, None if failure is not None else response.result())


def _settle_all(
    registrations: list[asyncio.Future[api.Command]], failure: BaseException | None, value: api.Command | None
) -> None:
    for registration in registrations:
        settle(registration, failure, cast(api.Command, value))
