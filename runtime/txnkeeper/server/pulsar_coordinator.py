"""Pulsar's transaction commands on a coordinator pod: TC_CLIENT_CONNECT, NEW_TXN, ADD_PARTITION_TO_TXN,
ADD_SUBSCRIPTION_TO_TXN and END_TXN, served by the pod's ``TransactionCoordinator``s.

Why apart from the store commands (server/pulsar_handler.py): they act on coordinators only, and
carry what Pulsar's protocol lacks and txnkeeper's own has: the own protocol proves a client began a
transaction with an owner token, Pulsar's clients send none. Pulsar itself checks ownership only by
the authenticated role; so does this: on a pod that authenticates clients (a client token key), a
transaction may be extended and ended only by the principal that began it (remembered here, in
memory: after a coordinator pod restart, transactions begun before it are open to any authenticated
principal until they end). Without authentication anyone who knows a transaction id may end it, as
in Pulsar; docs/pulsar-protocol.md says so.

A Pulsar client does not say which store pod holds a partition; the coordinator places it by
``PulsarPlacement`` (the pods' URLs, server/pulsar_config.py), as lookups do.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial

from txnkeeper.contract.placement import Placement
from txnkeeper.coordinator.coordinator import TransactionCoordinator
from txnkeeper.errors import BadRequestError, NotServedHereError, ServiceError
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.auth import UnauthorizedError
from txnkeeper.protocol.pulsar_frames import encode_command
from txnkeeper.server.pulsar_pacing import BeginPacing
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.txnid import TxnID

T = pulsar.BaseCommand
OWNERS_MEMORY = 1_000_000  # transactions whose owning principal is remembered (oldest forgotten first)


class CoordinatorNotFoundError(ServiceError):
    """Pulsar's TransactionCoordinatorNotFound: the client looks the coordinator up again."""


def _txn(most: int, least: int) -> TxnID:
    return TxnID(most, least)


