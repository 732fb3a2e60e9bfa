"""Transactional load through txnkeeper's client, and the check that nothing acknowledged was lost.

Why: the cluster tests' final word is "every acknowledged message and committed transaction is still
there", across restarts, upgrades and downgrades. This records exactly what the service acknowledged
(a commit that returned, an abort that returned) so the check compares against facts, not intentions.

It runs in a pod (a Job, shipped in a ConfigMap: it needs only txnkeeper.client and the standard
library) so that it reaches the pods by their pod IPs on any cluster, and the coordinators reach the
stores at the same addresses the client used:
  python workload.py produce --coordinators A,B --stores C,D --topics T1,T2 --txns N [--tag X]
  python workload.py subscribe --stores C,D --topics T1,T2 --subscription S
  python workload.py read --stores C,D --topics T1,T2 [--subscription S]
  python workload.py hold --coordinators A --stores C,D --topic T --timeout-ms MS
Each prints one line `RESULT <json>` at the end. With TXNKEEPER_TLS_CA_FILE set (a resource's TLS Secret
mounted, as the TLS test does) it connects over TLS, verifying the pods and presenting that certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from txnkeeper.client import Client, Consumer, Message, Transaction
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.errors import ServiceError, UnavailableError


@dataclass
class Record:
    """What the service acknowledged, per topic."""

    committed: dict[str, list[bytes]] = field(default_factory=dict)
    aborted: dict[str, list[bytes]] = field(default_factory=dict)
    committed_txns: int = 0
    aborted_txns: int = 0
    uncertain: dict[str, list[bytes]] = field(default_factory=dict)


async def produce(
    coordinators: list[str],
    stores: list[str],
    topics: list[str],
    *,
    txns: int,
    per_txn: int = 3,
    abort_every: int = 4,
    tag: str = "",
    seconds: float = 0.0,
) -> Record:
    """`txns` transactions, each writing `per_txn` messages to every topic; every `abort_every`-th aborts.
    With `seconds`, transactions go on until that much time has passed (at least `txns` of them)."""
    record = Record()
    tag = tag or uuid.uuid4().hex[:6]
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    async with Client(coordinators=coordinators, stores=stores, tls=TlsClientSettings.from_env()) as client:
        producers = {t: await client.create_producer(t) for t in topics}
        for i in itertools.count():
            if i >= txns and loop.time() >= until:
                break
            try:
                await _one_transaction(
                    client,
                    producers,
                    record,
                    f"{tag}-{i}",
                    abort=bool(abort_every and i % abort_every == abort_every - 1),
                    per_txn=per_txn,
                )
            except ServiceError:
                if not seconds:
                    raise
                # A pod it needed was killed (the scaling test does that): nothing of this transaction
                # was acknowledged as committed; the load goes on, as an application's retry would.
                await asyncio.sleep(0.5)  # back-off before the next transaction, not a synchronisation
        for producer in producers.values():
            await producer.close()
    return record


async def _one_transaction(
    client: Client, producers: dict[str, Any], record: Record, prefix: str, *, abort: bool, per_txn: int
) -> None:
    """One transaction; a message counts as committed or aborted only once the service said so (a
    failed commit leaves its messages in `uncertain`: they may or may not be visible, at most once)."""
    txn = await client.new_transaction(timeout_ms=60_000)
    sent: dict[str, list[bytes]] = {}
    try:
        for topic, producer in producers.items():
            for j in range(per_txn):
                payload = f"{prefix}-{j}".encode()
                sent.setdefault(topic, []).append(payload)
                await producer.send(payload, txn=txn)
        if abort:
            await txn.abort()
            record.aborted_txns += 1
            for topic, msgs in sent.items():
                record.aborted.setdefault(topic, []).extend(msgs)
        else:
            await txn.commit()
            record.committed_txns += 1
            for topic, msgs in sent.items():
                record.committed.setdefault(topic, []).extend(msgs)
    except ServiceError:
        for topic, msgs in sent.items():
            record.uncertain.setdefault(topic, []).extend(msgs)
        raise


async def read_all(
    stores: list[str], topic: str, subscription: str = "", receive_seconds: float = 60.0
) -> list[bytes]:
    """Every message `subscription` (default: a fresh one) is given, up to an end marker written now
    (non-transactional, so it lands after every earlier message: reaching it means everything before
    it was dispatched). Nothing is acknowledged.

    A fresh subscription sees only what is retained: like Pulsar, a ledger whose messages every
    existing subscription acknowledged is trimmed, so "still there" is checked on a subscription
    created before the messages were (see `subscribe`)."""
    marker = f"end-marker-{uuid.uuid4().hex}".encode()
    async with Client(coordinators=[], stores=stores, tls=TlsClientSettings.from_env()) as client:
        consumer = await client.subscribe(topic, subscription or f"verify-{uuid.uuid4().hex[:8]}")
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


async def subscribe(stores: list[str], topics: list[str], subscription: str) -> None:
    """Create a durable subscription (its cursor starts at the beginning and retains what follows)."""
    async with Client(coordinators=[], stores=stores, tls=TlsClientSettings.from_env()) as client:
        for topic in topics:
            consumer = await client.subscribe(topic, subscription)
            await consumer.close()


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


async def acknowledge(consumer: Consumer, message: Message, txn: Transaction) -> None:
    """The client refuses an ack while its consumer reconnects (its store pod killed, its shard moving)
    with a retryable UnavailableError, as its docs say: ack again until it is taken (60 s at most)."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            await consumer.acknowledge(message, txn=txn)
            return
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # a retry's pause: the consumer reconnects by itself


