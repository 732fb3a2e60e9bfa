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
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial

from txnkeeper.aio import resolved
from txnkeeper.client.placement import Redirects, is_placement
from txnkeeper.errors import NotServedHereError, UnavailableError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, not_configured
from txnkeeper.protocol.pool import ConnectionPool
from txnkeeper.protocol.rpc import ClientTls
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.txnid import TxnID

REQUEST_TIMEOUT = 30.0
CONFIRMED_MEMORY = 200_000  # (txn, topic, subscription) confirmed registrations kept (oldest first out)
_Key = tuple[TxnID, str, str]


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
        command = api.Command()
        body: api.AddPartitionToTxn | api.AddSubscriptionToTxn
        if subscription:
            body = command.add_subscription
            body.subscriptions.add(topic=topic, subscription=subscription)
        else:
            body = command.add_partition
            body.topics.append(topic)
        body.txn_id.most, body.txn_id.least = txn.most, txn.least
        body.store_address = self._own_address(topic)
        body.owner_token = self._secret.owner_token(txn)
        done = asyncio.ensure_future(self._register(txn.most, address, command))
        self._pending[key] = done
        done.add_done_callback(partial(self._registered, key))
        return asyncio.shield(done)

    async def _register(self, coordinator_id: int, address: str, command: api.Command) -> None:
        redirects = Redirects(f"confirming a registration with coordinator {coordinator_id}", REQUEST_TIMEOUT)
        while True:
            try:
                await self._pool.request(address, command)
                return
            except NotServedHereError as exc:
                if not is_placement(exc):
                    raise
                owner = await redirects.after(exc)
                if owner is not None:
                    address = self._moved[coordinator_id] = owner

    def _registered(self, key: _Key, done: asyncio.Future[None]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        self._confirmed[key] = None
        while len(self._confirmed) > CONFIRMED_MEMORY:
            self._confirmed.popitem(last=False)

    async def close(self) -> None:
        await self._pool.close()
