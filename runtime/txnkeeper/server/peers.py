"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else. The ends bound for one store pod in one event-loop turn go out together, as one
``EndTxnsOnStore``, so many transactions ending at once cost the coordinator and the store one frame,
not one each; every end still succeeds or fails on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial

from txnkeeper.aio import failure_of, settle
from txnkeeper.errors import ServiceError, from_error_frame
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret
from txnkeeper.protocol.pool import ConnectionPool
from txnkeeper.protocol.rpc import ClientTls, RpcConnection, expect
from txnkeeper.txnid import TxnID

REQUEST_TIMEOUT = 30.0
log = logging.getLogger(__name__)
# What an end's sender is told: None once the store applied it, else why not.
Outcome = Callable[[BaseException | None], None]


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self, secret: ClusterSecret | None = None, *, tls: ClientTls | None = None) -> None:
        """``tls``: store connections are mutual TLS (the pod's certificate; server/tls_reload.py)."""
        self._secret = secret
        self._pool = ConnectionPool(REQUEST_TIMEOUT, on_connect=self._authenticate, tls=tls)
        # address -> (the EndTxnsOnStore being filled this turn, the senders of its ends in order)
        self._queued: dict[str, tuple[api.Command, list[Outcome]]] = {}
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
        done: asyncio.Future[None] = self._event_loop().create_future()
        self.end_on_store_then(
            address, txn_id, commit, (topics, subscriptions, deadline_ms), partial(_settle_end, done)
        )
        return done

    def end_on_store_then(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        ends: tuple[Sequence[str], Sequence[tuple[str, str]], int],
        then: Outcome,
    ) -> None:
        """Queue the end for ``address`` (``ends``: its topics, subscriptions and deadline); ``then``
        is called with None once that store applied it, or with the error."""
        queued = self._queued.get(address)
        if queued is None:
            queued = self._queued[address] = (api.Command(), [])
            self._event_loop().call_soon(self._send, address)
        command, waiting = queued
        topics, subscriptions, deadline_ms = ends
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
        waiting.append(then)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

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
            _tell_all(waiting, exc)
            return
        response.add_done_callback(partial(_answered, waiting))

    async def close(self) -> None:
        await self._pool.close()


def _settle_end(done: asyncio.Future[None], failure: BaseException | None) -> None:
    settle(done, failure, None)


def _tell(then: Outcome, failure: BaseException | None) -> None:
    try:
        then(failure)
    except Exception:  # one sender's bug must not keep the others from hearing their outcome
        log.exception("handling the outcome of an end failed")


def _tell_all(waiting: list[Outcome], failure: BaseException | None) -> None:
    for then in waiting:
        _tell(then, failure)


def _answered(waiting: list[Outcome], response: asyncio.Future[api.Command]) -> None:
    failure = failure_of(response)
    if failure is not None:
        _tell_all(waiting, failure)
        return
    answer = response.result()
    result = answer.end_txns_on_store_result
    if answer.WhichOneof("body") != "end_txns_on_store_result" or len(result.failed) != len(result.errors):
        # Not an answer this request can have: nothing is known to be applied, so all are retried.
        unexpected = ServiceError(f"malformed answer to {len(waiting)} ends: {answer.WhichOneof('body')}")
        _tell_all(waiting, unexpected)
        return
    if not result.failed:
        _tell_all(waiting, None)
        return
    failed = {i: from_error_frame(error) for i, error in zip(result.failed, result.errors, strict=True)}
    for index, then in enumerate(waiting):
        _tell(then, failed.get(index))
