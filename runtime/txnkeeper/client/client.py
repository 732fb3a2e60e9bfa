"""The client: entry point of the asyncio client library (Pulsar-like API).

Topics are placed on store pods by a stable hash of the topic name over the ``stores`` list, so every
client with the same list finds the same store, until a pod redirects a topic elsewhere (placement,
``client/placement.py``); transactions are begun round-robin on ``coordinators``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Sequence

from txnkeeper.client.appender import DEFAULT_MAX_TXN_BYTES, BlockAppender
from txnkeeper.client.consumer import Consumer
from txnkeeper.client.placement import Redirects, StoreRouter, is_placement
from txnkeeper.client.producer import Producer
from txnkeeper.client.singlekey import SingleKeyWriter
from txnkeeper.client.transaction import Transaction
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.errors import NotServedHereError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.pool import ConnectionPool
from txnkeeper.protocol.rpc import ClientTls, RpcConnection, StaticClientTls, expect, split_address
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)
_Begin = tuple[api.Command, str]

DEFAULT_TXN_TIMEOUT_MS = 60_000
DEFAULT_OPERATION_TIMEOUT = 30.0  # seconds, Pulsar's default
# NewTxn bodies remembered per (timeout, topics, subscriptions): an application begins its
# transactions with the same few names, and copying a built body is a fraction of building it.
BEGIN_TEMPLATES = 256


class Client:
    """``Client(coordinators=[...], stores=[...])``; close it with ``await client.close()``."""

    def __init__(
        self,
        *,
        coordinators: list[str],
        stores: list[str],
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
        auth_token: str | None = None,
        tls: TlsClientSettings | ClientTls | None = None,
    ) -> None:
        """``tls``: connect over TLS, verifying the pods against ``tls.ca_file`` (and presenting
        ``tls.cert_file`` where pods require a client certificate); a refused certificate fails with
        ``TlsHandshakeError`` saying which and why. Settings are read once; a ``ClientTls`` (e.g. the
        local fleet's, which follows its CA rotations) is asked for the context of each new connection.

        ``auth_token``: this client's credential (``txnkeeper client-token create``), presented on
        every store connection: on stores that authenticate clients, single-key writer ids and
        producer names are the token's principal's, which no other principal can take over."""
        if not coordinators and not stores:
            raise ValueError("a client needs at least one coordinator or store address")
        for address in [*coordinators, *stores]:
            split_address(address)
        self._coordinators = list(coordinators)
        self._stores = list(stores)
        self._coordinator_cycle = itertools.cycle(self._coordinators) if coordinators else None
        if operation_timeout <= 0:
            raise ValueError(f"operation_timeout must be positive, got {operation_timeout}")
        self._operation_timeout = operation_timeout
        if auth_token is not None and not auth_token:
            raise ValueError("auth_token must not be empty (leave it out to connect without a token)")
        self._auth_token = auth_token
        self.principals: dict[str, str] = {}  # store address -> principal it authenticated us as
        self.connections = ConnectionPool(
            operation_timeout,
            on_connect=self._authenticate if auth_token is not None else None,
            tls=StaticClientTls(tls) if isinstance(tls, TlsClientSettings) else tls,
        )
        self._consumers: dict[int, Consumer] = {}
        # Closed with the client: a writer or named producer resynchronising must not reconnect after.
        self._closables: list[Producer | SingleKeyWriter] = []
        self._named: dict[tuple[str, str], Producer] = {}  # (topic, producer name) -> open producer
        self._consumer_ids = itertools.count(1)
        self.router = StoreRouter(self._stores, operation_timeout, self.connections.request, self._new_store)
        self._templates_at = 0  # router.moves when the templates were built
        self._begin_templates: dict[tuple[int, tuple[str, ...], tuple[tuple[str, str], ...]], _Begin] = {}
        # The loop of the first transaction, kept: asyncio.get_running_loop() costs a getpid() system
        # call per call on CPython 3.11, and a client serves one loop (its connections do).
        self._event_loop: asyncio.AbstractEventLoop | None = None
        for address in self._stores:
            self.connections.on_push(address, self._on_push)

    async def _authenticate(self, conn: RpcConnection) -> None:
        """Present the token on a new store connection (coordinators take none) before any request."""
        if not self.router.is_store(conn.address) or self._auth_token is None:
            return
        command = api.Command()
        command.client_auth.token = self._auth_token
        response = expect(await conn.request(command, self._operation_timeout), "client_authenticated")
        principal = response.client_authenticated.principal
        if not principal and conn.address not in self.principals:
            log.warning(
                "store %s does not authenticate clients: this client's writer ids and producer names"
                " are shared with every client of it",
                conn.address,
            )
        self.principals[conn.address] = principal

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def store_for(self, topic: str) -> str:
        """The store pod that serves ``topic`` (as far as this client knows: redirects update it)."""
        return self.router.address(topic)

    def _new_store(self, address: str) -> None:
        """A redirect named a store pod this client was not given: its pushes reach the consumers."""
        self.connections.on_push(address, self._on_push)

    async def create_producer(self, topic: str, *, producer_name: str | None = None) -> Producer:
        """A producer of ``topic``. With ``producer_name`` its sends are idempotent (Pulsar's producer
        name + sequence id): each send gets the next sequence id of that name, and a send retried after
        a lost receipt or a reconnect is written once. One producer per name at a time: opening one
        fences every older producer of the name on the store (their sends then fail with
        ``ProducerFencedError``), and this client refuses a second open producer of a name it holds."""
        if producer_name is not None:
            holder = self._named.get((topic, producer_name))
            if holder is not None and not holder.closed:
                raise ValueError(
                    f"producer name {producer_name!r} of {topic} is already held by an open producer of"
                    " this client: close that one first (a second one would fence it)"
                )
        producer = Producer(
            self.connections,
            topic,
            self.router,
            producer_name=producer_name,
            resync_timeout=self._operation_timeout,
        )
        # Connected now, so that a store that cannot be reached fails the create (after the other
        # store addresses were tried: any of them redirects to the topic's owner).
        await self.router.at_owner(topic, self.connections.get, f"producer of {topic}")
        if producer_name is not None:
            await producer.open_sequenced()
            self._named[(topic, producer_name)] = producer
        self._closables.append(producer)
        return producer

    async def create_single_key_writer(
        self,
        topic: str,
        routing_key: str,
        txn_timeout_ms: int,
        max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
        *,
        writer_id: str | None = None,
    ) -> SingleKeyWriter:
        """A writer of single-routing-key transactions (PDP-44) to ``topic``; ``routing_key`` becomes
        every event's message key. ``writer_id`` (default: a new uuid) continues an earlier writer's
        event numbering and de-duplication, e.g. after the application restarted."""
        appender = BlockAppender(
            self.connections,
            topic,
            self.router,
            writer_id or uuid.uuid4().hex,
            key=routing_key,
            resync_timeout=self._operation_timeout,
        )
        writer = SingleKeyWriter(appender, routing_key, txn_timeout_ms, max_txn_bytes)
        await appender.open()
        self._closables.append(writer)
        return writer

    async def subscribe(self, topic: str, subscription: str, *, receiver_queue_size: int = 1000) -> Consumer:
        consumer = Consumer(
            self.connections,
            topic,
            subscription,
            router=self.router,
            consumer_id=next(self._consumer_ids),
            queue_size=receiver_queue_size,
        )
        self._consumers[consumer.consumer_id] = consumer
        try:
            await consumer.subscribe()
        except BaseException:
            del self._consumers[consumer.consumer_id]
            raise
        return consumer

    async def new_transaction(
        self,
        timeout_ms: int = DEFAULT_TXN_TIMEOUT_MS,
        *,
        topics: Sequence[str] = (),
        subscriptions: Sequence[tuple[str, str]] = (),
    ) -> Transaction:
        """Begin a transaction.

        ``topics`` (produced to) and ``subscriptions`` ((topic, subscription) pairs acknowledged on)
        that the transaction will use may be named here: those served by the same store pod as the
        first one are registered with the begin (one request and one log write instead of a begin
        and an AddToTxn); the rest, and all of them with a coordinator that does not know this, are
        registered at first use as usual. Naming one that is never used only adds it to the end.
        """
        if self._coordinator_cycle is None:
            raise ValueError("this client was given no coordinator addresses")
        address = next(self._coordinator_cycle)
        key = (timeout_ms, tuple(topics), tuple(subscriptions))
        try:
            begin = self._begin_templates.get(key)
        except TypeError:  # unhashable names (lists for pairs): built every time, as they come
            begin = self._begin_template(timeout_ms, topics, subscriptions)
        if begin is None:
            begin = self._begin_template(timeout_ms, topics, subscriptions)
            if len(self._begin_templates) >= BEGIN_TEMPLATES:
                self._begin_templates.clear()
            self._begin_templates[key] = begin
        template, store = begin
        if store and self._templates_at != self.router.moves:
            # A topic moved since these were built: their store addresses may be stale.
            self._begin_templates.clear()
            self._templates_at = self.router.moves
            begin = self._begin_template(timeout_ms, topics, subscriptions)
            template, store = begin
        command = api.Command()
        command.CopyFrom(template)  # a fresh command each time: the request id is stamped into it
        address, response = await self._begin_at(address, command)
        answer = response.new_txn_response
        txn = answer.txn_id
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        transaction = Transaction(
            self.connections,
            TxnID(txn.most, txn.least),
            address,
            answer.owner_token,
            loop=loop,
            operation_timeout=self._operation_timeout,
        )
        if answer.tickets:
            transaction.registered_at_begin(store, response)
        return transaction

    async def _begin_at(self, address: str, command: api.Command) -> tuple[str, api.Command]:
        """NewTxn at ``address``; one answered by placement goes to the owner it names, or, when that
        pod serves no coordinator id now (being moved), to the next coordinator pod after a wait."""
        redirects = Redirects("beginning a transaction", self._operation_timeout)
        while True:
            try:
                return address, await self.connections.request(address, command)
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                owner = await redirects.after(exc)
                assert self._coordinator_cycle is not None
                address = owner if owner is not None else next(self._coordinator_cycle)

    def _begin_template(
        self, timeout_ms: int, topics: Sequence[str], subscriptions: Sequence[tuple[str, str]]
    ) -> _Begin:
        """The NewTxn request for these names, and the store pod whose names it registers."""
        command = api.Command()
        body = command.new_txn
        body.timeout_ms = timeout_ms
        named = [*topics, *(topic for topic, _ in subscriptions)]
        store = self.store_for(named[0]) if named else ""
        if store:
            body.store_address = store
            body.topics.extend(t for t in topics if self.store_for(t) == store)
            for topic, subscription in subscriptions:
                if self.store_for(topic) == store:
                    ref = body.subscriptions.add()
                    ref.topic = topic
                    ref.subscription = subscription
        return command, store

    async def transaction_status(self, txn: Transaction) -> str:
        body = api.GetTxnStatus(txn_id=api.TxnId(most=txn.txn_id.most, least=txn.txn_id.least))
        response = await txn.coordinator_request(api.Command(get_txn_status=body))
        return response.txn_status.status

    def _on_push(self, conn: RpcConnection, command: api.Command) -> None:
        if command.HasField("message"):
            consumer = self._consumers.get(command.message.consumer_id)
            if consumer is not None:
                consumer.on_message(conn, command.message)
        elif command.HasField("consumer_error"):
            consumer = self._consumers.get(command.consumer_error.consumer_id)
            if consumer is not None:
                consumer.on_error(conn, command.consumer_error)

    async def close(self) -> None:
        for consumer in list(self._consumers.values()):
            await consumer.close()
        for closable in self._closables:
            await closable.abandon()
        await self.connections.close()
