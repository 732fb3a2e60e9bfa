"""Child process of the soak: a store-level workload that runs until it is SIGKILLed.

Usage: ``python -m tests.fault.workload ROOT SEED MODE`` (MODE: on, off or mixed batching). ROOT is laid
out like a pod's data directory (contracts §6): ``ledgers/`` (txn log of coordinator 0, a pending-ack
store, a topic ledger with a cursor, and the subscriptions' ledgers), ``coordinator/0.sequence``,
``coordinator/routes.json`` and ``store/subscriptions.json``.

Every record's content is derived from its sequence number (see ``expected_*``), so the parent can tell
wrong data from right. Every line is one ``os.write`` shorter than PIPE_BUF (whole in the pipe or not at
all) and is written before the child acts further on what it reports; ``*I`` lines announce an intent
(the act may or may not have happened at a kill), the others a completed, durable act:

  R                                   open and recovered
  Q seq                               the sequence allocator handed out seq (intent to write txn seq)
  A seq k ledger entry size index     txn-log record k (0 NEW, 1 ADD_PARTITION) of seq acknowledged
  P seq ledger entry size index       the pending-ack ACK record of seq acknowledged
  E seq ledger entry                  the topic entry of seq acknowledged
  X seq / XD seq                      deleting seq from both stores / deleted
  MI ledger entry / MD ledger entry   the topic cursor's mark-delete: starting / durable
  RI topic addr / RD topic addr       learning a route / durable
  SI topic sub / SD topic sub         registering a subscription / durable
  C on|off                            batching switched (mixed mode)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
from pathlib import Path

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.topic.pending_ack_log import PendingAckLogAdapter
from txnkeeper.topic.service import TopicLedger, TopicService
from txnkeeper.txnlog import TransactionLogStore, TxnID

COORDINATOR = 0
DATA_TOPIC = "persistent://soak/ns/data"
ACK_TOPIC = "persistent://soak/ns/in"
ACK_SUBSCRIPTION = "work"
CURSOR = "soak-sub"
LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=30, max_size_per_ledger_bytes=8000)
SEQUENCE_BLOCK = 40  # small, so the sequence file is rewritten often
WRITERS = 8
DELETE_EVERY = 3
ROUTE_TOPICS = 6
SUBSCRIPTION_NAMES = 4
BATCHING = {
    "on": BatchedWriteConfig(enabled=True, max_records=8, max_delay_millis=1),
    "off": BatchedWriteConfig(enabled=False),
}


def ledgers_dir(root: Path) -> Path:
    return root / "ledgers"


def sequence_path(root: Path) -> Path:
    return root / "coordinator" / f"{COORDINATOR}.sequence"


def routes_path(root: Path) -> Path:
    return root / "coordinator" / "routes.json"


def subscriptions_path(root: Path) -> Path:
    return root / "store" / "subscriptions.json"


def payload(seq: int) -> bytes:
    """The topic entry of ``seq``: self-describing, variable length."""
    return b"%d:" % seq + (hashlib.sha256(b"%d" % seq).digest() * 4)[: 1 + seq % 97]


def expected_new(seq: int) -> tm.TransactionMetadataEntry:
    return tm.TransactionMetadataEntry(
        metadata_op=tm.TransactionMetadataEntry.NEW,
        txnid_most_bits=COORDINATOR,
        txnid_least_bits=seq,
        timeout_ms=1000 + seq % 997,
        start_time=1_700_000_000_000 + seq,
        last_modification_time=1_700_000_000_000 + seq,
        owner=f"owner-{seq}",
    )


def expected_partition(seq: int) -> str:
    return f"persistent://soak/ns/p{seq}"


def expected_ack(seq: int) -> pa.PendingAckMetadataEntry:
    return pa.PendingAckMetadataEntry(
        pending_ack_op=pa.ACK,
        ack_type=pa.CommandAck.Individual,
        txnid_most_bits=COORDINATOR,
        txnid_least_bits=seq,
        pending_ack_metadata=[pa.PendingAckMetadata(ledgerId=seq, entryId=seq * 7 % 1000)],
    )


def route_topic(seq: int) -> str:
    return f"persistent://soak/ns/r{seq % ROUTE_TOPICS}"


def route_address(seq: int) -> str:
    return f"store-{seq}.soak.svc:6650"


def subscription_of(seq: int) -> tuple[str, str]:
    return f"persistent://soak/ns/s{seq % 2}", f"sub{seq % SUBSCRIPTION_NAMES}"


def report(line: str) -> None:
    os.write(1, (line + "\n").encode())


def topic_service(root: Path, factory: ManagedLedgerFactory, config: BatchedWriteConfig) -> TopicService:
    """The store role's subscription registry, over the same factory (as a store pod builds it)."""

    async def open_ledger(topic: str) -> TopicLedger:
        return await factory.open(topic, LEDGER_CONFIG)

    async def open_pending_ack(topic: str, subscription: str) -> PendingAckLogAdapter:
        store = await PendingAckStore.open(factory, topic, subscription, config, ledger_config=LEDGER_CONFIG)
        return PendingAckLogAdapter(store)

    subscriptions_path(root).parent.mkdir(parents=True, exist_ok=True)
    return TopicService(subscriptions_path(root), open_ledger, open_pending_ack)