class PulsarCoordinators:
    """The transaction commands of Pulsar's protocol for the coordinators hosted on one pod."""

    def __init__(
        self,
        coordinators: dict[int, TransactionCoordinator],
        placement: PulsarPlacement,
        own_store_address: Callable[[], str],
        *,
        authenticates: bool,
        record: Callable[[], Placement | None] = lambda: None,
        pacing: BeginPacing | None = None,
    ) -> None:
        """``record``: the coordinator-ids placement record this pod holds (None: ids fixed, found by
        the arithmetic rule of ``placement``); ``pacing``: holds a connection's begins while its
        registrations have not reached their stores (server/pulsar_pacing.py; None: never)."""
        self._record = record
        self._pacing = pacing
        self._coordinators = coordinators
        self._placement = placement
        self._own_store_address = own_store_address
        self._authenticates = authenticates
        self._owners: OrderedDict[TxnID, str] = OrderedDict()

    def _coordinator(self, coordinator_id: int) -> TransactionCoordinator:
        coordinator = self._coordinators.get(coordinator_id)
        if coordinator is None:
            if not self._coordinators:
                raise NotServedHereError("this pod hosts no transaction coordinator (role store)")
            raise CoordinatorNotFoundError(
                f"transaction coordinator {coordinator_id} is not hosted on this pod: look up"
                f" partition {coordinator_id} of the coordinator-assign topic"
            )
        return coordinator

    def owner_url(self, coordinator_id: int) -> str | None:
        """Where coordinator ``coordinator_id`` is served by this pod's placement record (what a
        lookup of the coordinator-assign topic's partition answers), or None without a record."""
        record = self._record()
        if record is None or not 0 <= coordinator_id < record.shards:
            return None
        member = record.member(record.owner_of(coordinator_id))
        if member is None:
            return None
        return member.pulsar_url or f"pulsar://{member.address}"  # both protocols share the port

    def _store_address(self, topic: str) -> str:
        address = self._placement.store_address(topic)
        if address is not None:
            return address
        if self._placement.store_urls:
            raise BadRequestError(f"no store pod for {topic}")
        return self._own_store_address()

    def _owned(self, txn: TxnID, principal: str) -> TransactionCoordinator:
        coordinator = self._coordinator(txn.most)
        if self._authenticates:
            owner = self._owners.get(txn)
            if owner is not None and owner != principal:
                raise UnauthorizedError(
                    f"transaction {txn} was begun by another principal: only its owner may extend or end it"
                )
        return coordinator

    # --- commands ------------------------------------------------------------------------------
    def tc_client_connect(self, body: pulsar.CommandTcClientConnectRequest) -> bytes:
        self._coordinator(body.tc_id)
        answer = pulsar.BaseCommand(type=T.TC_CLIENT_CONNECT_RESPONSE)
        answer.tcClientConnectResponse.request_id = body.request_id
        return encode_command(answer)

    def new_txn(self, body: pulsar.CommandNewTxn, principal: str, session_id: int = 0) -> Awaitable[bytes]:
        coordinator = self._coordinator(body.tc_id)  # refusals at once, held or not
        held = self._pacing.admit(session_id) if self._pacing is not None else None
        if held is None:
            return self._new_txn(coordinator, body, principal)
        # Looked up again after the hold: the coordinator id may have moved meanwhile.
        return _then(held, lambda: self._new_txn(self._coordinator(body.tc_id), body, principal))

    def _new_txn(
        self, coordinator: TransactionCoordinator, body: pulsar.CommandNewTxn, principal: str
    ) -> Awaitable[bytes]:
        # Pulsar's clients put the timeout in milliseconds into the field named txn_ttl_seconds.
        timeout_ms = body.txn_ttl_seconds
        if timeout_ms <= 0:
            raise BadRequestError("NEW_TXN needs a positive transaction timeout")
        request_id = body.request_id

        def answer(txn: TxnID, deadline_ms: int) -> bytes:
            if self._authenticates:
                self._owners[txn] = principal
                while len(self._owners) > OWNERS_MEMORY:
                    self._owners.popitem(last=False)
            command = pulsar.BaseCommand(type=T.NEW_TXN_RESPONSE)
            response = command.newTxnResponse
            response.request_id = request_id
            response.txnid_most_bits = txn.most
            response.txnid_least_bits = txn.least
            return encode_command(command)

        return coordinator.begin(timeout_ms, None, None, "", answer=answer)

    def add_partitions(
        self, body: pulsar.CommandAddPartitionToTxn, principal: str, session_id: int = 0
    ) -> Awaitable[bytes]:
        txn = _txn(body.txnid_most_bits, body.txnid_least_bits)
        coordinator = self._owned(txn, principal)
        topics = list(dict.fromkeys(body.partitions))
        if not topics:
            raise BadRequestError("ADD_PARTITION_TO_TXN names no partition")
        by_store: dict[str, list[str]] = {}
        for topic in topics:
            by_store.setdefault(self._store_address(topic), []).append(topic)
        added = [coordinator.add_partitions(txn, names, store) for store, names in by_store.items()]
        command = pulsar.BaseCommand(type=T.ADD_PARTITION_TO_TXN_RESPONSE)
        response = command.addPartitionToTxnResponse
        response.request_id = body.request_id
        response.txnid_most_bits, response.txnid_least_bits = txn.most, txn.least
        return self._registered(added, encode_command(command), session_id, txn, [(t, "") for t in topics])

    def add_subscriptions(
        self, body: pulsar.CommandAddSubscriptionToTxn, principal: str, session_id: int = 0
    ) -> Awaitable[bytes]:
        txn = _txn(body.txnid_most_bits, body.txnid_least_bits)
        coordinator = self._owned(txn, principal)
        pairs = list(dict.fromkeys((s.topic, s.subscription) for s in body.subscription))
        if not pairs:
            raise BadRequestError("ADD_SUBSCRIPTION_TO_TXN names no subscription")
        by_store: dict[str, list[tuple[str, str]]] = {}
        for topic, subscription in pairs:
            by_store.setdefault(self._store_address(topic), []).append((topic, subscription))
        added = [coordinator.add_subscriptions(txn, subs, store) for store, subs in by_store.items()]
        command = pulsar.BaseCommand(type=T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE)
        response = command.addSubscriptionToTxnResponse
        response.request_id = body.request_id
        response.txnid_most_bits, response.txnid_least_bits = txn.most, txn.least
        return self._registered(added, encode_command(command), session_id, txn, pairs)

    def end_txn(self, body: pulsar.CommandEndTxn, principal: str) -> Awaitable[bytes]:
        txn = _txn(body.txnid_most_bits, body.txnid_least_bits)
        if not body.HasField("txn_action"):
            raise BadRequestError("END_TXN needs txn_action (COMMIT or ABORT)")
        coordinator = self._owned(txn, principal)
        ended = coordinator.end_txn(txn, body.txn_action == pulsar.COMMIT)
        if self._pacing is not None:
            self._pacing.ended(txn)  # a client ends only once its sends and acks were answered
        command = pulsar.BaseCommand(type=T.END_TXN_RESPONSE)
        response = command.endTxnResponse
        response.request_id = body.request_id
        response.txnid_most_bits, response.txnid_least_bits = txn.most, txn.least
        return _after([ended], encode_command(command))

    def _registered(
        self,
        added: list[Awaitable[object]],
        answer: bytes,
        session_id: int,
        txn: TxnID,
        items: list[tuple[str, str]],
    ) -> Awaitable[bytes]:
        pacing = self._pacing
        if pacing is None:
            return _after(added, answer)
        return _after(added, answer, partial(pacing.registered, session_id, txn, items))

    def session_closed(self, session_id: int) -> None:
        if self._pacing is not None:
            self._pacing.session_closed(session_id)


async def _after(
    waiting: list[Awaitable[object]], answer: bytes, then: Callable[[], None] | None = None
) -> bytes:
    await asyncio.gather(*waiting)
    if then is not None:
        then()  # before the answer is sent: the client's send can only follow it
    return answer


async def _then(held: Awaitable[None], begin: Callable[[], Awaitable[bytes]]) -> bytes:
    await held
    return await begin()


def response_error(
    kind: int, request_id: int, txn: tuple[int, int], error: int, message: str
) -> bytes | None:
    """The failure answer of a transaction command (each has a response type of its own, which is
    what Pulsar's clients wait for); None for a command that is not one of them."""
    field_by_type: dict[int, tuple[int, str]] = {
        T.NEW_TXN: (T.NEW_TXN_RESPONSE, "newTxnResponse"),
        T.ADD_PARTITION_TO_TXN: (T.ADD_PARTITION_TO_TXN_RESPONSE, "addPartitionToTxnResponse"),
        T.ADD_SUBSCRIPTION_TO_TXN: (T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, "addSubscriptionToTxnResponse"),
        T.END_TXN: (T.END_TXN_RESPONSE, "endTxnResponse"),
        T.TC_CLIENT_CONNECT_REQUEST: (T.TC_CLIENT_CONNECT_RESPONSE, "tcClientConnectResponse"),
    }
    found = field_by_type.get(kind)
    if found is None:
        return None
    response_type, field = found
    command = pulsar.BaseCommand()
    command.type = response_type  # type: ignore[assignment]
    response = getattr(command, field)
    response.request_id = request_id
    if field != "tcClientConnectResponse":
        response.txnid_most_bits, response.txnid_least_bits = txn
    response.error = error
    response.message = message
    return encode_command(command)
