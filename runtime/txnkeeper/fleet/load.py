"""Transactional load for the local fleet: producers commit batches of messages in transactions and
consumers acknowledge what they receive in transactions, through the real client library.

This is what fills the transaction logs and pending-ack logs with (batched) records while the fleet
is rolled, so the demo's batching figures and its downgrade gate are about live data. Pods restart
under it: an operation that fails because its pod is restarting is counted and retried, never hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

from txnkeeper.client.client import Client
from txnkeeper.protocol.rpc import ClientTls

TXN_TIMEOUT_MS = 10_000  # short, so a transaction orphaned by a restart ends (and unpins its ledger) soon
MESSAGES_PER_TXN = 8
PACE_S = 0.02  # keep the load light: this machine is shared


@dataclass
class LoadFigures:
    committed_txns: int = 0
    produced: int = 0
    consumed_txns: int = 0
    acked: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        failed = sum(self.failures.values())
        kinds = ", ".join(f"{k} x{n}" for k, n in self.failures.most_common(3))
        return (
            f"{self.committed_txns} producer txns committed ({self.produced} msgs), "
            f"{self.consumed_txns} ack txns committed ({self.acked} acks), "
            f"{failed} retried{f' ({kinds})' if kinds else ''}"
        )


def _spread_topics(stores: list[str], per_store: int) -> list[str]:
    """Topic names that land ``per_store`` on every store (placement is a hash of the name)."""
    placement = Client(coordinators=[], stores=stores)
    chosen: dict[str, list[str]] = {s: [] for s in stores}
    i = 0
    while any(len(t) < per_store for t in chosen.values()):
        name = f"persistent://public/demo/orders-{i}"
        topics = chosen[placement.store_for(name)]
        if len(topics) < per_store:
            topics.append(name)
        i += 1
    return sorted(t for topics in chosen.values() for t in topics)


class TransactionalLoad:
    def __init__(
        self,
        coordinators: list[str],
        stores: list[str],
        topics_per_store: int = 2,
        *,
        tls: ClientTls | None = None,
    ) -> None:
        """``tls``: the fleet's client TLS (fleet/certificates.py), None against plaintext members."""
        self.coordinators = coordinators
        self.stores = stores
        self.topics = _spread_topics(stores, topics_per_store)
        self.figures = LoadFigures()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: Client | None = None
        self._tls = tls

    def start(self) -> None:
        self._client = Client(coordinators=self.coordinators, stores=self.stores, tls=self._tls)
        for topic in self.topics:
            self._tasks.append(asyncio.create_task(self._produce(topic)))
            self._tasks.append(asyncio.create_task(self._consume(topic)))

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def _failed(self, err: BaseException) -> None:
        self.figures.failures[type(err).__name__] += 1

    async def _produce(self, topic: str) -> None:
        assert self._client is not None
        client = self._client
        producer = None
        seq = 0
        while not self._stop.is_set():
            try:
                if producer is None:
                    producer = await client.create_producer(topic)
                txn = await client.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
                # Sent concurrently, as an application pipelines: concurrent records are what the
                # buffered writers can batch (a strictly serial client gives batches of one).
                first = seq + 1
                seq += MESSAGES_PER_TXN
                await asyncio.gather(
                    *(
                        producer.send(f"order-{n}".encode(), key=str(n % 16), txn=txn)
                        for n in range(first, seq + 1)
                    )
                )
                await txn.commit()
                self.figures.committed_txns += 1
                self.figures.produced += MESSAGES_PER_TXN
                await self._pause(PACE_S)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._failed(err)
                producer = None
                await self._pause(0.3)

    async def _consume(self, topic: str) -> None:
        assert self._client is not None
        client = self._client
        consumer = None
        idle = 0
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = await client.subscribe(topic, "billing")
                first = await consumer.receive(timeout=1.0)
                idle = 0
                messages = [first]
                while len(messages) < MESSAGES_PER_TXN:
                    try:
                        messages.append(await consumer.receive(timeout=0.05))
                    except TimeoutError:
                        break
                txn = await client.new_transaction(timeout_ms=TXN_TIMEOUT_MS)
                await asyncio.gather(*(consumer.acknowledge(m, txn=txn) for m in messages))
                await txn.commit()
                self.figures.consumed_txns += 1
                self.figures.acked += len(messages)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                # Producers commit continuously, so a silent consumer lost its store (restarted
                # under it): subscribe afresh rather than wait on a dead subscription.
                idle += 1
                if idle >= 3 and consumer is not None:
                    with contextlib.suppress(Exception):
                        await consumer.close()
                    consumer, idle = None, 0
            except Exception as err:
                self._failed(err)
                if consumer is not None:
                    with contextlib.suppress(Exception):
                        await consumer.redeliver_unacknowledged_messages()
                await self._pause(0.3)
