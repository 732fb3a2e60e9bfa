"""An ack while the consumer is reconnecting is refused with a typed, retryable error (UNAVAILABLE),
not a bare ``ServiceError`` with UNKNOWN_ERROR: an application tells "retry later" by the code
(found by the cluster soak, tests/fault/cluster_soak.py, which counts such refusals as bad)."""

from __future__ import annotations

import pytest

from txnkeeper.client import Consumer, MessageId
from txnkeeper.client.placement import StoreRouter
from txnkeeper.errors import UnavailableError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.pool import ConnectionPool


async def test_an_ack_while_reconnecting_is_unavailable_and_says_to_ack_again() -> None:
    pool = ConnectionPool(5.0)
    consumer = Consumer(
        pool,
        "persistent://t/ns/x",
        "s",
        router=StoreRouter(["127.0.0.1:1"], 5.0, pool.request, lambda _: None),
        consumer_id=1,
        queue_size=10,
    )
    with pytest.raises(UnavailableError, match="reconnecting; ack again later") as refused:
        consumer.acknowledge(MessageId(0, 1))
    assert refused.value.code == api.UNAVAILABLE
