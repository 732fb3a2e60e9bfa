"""How a coordinator reaches store pods: one pipelined connection per store address, reopened on loss.

This is the coordinator's ``EndTxnSink``: ends travel over the same client protocol as everything
else. The ends bound for one store pod in one event-loop turn go out together, as one
``EndTxnsOnStore`` (or a plain ``EndTxnOnStore`` when there is just one), so many transactions ending
at once cost the coordinator and the store one frame, not one each; every end still succeeds or
fails on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

from txnkeeper.coordinator.futures import failure_of, settle
from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.errors import ServiceError, from_error_frame
from txnkeeper.protocol.pool import ConnectionPool

REQUEST_TIMEOUT = 30.0

_Queued = list[tuple[api.EndTxnOnStore, asyncio.Future[None]]]


class StorePeers:
    """Connections from this pod to store pods, by address."""

    def __init__(self) -> None:
        self._pool = ConnectionPool(REQUEST_TIMEOUT)
        self._queued: dict[str, _Queued] = {}

    def end_on_store(
        self,
        address: str,
        txn_id: TxnID,
        commit: bool,
        topics: Sequence[str],
        subscriptions: Sequence[tuple[str, str]],
    ) -> asyncio.Future[None]:
        """Queue the end for ``address``; the future resolves once that store applied it."""
        loop = asyncio.get_running_loop()
        end = api.EndTxnOnStore()
        end.txn_id.most = txn_id.most
        end.txn_id.least = txn_id.least
        end.action = api.COMMIT if commit else api.ABORT
        end.topics.extend(topics)
        for topic, subscription in subscriptions:
            ref = end.subscriptions.add()
            ref.topic = topic
            ref.subscription = subscription
        done: asyncio.Future[None] = loop.create_future()
        queued = self._queued.get(address)
        if queued is None:
            queued = self._queued[address] = []
            loop.call_soon(self._send, address)
        queued.append((end, done))
        return done

    def _send(self, address: str) -> None:
        queued = self._queued.pop(address, [])
        if not queued:
            return
        command = api.Command()
        if len(queued) == 1:
            command.end_txn_on_store.CopyFrom(queued[0][0])
        else:
            command.end_txns_on_store.ends.extend(end for end, _ in queued)
        try:
            response = asyncio.ensure_future(self._pool.request(address, command))
        except Exception as exc:
            for _, done in queued:
                settle(done, exc, None)
            return
        response.add_done_callback(partial(_answered, [done for _, done in queued]))

    async def close(self) -> None:
        await self._pool.close()


def _answered(waiting: list[asyncio.Future[None]], response: asyncio.Future[api.Command]) -> None:
    failure = failure_of(response)
    if failure is not None:
        for done in waiting:
            settle(done, failure, None)
        return
    answer = response.result()
    if len(waiting) == 1:
        settle(waiting[0], None, None)  # a plain EndTxnOnStore: errors arrive as an error frame
        return
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
