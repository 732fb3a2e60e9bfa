"""Transactional load through txnkeeper's client, and the check that nothing acknowledged was lost.

Why: the cluster tests' final word is "every acknowledged message and committed transaction is still
there", across restarts, upgrades and downgrades. This records exactly what the service acknowledged
(a commit that returned, an abort that returned) so the check compares against facts, not intentions.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from txnkeeper.client import Client


@dataclass
class Record:
    """What the service acknowledged, per topic."""

    committed: dict[str, list[bytes]] = field(default_factory=dict)
    aborted: dict[str, list[bytes]] = field(default_factory=dict)
    committed_txns: int = 0
    aborted_txns: int = 0

    def merge(self, other: Record) -> None:
        for topic, msgs in other.committed.items():
            self.committed.setdefault(topic, []).extend(msgs)
        for topic, msgs in other.aborted.items():
            self.aborted.setdefault(topic, []).extend(msgs)
        self.committed_txns += other.committed_txns
        self.aborted_txns += other.aborted_txns


async def produce(
    coordinators: list[str],
    stores: list[str],
    topics: list[str],
    *,
    txns: int,
    per_txn: int = 3,
    abort_every: int = 4,
    tag: str = "",
) -> Record:
    """`txns` transactions, each writing `per_txn` messages to every topic; every `abort_every`-th aborts."""
    record = Record()
    tag = tag or uuid.uuid4().hex[:6]
    async with Client(coordinators=coordinators, stores=stores) as client:
        producers = {t: await client.create_producer(t) for t in topics}
        for i in range(txns):
            txn = await client.new_transaction(timeout_ms=60_000)
            sent: dict[str, list[bytes]] = {}
            for topic, producer in producers.items():
                for j in range(per_txn):
                    payload = f"{tag}-{i}-{j}".encode()
                    await producer.send(payload, txn=txn)
                    sent.setdefault(topic, []).append(payload)
            if abort_every and i % abort_every == abort_every - 1:
                await txn.abort()
                record.aborted_txns += 1
                for topic, msgs in sent.items():
                    record.aborted.setdefault(topic, []).extend(msgs)
            else:
                await txn.commit()
                record.committed_txns += 1
                for topic, msgs in sent.items():
                    record.committed.setdefault(topic, []).extend(msgs)
        for producer in producers.values():
            await producer.close()
    return record


async def read_all(stores: list[str], topic: str, receive_seconds: float = 60.0) -> list[bytes]:
    """Every message a fresh subscription is given, up to an end marker written now (non-transactional,
    so it lands after every earlier message: reaching it means everything before it was dispatched)."""
    marker = f"end-marker-{uuid.uuid4().hex}".encode()
    async with Client(coordinators=[], stores=stores) as client:
        consumer = await client.subscribe(topic, f"verify-{uuid.uuid4().hex[:8]}")
        producer = await client.create_producer(topic)
        await producer.send(marker)
        await producer.close()
        seen: list[bytes] = []
        while True:
            message = await asyncio.wait_for(consumer.receive(), receive_seconds)
            if message.data == marker:
                break
            if not message.data.startswith(b"end-marker-"):
                seen.append(message.data)
        await consumer.close()
    return seen


async def verify(stores: list[str], record: Record) -> None:
    """Every committed message is there exactly once; no aborted one ever is."""
    for topic, committed in record.committed.items():
        seen = await read_all(stores, topic)
        missing = set(committed) - set(seen)
        leaked = set(record.aborted.get(topic, [])) & set(seen)
        duplicates = len(seen) - len(set(seen))
        assert not missing, f"{topic}: {len(missing)} committed messages lost, e.g. {sorted(missing)[:5]}"
        assert not leaked, f"{topic}: {len(leaked)} aborted messages delivered, e.g. {sorted(leaked)[:5]}"
        assert duplicates == 0, f"{topic}: {duplicates} duplicate deliveries"