async def ack_in_transactions(
    coordinators: list[str], stores: list[str], topic: str, expect: list[bytes]
) -> int:
    """Receive `expect` on the shared subscription "work" and acknowledge each in a transaction that
    commits (what makes the pending-ack stores write). Returns how many messages were acknowledged."""
    wanted = set(expect)
    acked = 0
    async with Client(coordinators=coordinators, stores=stores, tls=TlsClientSettings.from_env()) as client:
        consumer = await client.subscribe(topic, "work")
        while wanted:
            message = await asyncio.wait_for(consumer.receive(), 60.0)
            txn = await client.new_transaction()
            await acknowledge(consumer, message, txn)
            await txn.commit()
            wanted.discard(message.data)
            acked += 1
        await consumer.close()
    return acked


async def hold(coordinators: list[str], stores: list[str], topic: str, timeout_ms: int) -> dict[str, str]:
    """Open a transaction that writes and acknowledges, then abandon it: it stays open (its log records
    live) until the coordinator's timeout aborts it."""
    async with Client(coordinators=coordinators, stores=stores, tls=TlsClientSettings.from_env()) as client:
        producer = await client.create_producer(topic)
        plain = f"hold-plain-{uuid.uuid4().hex[:6]}".encode()
        await producer.send(plain)
        consumer = await client.subscribe(topic, "hold")
        txn = await client.new_transaction(timeout_ms=timeout_ms)
        payload = f"hold-txn-{uuid.uuid4().hex[:6]}".encode()
        await producer.send(payload, txn=txn)
        message = await asyncio.wait_for(consumer.receive(), 60.0)
        await consumer.acknowledge(message, txn=txn)
        status = await client.transaction_status(txn)
        # The subscription starts at the oldest retained message, which is what this transaction acked.
        acked = message.data.decode()
        return {"txn": str(txn), "payload": payload.decode(), "acked": acked, "status": status}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="txnkeeper e2e workload")
    parser.add_argument("command", choices=["produce", "subscribe", "read", "hold"])
    parser.add_argument("--subscription", default="")
    parser.add_argument("--coordinators", default="")
    parser.add_argument("--stores", required=True)
    parser.add_argument("--topics", default="")
    parser.add_argument("--topic", default="")
    parser.add_argument("--txns", type=int, default=10)
    parser.add_argument("--tag", default="")
    parser.add_argument("--seconds", type=float, default=0.0, help="produce: keep going this long")
    parser.add_argument("--timeout-ms", type=int, default=120_000)
    args = parser.parse_args(argv)
    coordinators = [a for a in args.coordinators.split(",") if a]
    stores = [a for a in args.stores.split(",") if a]
    topics = [t for t in args.topics.split(",") if t]
    result: object
    if args.command == "produce":
        record = asyncio.run(
            produce(coordinators, stores, topics, txns=args.txns, tag=args.tag, seconds=args.seconds)
        )
        acked = {
            t: asyncio.run(ack_in_transactions(coordinators, stores, t, m))
            for t, m in record.committed.items()
        }
        result = {
            "committed": {t: [m.decode() for m in ms] for t, ms in record.committed.items()},
            "aborted": {t: [m.decode() for m in ms] for t, ms in record.aborted.items()},
            "uncertain": {t: [m.decode() for m in ms] for t, ms in record.uncertain.items()},
            "committedTxns": record.committed_txns,
            "abortedTxns": record.aborted_txns,
            "acked": acked,
        }
    elif args.command == "subscribe":
        asyncio.run(subscribe(stores, topics, args.subscription))
        result = {"subscribed": args.subscription, "topics": topics}
    elif args.command == "read":
        result = {
            t: [m.decode() for m in asyncio.run(read_all(stores, t, args.subscription))] for t in topics
        }
    else:
        result = asyncio.run(hold(coordinators, stores, args.topic, args.timeout_ms))
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
