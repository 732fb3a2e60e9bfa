"""Routes protocol commands to the coordinators and the topic service hosted on this pod.

Handlers that can answer at once do so synchronously; the rest return a future or, off the hot
path, a coroutine (the server replies when it completes). The per-transaction store requests
(produce, transactional ack, end) return futures settled by the callbacks of the writes they queue:
a coroutine would cost a task per request. A pod answers only its role's commands: a store command
sent to a coordinator pod (or the reverse) gets NOT_SERVED_HERE. A coordinator pod that places its
coordinator ids by a record (contracts §12) answers a request for an id it does not serve now with
NOT_SERVED_HERE naming the owner (or none while the id is being moved).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from txnkeeper.aio import failure_of, settle
from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.errors import BadRequestError, NotServedHereError, ServiceError, UnavailableError
from txnkeeper.ledger.position import Position
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, UnauthorizedError, not_configured
from txnkeeper.protocol.clientauth import ClientTokenKey
from txnkeeper.protocol.server import HandlerResult, Session, fill_error, require
from txnkeeper.server.blocks import BlockAppender, PendingBudget
from txnkeeper.server.client_auth import ClientPrincipals
from txnkeeper.server.placement_state import PodPlacement
from txnkeeper.server.pulsar_pacing import BeginPacing
from txnkeeper.topic.records import DecodedRecord
from txnkeeper.topic.service import TopicService
from txnkeeper.topic.settled import when_all
from txnkeeper.topic.subscription import Subscription
from txnkeeper.txnid import TxnID


def _success() -> api.Command:
    # a fresh command each time: the server stamps the request id into it
    command = api.Command()
    command.success.SetInParent()
    return command


MAX_PERMITS = 100_000
# Registrations one ConfirmRegistrations may name (a store pod sends at most 512 per request).
MAX_CONFIRMATIONS = 4096


def _txn(txn: api.TxnId) -> TxnID:
    return TxnID(txn.most, txn.least)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _answer_new_txn(secret: ClusterSecret, txn_id: TxnID, deadline_ms: int) -> api.Command:
    """NewTxnResponse of a durable begin: the id and the owner token."""
    command = api.Command()
    answer = command.new_txn_response
    answer.txn_id.most = txn_id.most
    answer.txn_id.least = txn_id.least
    answer.owner_token = secret.owner_token(txn_id)
    return command


def _answer_new_registered_txn(
    grant: tuple[ClusterSecret, list[str], list[tuple[str, str]]], txn_id: TxnID, deadline_ms: int
) -> api.Command:
    """NewTxnResponse for a durable begin that registered partitions/subscriptions: id, owner token,
    and a ticket for each (bound to the transaction's timeout deadline)."""
    secret, topics, subscriptions = grant
    command = _answer_new_txn(secret, txn_id, deadline_ms)
    tickets = command.new_txn_response.tickets
    for topic in topics:
        secret.fill_ticket(tickets.add(), txn_id, topic, "", deadline_ms)
    for topic, subscription in subscriptions:
        secret.fill_ticket(tickets.add(), txn_id, topic, subscription, deadline_ms)
    return command


def _answer_tickets(
    grant: tuple[ClusterSecret, TxnID, int, list[str], list[tuple[str, str]]],
    response: asyncio.Future[api.Command],
    added: asyncio.Future[object],
) -> None:
    """Once the registration is durable, hand out one ticket per registered partition/subscription
    (``grant``: the secret, txn id, deadline, topics and subscriptions)."""
    secret, txn_id, deadline_ms, topics, subscriptions = grant
    failure = failure_of(added)
    if failure is not None:
        settle(response, failure, api.Command())
        return
    command = api.Command()
    tickets = command.txn_tickets
    tickets.SetInParent()
    for topic in topics:
        secret.fill_ticket(tickets.tickets.add(), txn_id, topic, "", deadline_ms)
    for topic, subscription in subscriptions:
        secret.fill_ticket(tickets.tickets.add(), txn_id, topic, subscription, deadline_ms)
    settle(response, None, command)


def _answer_produce(
    response: asyncio.Future[api.Command], position: Position | None, failure: BaseException | None
) -> None:
    """ProduceReceipt: the MessageId the message was written at, once it is durable."""
    command = api.Command()
    if position is None:
        settle(response, failure or UnavailableError("the message was not written"), command)
        return
    message_id = command.produce_receipt.message_id
    message_id.ledger_id = position.ledger_id
    message_id.entry_id = position.entry_id
    settle(response, None, command)


def _answer_ends(
    response: asyncio.Future[api.Command],
    ends: Sequence[tuple[list[asyncio.Future[Any]], BaseException | None]],
    _settled: Sequence[asyncio.Future[Any]],
) -> None:
    """EndTxnsOnStoreResult: the index and error of every end that failed (the others applied).

    ``ends``: per end, its parts' futures and the refusal raised at the call, if any; an end failed
    with that refusal, else with the first of its parts that failed (``settled.first_failure``'s
    rule, applied here so the whole request waits on one countdown)."""
    command = api.Command()
    answer = command.end_txns_on_store_result
    answer.SetInParent()
    for index, (parts, refused) in enumerate(ends):
        failure = refused
        for part in parts:
            part_failure = failure_of(part)  # retrieved, so never "exception was never retrieved"
            if failure is None:
                failure = part_failure
        if failure is None:
            continue
        if not isinstance(failure, Exception):
            settle(response, failure, command)  # cancelled: the server is closing
            return
        answer.failed.append(index)
        fill_error(answer.errors.add(), failure)
    settle(response, None, command)


def _answer_confirmations(
    response: asyncio.Future[api.Command],
    items: Sequence[asyncio.Future[Any] | BaseException],
    _settled: Sequence[asyncio.Future[Any]],
) -> None:
    """RegistrationsConfirmed: one result per item, its error if the coordinator refused it."""
    command = api.Command()
    results = command.registrations_confirmed.results
    for item in items:
        failure = item if isinstance(item, BaseException) else failure_of(item)
        result = results.add()
        if failure is None:
            continue
        if not isinstance(failure, Exception):
            settle(response, failure, command)  # cancelled: the server is closing
            return
        fill_error(result.error, failure)
    command.registrations_confirmed.SetInParent()
    settle(response, None, command)


def _consume(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()


class ConsumerEndpoint:
    """A consumer as a subscription sees it: pushes messages over its session.

    ``consumer_id`` is unique in this server (clients pick their ids per connection, so two clients
    may both say 1); ``client_consumer_id`` is the client's own id, used in the frames it receives.
    """

    __slots__ = ("_session", "client_consumer_id", "consumer_id", "subscription", "topic")
    _ids = itertools.count(1)

    def __init__(
        self, session: Session, client_consumer_id: int, topic: str, subscription: Subscription
    ) -> None:
        self._session = session
        self.consumer_id = next(ConsumerEndpoint._ids)
        self.client_consumer_id = client_consumer_id
        self.topic = topic
        self.subscription = subscription

    @property
    def ready(self) -> bool:
        return self._session.ready_for_push()

    @property
    def session(self) -> Session:
        return self._session

    def deliver(
        self,
        position: Position,
        record: DecodedRecord,
        redelivery_count: int,
        ack_set: list[int] | None = None,
    ) -> None:
        # Filled in place: building the parts and passing them as arguments copies each (3x slower).
        command = api.Command()
        message = command.message
        message.consumer_id = self.client_consumer_id
        message_id = message.message_id
        message_id.ledger_id = position.ledger_id
        message_id.entry_id = position.entry_id
        message.payload = record.payload
        message.key = record.key
        message.redelivery_count = redelivery_count
        message.topic = self.topic
        self._session.push(command)

    def detach(self) -> bool:
        return False  # the own protocol has no server-side close: it receives from the new position

    def read_failed(self, after: Position | None, message: str) -> None:
        command = api.Command()
        failure = command.consumer_error
        failure.consumer_id = self.client_consumer_id
        failure.error.code = api.DATA_UNREADABLE
        failure.error.message = message
        if after is not None:
            failure.after.ledger_id = after.ledger_id
            failure.after.entry_id = after.entry_id
        self._session.push(command)


class PodHandler:
    """The ``CommandHandler`` of a pod (either role)."""

    def __init__(
        self,
        coordinators: dict[int, TransactionCoordinator],
        topics: TopicService | None,
        secret: ClusterSecret | None = None,
        *,
        clock_ms: Callable[[], int] = _now_ms,
        client_key: ClientTokenKey | None = None,
        coordinator_placement: PodPlacement | None = None,
        pacing: BeginPacing | None = None,
    ) -> None:
        """``coordinator_placement``: the record of the coordinator ids (None: the ids in
        ``coordinators`` are fixed); ``coordinators`` is the pod's live map (ids come and go);
        ``pacing``: told of each registration a store confirms (server/pulsar_pacing.py)."""
        self._coordinators = coordinators
        self._pacing = pacing
        self._placement = coordinator_placement
        self._begins = 0
        self._secret = secret
        self._clock_ms = clock_ms
        # Store role: the nonce each connection was challenged with, and the connections that proved
        # they are coordinators (only they may end transactions here).
        self._nonces: dict[int, bytes] = {}
        self._coordinator_sessions: set[int] = set()
        self._coordinator_cycle = itertools.cycle(sorted(coordinators)) if coordinators else None
        self._topics = topics
        self._consumers: dict[int, dict[int, ConsumerEndpoint]] = {}
        self._principals = ClientPrincipals(client_key)
        self.blocks = BlockAppender(self._store, principals=self._principals)
        coordinator_routes: dict[str, Callable[[Session, api.Command], HandlerResult]] = {
            "new_txn": self._new_txn,
            "add_partition": self._add_partition,
            "add_subscription": self._add_subscription,
            "add_to_txn": self._add_to_txn,
            "confirm_registrations": self._confirm_registrations,
            "end_txn": self._end_txn,
            "get_txn_status": self._get_txn_status,
        }
        store_routes: dict[str, Callable[[Session, api.Command], HandlerResult]] = {
            "produce": self._produce,
            "subscribe": self._subscribe,
            "flow": self._flow,
            "close_consumer": self._close_consumer,
            "redeliver": self._redeliver,
            "ack": self._ack,
            "end_txn_on_partition": self._end_on_partition,
            "end_txn_on_subscription": self._end_on_subscription,
            "end_txn_on_store": self._end_on_store,
            "end_txns_on_store": self._ends_on_store,
            "auth_challenge": self._auth_challenge,
            "authenticate": self._authenticate,
            "client_auth": self._client_auth,
            "setup_append": self.blocks.setup_append,
            "append_block": self.blocks.append_block,
            "append_block_end": self.blocks.append_block_end,
            "abort_append_block": self.blocks.abort_append_block,
        }
        self._routes = {**coordinator_routes, **store_routes}
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this object serves on (the running one at first use)."""
        # Looked up once: asyncio.get_running_loop() makes a getpid() system call per call on CPython
        # 3.11 (its fork check), and every transaction creates futures here.
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    # --- CommandHandler ----------------------------------------------------------------------------
    def handle(self, session: Session, body_name: str, command: api.Command) -> HandlerResult:
        route = self._routes.get(body_name)
        if route is None:
            raise BadRequestError(f"'{body_name}' is not a request a server accepts")
        return route(session, command)

    def share_pending_budget(self, budget: PendingBudget) -> None:
        """Count buffered block chunks against the protocol server's pending-bytes limit."""
        self.blocks.budget = budget

    def session_closed(self, session: Session) -> None:
        self.blocks.session_closed(session)
        self._principals.session_closed(session)
        self._nonces.pop(session.session_id, None)
        self._coordinator_sessions.discard(session.session_id)
        for endpoint in self._consumers.pop(session.session_id, {}).values():
            endpoint.subscription.remove_consumer(endpoint.consumer_id)

    def topics_closed(self, topics: set[str]) -> None:
        """These topics were closed here (their shard is fenced for a move or served elsewhere now):
        their consumers' connections are closed, which the client answers by subscribing again (and is
        told where the topic is served now). Other consumers of such a connection subscribe again too:
        the own protocol has no push that ends one consumer alone."""
        for endpoints in list(self._consumers.values()):
            moving = [e for e in endpoints.values() if e.topic in topics]
            if not moving:
                continue
            for endpoint in moving:
                endpoints.pop(endpoint.client_consumer_id, None)
                endpoint.subscription.remove_consumer(endpoint.consumer_id)
            session = moving[0].session
            # The connection object closes itself with an error frame (protocol/server.py close_for).
            close_for = getattr(session, "close_for", None)
            if close_for is not None:
                close_for("placement", api.NOT_SERVED_HERE, f"topic {moving[0].topic} moved off this pod")

    def session_holds_state(self, session: Session) -> bool:
        return bool(self._consumers.get(session.session_id))

    def session_writable(self, session: Session) -> None:
        # Its consumers' subscriptions held messages back from it: they may dispatch again.
        for endpoint in self._consumers.get(session.session_id, {}).values():
            endpoint.subscription.notify()

    # --- coordinator role --------------------------------------------------------------------------
    def _coordinator(self, most: int) -> TransactionCoordinator:
        coordinator = self._coordinators.get(most)
        placement = self._placement
        if placement is not None and (coordinator is None or not placement.serves(most)):
            self._not_served(placement, most)
        if coordinator is None:
            if not self._coordinators:
                raise NotServedHereError("this pod hosts no transaction coordinator (role store)")
            raise NotServedHereError(f"coordinator {most} is not hosted on this pod")
        return coordinator

    @staticmethod
    def _not_served(placement: PodPlacement, most: int) -> None:
        """Raise the placement answer for coordinator id ``most`` on this pod."""
        record = placement.record
        if not 0 <= most < record.shards:
            raise NotServedHereError(
                f"coordinator {most} does not exist: this resource has ids 0..{record.shards - 1}"
            )
        placement.check(most, f"coordinator {most}")  # raises unless served here
        raise NotServedHereError(  # ours by the record, being opened (it just arrived)
            f"coordinator {most} is being opened on this pod; retry shortly",
            placement_epoch=record.epoch,
        )

    def _placed_coordinator(self, placement: PodPlacement) -> TransactionCoordinator:
        """The coordinator a NewTxn goes to on a pod that places its ids: round robin over those it
        serves now; with none, the answer sends the client to a pod that serves one."""
        served = [c for c in sorted(self._coordinators) if placement.serves(c)]
        if served:
            self._begins += 1
            return self._coordinators[served[self._begins % len(served)]]
        record = placement.record
        for owner in record.owners:
            member = record.member(owner)
            if owner != placement.ordinal and member is not None:
                raise NotServedHereError(
                    f"this pod serves no coordinator id now (placement epoch {record.epoch}); "
                    f"pod {owner} at {member.address} does",
                    owner_address=member.address,
                    placement_epoch=record.epoch,
                )
        raise NotServedHereError(
            f"this pod serves no coordinator id now (placement epoch {record.epoch}); retry shortly",
            placement_epoch=record.epoch,
        )

    def _new_txn(self, session: Session, command: api.Command) -> HandlerResult:
        placement = self._placement
        if self._coordinator_cycle is None and placement is None:
            raise NotServedHereError("this pod hosts no transaction coordinator (role store)")
        if self._secret is None:
            raise not_configured("beginning a transaction")
        if placement is not None:
            coordinator = self._placed_coordinator(placement)
        else:
            assert self._coordinator_cycle is not None
            coordinator = self._coordinators[next(self._coordinator_cycle)]
        body = command.new_txn
        # The coordinator builds the answer once the begin is durable: no future of our own.
        if not body.topics and not body.subscriptions:
            return coordinator.begin(
                body.timeout_ms, None, None, "", answer=partial(_answer_new_txn, self._secret)
            )
        # Begin + register in one request: the answer carries the tickets AddToTxn would have.
        topics = list(body.topics)
        subs = [(s.topic, s.subscription) for s in body.subscriptions]
        grant = (self._secret, topics, subs)
        return coordinator.begin(
            body.timeout_ms,
            topics,
            subs,
            body.store_address,
            answer=partial(_answer_new_registered_txn, grant),
        )

    def _owned(
        self, what: str, txn_id: api.TxnId, owner_token: bytes
    ) -> tuple[TransactionCoordinator, TxnID]:
        """The coordinator of ``txn_id``, once the caller proved it began that transaction."""
        coordinator = self._coordinator(txn_id.most)
        if self._secret is None:
            raise not_configured(what)
        txn = _txn(txn_id)
        self._secret.check_owner(txn, owner_token, what)
        return coordinator, txn

    def _ticketed(
        self,
        coordinator: TransactionCoordinator,
        txn: TxnID,
        topics: list[str],
        subs: list[tuple[str, str]],
        added: Awaitable[object],
    ) -> asyncio.Future[api.Command]:
        assert self._secret is not None
        deadline_ms = coordinator.deadline_of(txn)
        response: asyncio.Future[api.Command] = self._loop().create_future()
        asyncio.ensure_future(added).add_done_callback(
            partial(_answer_tickets, (self._secret, txn, deadline_ms, topics, subs), response)
        )
        return response

    def _add_partition(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.add_partition
        coordinator, txn = self._owned("add-partition", body.txn_id, body.owner_token)
        topics = list(body.topics)
        added = coordinator.add_partitions(txn, topics, body.store_address)
        return self._ticketed(coordinator, txn, topics, [], added)

    def _add_subscription(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.add_subscription
        coordinator, txn = self._owned("add-subscription", body.txn_id, body.owner_token)
        subs = [(s.topic, s.subscription) for s in body.subscriptions]
        added = coordinator.add_subscriptions(txn, subs, body.store_address)
        return self._ticketed(coordinator, txn, [], subs, added)

    def _add_to_txn(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.add_to_txn
        coordinator, txn = self._owned("add-to-txn", body.txn_id, body.owner_token)
        require(len(body.topics) + len(body.subscriptions) > 0, "add names no partition or subscription")
        topics = list(body.topics)
        subs = [(s.topic, s.subscription) for s in body.subscriptions]
        if not subs:
            return self._ticketed(
                coordinator, txn, topics, [], coordinator.add_partitions(txn, topics, body.store_address)
            )
        if not topics:
            return self._ticketed(
                coordinator, txn, [], subs, coordinator.add_subscriptions(txn, subs, body.store_address)
            )
        partitions = coordinator.add_partitions(txn, topics, body.store_address)
        try:
            subscriptions = coordinator.add_subscriptions(txn, subs, body.store_address)
        except Exception:
            # The partitions' record is on its way; it is not this request's outcome any more.
            asyncio.ensure_future(partitions).add_done_callback(_consume)
            raise
        # Both records are queued; gathering futures costs no task.
        return self._ticketed(coordinator, txn, topics, subs, asyncio.gather(partitions, subscriptions))

    def _confirm_registrations(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.confirm_registrations
        registrations = body.registrations
        require(len(registrations) > 0, "confirm-registrations names no registration")
        require(
            len(registrations) <= MAX_CONFIRMATIONS,
            f"confirm-registrations names {len(registrations)} registrations: at most"
            f" {MAX_CONFIRMATIONS} per request, send the rest in another",
        )
        # Each item is registered on its own, as one AddPartitionToTxn or AddSubscriptionToTxn would
        # be, and answered on its own (a forged or ended transaction fails only its items); no
        # tickets: the store asking only needs to know the coordinator holds them.
        items: list[asyncio.Future[Any] | BaseException] = []
        waiting: list[asyncio.Future[Any]] = []
        for item in registrations:
            try:
                coordinator, txn = self._owned("confirm-registrations", item.txn_id, item.owner_token)
                if item.subscription:
                    subs = [(item.topic, item.subscription)]
                    added = coordinator.add_subscriptions(txn, subs, body.store_address)
                else:
                    added = coordinator.add_partitions(txn, [item.topic], body.store_address)
            except ServiceError as exc:
                items.append(exc)
                continue
            if self._pacing is not None:
                self._pacing.confirmed(txn, item.topic, item.subscription)
            future = asyncio.ensure_future(added)
            items.append(future)
            if not future.done():  # mostly done already: what the client registered is not logged again
                waiting.append(future)
        response: asyncio.Future[api.Command] = self._loop().create_future()
        when_all(waiting, partial(_answer_confirmations, response, items))
        return response

    def _end_txn(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.end_txn
        coordinator, txn = self._owned("end-txn", body.txn_id, body.owner_token)
        return coordinator.end_txn(txn, body.action == api.COMMIT)

    def _get_txn_status(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.get_txn_status
        status = self._coordinator(body.txn_id.most).status_of(_txn(body.txn_id))
        return api.Command(txn_status=api.TxnStatusResponse(status=status))

    # --- store role --------------------------------------------------------------------------------
    def _store(self) -> TopicService:
        if self._topics is None:
            raise NotServedHereError("this pod serves no topics (role coordinator)")
        if not self._topics.recovered:
            raise UnavailableError("store is still recovering")
        return self._topics

    def _produce(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.produce
        topics = self._store()
        txn = None
        if body.HasField("txn_id"):
            txn = _txn(body.txn_id)
            self._check_ticket(body.ticket, txn, body.topic, "")
        if body.producer_name:
            require(
                txn is None,
                "producer_name (idempotent produce) applies to non-transactional produces only:"
                " a transaction already makes its sends atomic",
            )
            name, epoch = self.blocks.producer_session(session, body.topic, body.producer_name)
            return self._produce_idempotent(topics, body, name, epoch)
        # Answered from the write's own callback: no task, coroutine or intermediate future.
        response: asyncio.Future[api.Command] = self._loop().create_future()
        topics.publish_notify(body.topic, body.payload, body.key, txn, partial(_answer_produce, response))
        return response

    @staticmethod
    async def _produce_idempotent(
        topics: TopicService, body: api.Produce, name: str, epoch: int
    ) -> api.Command:
        """``name``: the producer name's writer-table key (qualified by the connection's principal)."""
        result = await topics.publish_idempotent(
            body.topic, body.payload, body.key, name, body.sequence_id, epoch=epoch
        )
        command = api.Command()
        receipt = command.produce_receipt
        receipt.duplicate = result.duplicate
        if result.first_message_id is not None:
            receipt.message_id.ledger_id = result.first_message_id.ledger_id
            receipt.message_id.entry_id = result.first_message_id.entry_id
        return command

    def _check_ticket(self, ticket: api.TxnTicket, txn: TxnID, topic: str, subscription: str) -> None:
        if self._secret is None:
            raise not_configured("a transactional produce or ack")
        self._secret.check_ticket(ticket, txn, topic, subscription, self._clock_ms())

    def _subscribe(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.subscribe
        topics = self._store()
        require(0 < body.permits <= MAX_PERMITS, f"subscribe permits must be in 1..{MAX_PERMITS}")
        consumers = self._consumers.setdefault(session.session_id, {})
        require(
            body.consumer_id not in consumers,
            f"consumer id {body.consumer_id} already in use on this connection",
        )
        return self._subscribe_async(session, topics, body)

    async def _subscribe_async(
        self, session: Session, topics: TopicService, body: api.Subscribe
    ) -> api.Command:
        topic, consumer_id = body.topic, body.consumer_id
        subscription = await topics.subscription(topic, body.subscription)
        if not session.is_open:
            return _success()
        endpoint = ConsumerEndpoint(session, consumer_id, topic, subscription)
        subscription.add_consumer(endpoint, body.permits)
        self._consumers.setdefault(session.session_id, {})[consumer_id] = endpoint
        return _success()

    def _endpoint(self, session: Session, consumer_id: int) -> ConsumerEndpoint:
        endpoint = self._consumers.get(session.session_id, {}).get(consumer_id)
        if endpoint is None:
            raise BadRequestError(f"consumer {consumer_id} is not subscribed on this connection")
        return endpoint

    def _flow(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.flow
        endpoint = self._consumers.get(session.session_id, {}).get(body.consumer_id)
        if endpoint is not None:
            endpoint.subscription.flow(endpoint.consumer_id, min(body.permits, MAX_PERMITS))
        return None

    def _close_consumer(self, session: Session, command: api.Command) -> HandlerResult:
        consumer_id = command.close_consumer.consumer_id
        endpoint = self._consumers.get(session.session_id, {}).pop(consumer_id, None)
        if endpoint is not None:
            endpoint.subscription.remove_consumer(endpoint.consumer_id)
        return _success()

    def _redeliver(self, session: Session, command: api.Command) -> HandlerResult:
        endpoint = self._endpoint(session, command.redeliver.consumer_id)
        endpoint.subscription.redeliver_unacknowledged(endpoint.consumer_id)
        return _success()

    def _ack(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.ack
        endpoint = self._endpoint(session, body.consumer_id)
        require(len(body.message_ids) > 0, "ack names no message")
        positions = [Position(m.ledger_id, m.entry_id) for m in body.message_ids]
        txn = None
        if body.HasField("txn_id"):
            txn = _txn(body.txn_id)
            name = endpoint.subscription.name
            self._check_ticket(body.ticket, txn, endpoint.topic, name)
            topics = self._store()
            topics.check_fence(endpoint.topic, name, txn)
        return endpoint.subscription.ack(positions, body.ack_type == api.CUMULATIVE, txn)

    # --- coordinator authentication (store role) ---------------------------------------------------
    def _auth_challenge(self, session: Session, command: api.Command) -> HandlerResult:
        self._store()
        if self._secret is None:
            raise not_configured("coordinator authentication")
        nonce = self._secret.new_nonce()
        self._nonces[session.session_id] = nonce
        return api.Command(auth_nonce=api.AuthNonce(nonce=nonce))

    def _authenticate(self, session: Session, command: api.Command) -> HandlerResult:
        self._store()
        if self._secret is None:
            raise not_configured("coordinator authentication")
        nonce = self._nonces.pop(session.session_id, b"")
        if not nonce:
            raise BadRequestError("authenticate needs an auth_challenge first on this connection")
        if not self._secret.check_coordinator_proof(nonce, command.authenticate.proof):
            raise UnauthorizedError("coordinator authentication failed: the proof does not match the secret")
        self._coordinator_sessions.add(session.session_id)
        return _success()

    def _client_auth(self, session: Session, command: api.Command) -> HandlerResult:
        self._store()
        return self._principals.authenticate(session, command)

    def _coordinator_store(self, session: Session, what: str) -> TopicService:
        """The topic service, for a request only a transaction coordinator may make."""
        topics = self._store()
        if self._secret is None:
            raise not_configured(what)
        if session.session_id not in self._coordinator_sessions:
            raise UnauthorizedError(
                f"{what} is accepted only from an authenticated coordinator connection"
                " (auth_challenge + authenticate); clients end transactions through their coordinator"
            )
        return topics

    def _end_on_partition(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.end_txn_on_partition
        topics = self._coordinator_store(session, "end-txn-on-partition")
        return topics.end_txn_on_partition(body.topic, _txn(body.txn_id), body.action == api.COMMIT)

    def _end_on_subscription(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.end_txn_on_subscription
        topics = self._coordinator_store(session, "end-txn-on-subscription")
        commit = body.action == api.COMMIT
        return topics.end_txn_on_subscription(body.topic, body.subscription, _txn(body.txn_id), commit)

    def _end_on_store(self, session: Session, command: api.Command) -> HandlerResult:
        body = command.end_txn_on_store
        topics = self._coordinator_store(session, "end-txn-on-store")
        require(len(body.topics) + len(body.subscriptions) > 0, "end names no partition or subscription")
        subs = [(s.topic, s.subscription) for s in body.subscriptions]
        commit = body.action == api.COMMIT
        return topics.end_txn_on_store(_txn(body.txn_id), commit, body.topics, subs, body.deadline_ms)

    def _ends_on_store(self, session: Session, command: api.Command) -> HandlerResult:
        ends = command.end_txns_on_store.ends
        topics = self._coordinator_store(session, "end-txns-on-store")
        require(len(ends) > 0, "the request names no end")
        # Each end is applied on its own (concurrently, as separate requests would be) and answered
        # on its own: one failure does not fail the others. Futures and one countdown over every
        # end's parts, no task and no combining future per end.
        parts: list[tuple[list[asyncio.Future[Any]], BaseException | None]] = []
        everything: list[asyncio.Future[Any]] = []
        for end in ends:
            try:
                waiting, refused = self._one_end(topics, end)
            except Exception as exc:
                waiting, refused = [], exc
            parts.append((waiting, refused))
            everything.extend(waiting)
        response: asyncio.Future[api.Command] = self._loop().create_future()
        when_all(everything, partial(_answer_ends, response, parts))
        return response

    @staticmethod
    def _one_end(
        topics: TopicService, end: api.EndTxnOnStore
    ) -> tuple[list[asyncio.Future[Any]], BaseException | None]:
        require(len(end.topics) + len(end.subscriptions) > 0, "end names no partition or subscription")
        subs = [(s.topic, s.subscription) for s in end.subscriptions]
        commit = end.action == api.COMMIT
        return topics.end_txn_parts(_txn(end.txn_id), commit, end.topics, subs, end.deadline_ms)
