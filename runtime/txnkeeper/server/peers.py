"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else. The ends bound for one store pod in one event-loop turn go out together, as one
``EndTxnsOnStore``, so many transactions ending at once cost the coordinator and the store one frame,
not one each; every end still succeeds or fails on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

from txnkeeper.aio import failure_of, settle
from txnkeeper.errors import ServiceError, from_error_frame
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret
from txnkeeper.protocol.pool import ConnectionPool
from txnkeeper.protocol.rpc import RpcConnection, expect
from txnkeeper.txnid import TxnID

REQUEST_TIMEOUT = 30.0


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self, secret: ClusterSecret | None = None) -> None:
        self._secret = secret
        self._pool = ConnectionPool(REQUEST_TIMEOUT, on_connect=self._authenticate)
        # address -> (the EndTxnsOnStore being filled this turn, the waiters of its ends in order)
        self._queued: dict[str, tuple[api.Command, list[asyncio.Future[None]]]] = {}
        # The loop the ends are sent from, once known (asking asyncio each time costs a system call).
        self._loop: asyncio.AbstractEventLoop | None = None

    def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
        *,
        deadline_ms: int = 0,
    ) -> asyncio.Future[None]:
        """Queue the end for ``address``; the future resolves once that store applied it."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        queued = self._queued.get(address)
        if queued is None:
            queued = self._queued[address] = (api.Command(), [])
            loop.call_soon(self._send, address)
        command, waiting = queued
        # Added in place to the request of this turn (building an end and adding it copies it).
        end = command.end_txns_on_store.ends.add()
        end.txn_id.most = txn_id.most
        end.txn_id.least = txn_id.least
        end.action = api.COMMIT if commit else api.ABORT
        end.topics.extend(topics)
        end.deadline_ms = deadline_ms
        for topic, subscription in subscriptions:
            ref = end.subscriptions.add()
            ref.topic = topic
            ref.subscription = subscription
        done: asyncio.Future[None] = loop.create_future()
        waiting.append(done)
        return done

    async def _authenticate(self, conn: RpcConnection) -> None:
        """Prove to the store that this is a coordinator (stores accept ends only from coordinators):
        answer its fresh nonce with an HMAC under the cluster secret, which never crosses the wire."""
        if self._secret is None:
            return  # the store refuses the ends, naming the flag; the coordinator logs it and retries
        challenge = api.Command()
        challenge.auth_challenge.SetInParent()
        nonce = expect(await conn.request(challenge, REQUEST_TIMEOUT), "auth_nonce").auth_nonce.nonce
        command = api.Command()
        command.authenticate.proof = self._secret.coordinator_proof(nonce)
        await conn.request(command, REQUEST_TIMEOUT)

    def _send(self, address: str) -> None:
        queued = self._queued.pop(address, None)
        if queued is None:
            return
        command, waiting = queued
        try:
            response = asyncio.ensure_future(self._pool.request(address, command))
        except Exception as exc:
            for done in waiting:
                settle(done, exc, None)
            return
        response.add_done_callback(partial(_answered, waiting))

    async def close(self) -> None:
        await self._pool.close()


def _answered(waiting: list[asyncio.Future[None]], response: asyncio.Future[api.Command]) -> None:
    failure = failure_of(response)
    if failure is not None:
        for done in waiting:
            settle(done, failure, None)
        return
    answer = response.result()
    result = answer.end_txns_on_store_result
    if answer.WhichOneof("body") != "end_txns_on_store_result" or len(result.failed) != len(result.errors):
        # Not an answer this request can have: nothing is known to be applied, so all are retried.
        unexpected = ServiceError(f"malformed answer to {len(waiting)} ends: {answer.WhichOneof('body')}")
        for done in waiting:
            settle(done, unexpected, None)
        return
    failed = {i: from_error_frame(error) for i, error in zip(result.failed, result.errors, strict=True)}
    for index, done in enumerate(waiting):
        settle(done, failed.get(index), None)