async def main(root: Path, seed: int, mode: str) -> None:
    rng = random.Random(seed)
    config = BATCHING["on" if mode == "mixed" else mode]
    factory = ManagedLedgerFactory(ledgers_dir(root))
    txnlog = await TransactionLogStore.open(factory, COORDINATOR, config, ledger_config=LEDGER_CONFIG)
    pending = await PendingAckStore.open(
        factory, ACK_TOPIC, ACK_SUBSCRIPTION, config, ledger_config=LEDGER_CONFIG
    )
    data = await factory.open(DATA_TOPIC, LEDGER_CONFIG)
    cursor = await data.open_cursor(CURSOR)
    sequence = SequenceAllocator(sequence_path(root), block=SEQUENCE_BLOCK)
    sequence.load()
    routes = RouteTable(routes_path(root))
    routes.load()
    topics = topic_service(root, factory, config)
    await topics.recover()
    report("R")
    consumed: list[Position] = []

    async def writer() -> None:
        while True:
            seq = await sequence.next()
            report(f"Q {seq}")
            new = txnlog.append(expected_new(seq))
            add = txnlog.append(
                tm.TransactionMetadataEntry(
                    metadata_op=tm.TransactionMetadataEntry.ADD_PARTITION,
                    txnid_most_bits=COORDINATOR,
                    txnid_least_bits=seq,
                    partitions=[expected_partition(seq)],
                )
            )
            for k, future in enumerate((new, add)):
                p = await future
                report(f"A {seq} {k} {p.ledger_id} {p.entry_id} {p.batch_size} {p.batch_index}")
            p = await pending.append(expected_ack(seq))
            report(f"P {seq} {p.ledger_id} {p.entry_id} {p.batch_size} {p.batch_index}")
            position = await data.add_entry(payload(seq))
            report(f"E {seq} {position.ledger_id} {position.entry_id}")
            consumed.append(position)
            if seq % 10 == 0:
                topic, address = route_topic(seq), route_address(seq)
                report(f"RI {topic} {address}")
                await routes.learn([topic], address)
                report(f"RD {topic} {address}")
            if seq % 25 == 0:
                topic, name = subscription_of(seq)
                report(f"SI {topic} {name}")
                await topics.subscription(topic, name)
                report(f"SD {topic} {name}")
            if seq % DELETE_EVERY == 0:
                report(f"X {seq}")
                await txnlog.delete_txn(TxnID(COORDINATOR, seq))
                await pending.delete_txn(TxnID(COORDINATOR, seq))
                report(f"XD {seq}")

    async def consumer() -> None:
        while True:
            await asyncio.sleep(0.005)  # pacing only: nothing is judged on this timing
            if len(consumed) < 20:
                continue
            behind = sorted(consumed)[: len(consumed) // 2]
            target = behind[-1]
            consumed[:] = [p for p in consumed if p > target]
            report(f"MI {target.ledger_id} {target.entry_id}")
            await cursor.mark_delete(target)
            report(f"MD {target.ledger_id} {target.entry_id}")
            await data.trim()

    async def switcher() -> None:
        on = True
        while mode == "mixed":
            await asyncio.sleep(rng.uniform(0.005, 0.05))  # pacing only
            on = not on
            report(f"C {'on' if on else 'off'}")
            chosen = BATCHING["on" if on else "off"]
            await txnlog.configure(chosen)
            await pending.configure(chosen)

    await asyncio.gather(*(writer() for _ in range(WRITERS)), consumer(), switcher())


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
