"""Store side of Pulsar's transactions: a transactional SEND or ACK is applied only once the
transaction's coordinator holds the partition (or subscription) as part of it.

Why: txnkeeper's own clients prove that with the coordinator's ticket; Pulsar's clients register
with the coordinator (ADD_PARTITION_TO_TXN) and then send the bare transaction id. A store that
trusted the id would take messages of a forged or unregistered transaction that no coordinator will
ever end, and they would hold back every subscription of the topic (the transaction buffer waits
for their end). So the store asks the coordinator itself, over txnkeeper's own protocol, with the
owner token it can compute from the cluster secret: the registration is idempotent (a partition the
client registered costs the coordinator no log write), a transaction the coordinator does not know
(forged, ended, timed out) is refused with its error, and a confirmed (transaction, partition,
subscription) is remembered so later sends of it cost nothing. A coordinator id that moved to another
coordinator pod (contracts §12) is followed: the pod asked answers with its owner, remembered per id.

The confirmations one event-loop turn asks of one coordinator pod go in one ConfirmRegistrations (a
pulsar-perf transaction's SEND and ACK arrive together, and concurrent transactions' with them): one
request for many instead of a request, an answer and their framing each, on both pods (21.6 % of a
coordinator's samples at 16 transactions in flight went to answering them one by one). An item the
coordinator redirects, and every item for a coordinator pod that predates the batched request, goes
the old way, one AddPartitionToTxn / AddSubscriptionToTxn each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial

from txnkeeper.aio import failure_of, resolved, settle
from txnkeeper.client.placement import Redirects, is_placement
from txnkeeper.errors import (
    ConnectionClosedError,
    NotServedHereError,
    ServiceError,
    UnavailableError,
    from_error_frame,
)
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, not_configured
from txnkeeper.protocol.pool import ConnectionPool
from txnkeeper.protocol.rpc import ClientTls, expect
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.txnid import TxnID

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 30.0
CONFIRMED_MEMORY = 200_000  # (txn, topic, subscription) confirmed registrations kept (oldest first out)
CONFIRMATIONS_PER_REQUEST = 512  # the coordinator takes up to handler.MAX_CONFIRMATIONS
# A coordinator pod that closed the connection over a ConfirmRegistrations (it predates the request:
# its frame decoder finds no command it knows) is asked item by item for this long, then again batched
# (a rolling upgrade replaces it meanwhile).
LEGACY_RETRY_S = 60.0
_LEGACY_CLOSE = "carries no command"
_Key = tuple[TxnID, str, str]
_Item = tuple[_Key, "asyncio.Future[None]"]


class TxnRegistrations:
    def __init__(
        self,
        secret: ClusterSecret | None,
        placement: PulsarPlacement,
        own_address: Callable[[str], str],
        *,
        tls: ClientTls | None = None,
    ) -> None:
        """``own_address(topic)``: this store pod's address as coordinators reach it for ``topic``
        (where they send the transaction's end)."""
        self._secret = secret
        self._placement = placement
        self._own_address = own_address
        self._pool = ConnectionPool(REQUEST_TIMEOUT, tls=tls)  # tls: mutual, the pod's certificate
        self._confirmed: OrderedDict[_Key, None] = OrderedDict()
        self._pending: dict[_Key, asyncio.Future[None]] = {}
        self._moved: dict[int, str] = {}  # coordinator id -> the address a redirect named
        # (coordinator pod address, this pod's address for the items' topics) -> the items this loop
        # turn asked of that pod (sent by _flush): a request names one store address for all its items
        self._queued: dict[tuple[str, str], list[_Item]] = {}
        self._legacy: dict[str, float] = {}  # coordinator pod address -> when it refused the batch
        self._asking: set[asyncio.Future[None]] = set()  # requests under way (tasks are weakly held)
        self._event_loop: asyncio.AbstractEventLoop | None = None
        # The pod's metrics: registrations asked of coordinators, and the requests that carried them.
        self.confirmations = 0
        self.requests = 0

    def ensure(self, txn: TxnID, topic: str, subscription: str = "") -> Awaitable[None]:
        """Resolves once the coordinator holds ``topic`` (``subscription`` of it, if given) in
        ``txn``; fails with the coordinator's refusal."""
        key = (txn, topic, subscription)
        if key in self._confirmed:
            return resolved(None)
        pending = self._pending.get(key)
        if pending is not None:
            return asyncio.shield(pending)
        if self._secret is None:
            raise not_configured("a transactional send or ack over Pulsar's protocol")
        address = self._moved.get(txn.most) or self._placement.coordinator_address(txn.most)
        if address is None:
            raise UnavailableError(
                "this store pod does not know where transaction coordinators are: start it with"
                " --pulsar-coordinator-urls to serve Pulsar clients' transactions"
            )
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending[key] = done
        done.add_done_callback(partial(self._registered, key))
        batch = (address, self._own_address(topic))
        queued = self._queued.get(batch)
        if queued is None:
            queued = self._queued[batch] = []
            loop.call_soon(self._flush, batch)
        queued.append((key, done))
        self.confirmations += 1
        return asyncio.shield(done)

    def _flush(self, batch: tuple[str, str]) -> None:
        """Ask the coordinator pod at ``batch[0]`` for what this loop turn queued for it."""
        items = self._queued.pop(batch, [])
        address, store = batch
        refused_at = self._legacy.get(address)
        if refused_at is not None and time.monotonic() - refused_at < LEGACY_RETRY_S:
            for item in items:
                self._one_by_one(address, store, item)
            return
        for start in range(0, len(items), CONFIRMATIONS_PER_REQUEST):
            chunk = items[start : start + CONFIRMATIONS_PER_REQUEST]
            asking = asyncio.ensure_future(self._confirm(address, store, chunk))
            self._asking.add(asking)
            asking.add_done_callback(partial(self._asked, chunk))

    def _asked(self, items: list[_Item], asking: asyncio.Future[None]) -> None:
        self._asking.discard(asking)
        failure = failure_of(asking)
        if failure is not None:  # not answered at all (closing, a bug): its waiters must not hang
            if not isinstance(failure, asyncio.CancelledError):
                log.error("confirming registrations failed", exc_info=failure)
            _fail(items, failure)

    async def _confirm(self, address: str, store: str, items: list[_Item]) -> None:
        assert self._secret is not None
        command = api.Command()
        body = command.confirm_registrations
        body.store_address = store
        for (txn, topic, subscription), _done in items:
            registration = body.registrations.add(topic=topic, subscription=subscription)
            registration.txn_id.most, registration.txn_id.least = txn.most, txn.least
            registration.owner_token = self._secret.owner_token(txn)
        self.requests += 1
        try:
            response = await self._pool.request(address, command)
        except ConnectionClosedError as exc:
            if _LEGACY_CLOSE not in str(exc):
                _fail(items, exc)
                return
            log.warning(
                "coordinator pod %s does not take batched registration confirmations (an older"
                " version): confirming item by item for %gs",
                address,
                LEGACY_RETRY_S,
            )
            self._legacy[address] = time.monotonic()
            for item in items:
                self._one_by_one(address, store, item)
            return
        except Exception as exc:
            _fail(items, exc)
            return
        self._legacy.pop(address, None)
        results = expect(response, "registrations_confirmed").registrations_confirmed.results
        if len(results) != len(items):
            _fail(items, ServiceError(f"{address} answered {len(results)} of {len(items)} confirmations"))
            return
        for item, result in zip(items, results, strict=True):
            if not result.HasField("error"):
                settle(item[1], None, None)
                continue
            failure = from_error_frame(result.error)
            if isinstance(failure, NotServedHereError) and is_placement(failure):
                self._one_by_one(address, store, item, failure)
            else:
                settle(item[1], failure, None)

    def _one_by_one(
        self, address: str, store: str, item: _Item, redirect: NotServedHereError | None = None
    ) -> None:
        """Confirm ``item`` on its own (AddPartitionToTxn / AddSubscriptionToTxn), following
        placement redirects (``redirect``: the one the batch already got)."""
        (txn, topic, subscription), done = item
        assert self._secret is not None
        command = api.Command()
        single: api.AddPartitionToTxn | api.AddSubscriptionToTxn
        if subscription:
            single = command.add_subscription
            single.subscriptions.add(topic=topic, subscription=subscription)
        else:
            single = command.add_partition
            single.topics.append(topic)
        single.txn_id.most, single.txn_id.least = txn.most, txn.least
        single.store_address = store
        single.owner_token = self._secret.owner_token(txn)
        asking = asyncio.ensure_future(self._register(txn.most, address, command, redirect))
        self._asking.add(asking)
        asking.add_done_callback(self._asking.discard)
        asking.add_done_callback(partial(_settle_from, done))

    async def _register(
        self,
        coordinator_id: int,
        address: str,
        command: api.Command,
        redirect: NotServedHereError | None,
    ) -> None:
        redirects = Redirects(f"confirming a registration with coordinator {coordinator_id}", REQUEST_TIMEOUT)
        while True:
            if redirect is not None:
                owner = await redirects.after(redirect)
                if owner is not None:
                    address = self._moved[coordinator_id] = owner
            self.requests += 1
            try:
                await self._pool.request(address, command)
                return
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                redirect = exc

    def _registered(self, key: _Key, done: asyncio.Future[None]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        self._confirmed[key] = None
        while len(self._confirmed) > CONFIRMED_MEMORY:
            self._confirmed.popitem(last=False)

    async def close(self) -> None:
        for asking in list(self._asking):
            asking.cancel()
        await self._pool.close()


def _fail(items: list[_Item], failure: BaseException) -> None:
    for _key, done in items:
        settle(done, failure, None)


def _settle_from(done: asyncio.Future[None], asked: asyncio.Future[None]) -> None:
    settle(done, failure_of(asked), None)
