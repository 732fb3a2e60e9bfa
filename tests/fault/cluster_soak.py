"""Kill-and-restart soak of real pods driven through the client API, with a JSON verdict (issue 25).

Why it exists next to tests/fault/soak.py: that soak judges the stores a pod keeps on disk, opened in
process; this one runs what users run. A coordinator pod and store pods are real ``txnkeeper serve``
processes on real data directories; a workload of applications using ``txnkeeper.client`` mixes full
transactions (produce + transactional ack of an input), pipelined PDP-44 single-key writers, named
idempotent producers, plain producers, and takeovers (a second instance opening the same writer id or
producer name, as a restarted application does); pods are SIGKILLed at random moments (some during
their own recovery) and restarted on the same data directory. The applications record exactly what
was acknowledged to them. After each kill/restart cycle the applications stop (in-doubt transactions
are resolved the way an application does: a failed commit is retried, an unfinished one aborted), and
a checker reads every topic through a fresh subscription up to a sentinel and the work subscription's
backlog, and compares them with what was acknowledged.

  python -m tests.fault.cluster_soak --kills 1000 --json     # prints one JSON object
  python -m tests.fault.cluster_soak --trial-seed S --json   # replays one trial's random choices

Categories: ``silent_loss`` (acknowledged, then missing: a message, a committed transaction's output
or its ack, a single-key commit, a named producer's send), ``wrong_data`` (present but different,
duplicated where exactly-once was promised, partly visible, aborted data delivered, out of order, a
message id holding other data), ``bad_refusal`` (an operation refused without a clear error: not a
``ServiceError``, ``UNKNOWN_ERROR``, or an empty message), ``unexpected_errors`` (the harness could
not judge: a pod did not come back, died by itself, or a topic stalled before its sentinel).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import socket
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnkeeper.client import (
    Client,
    Consumer,
    InvalidTxnStatusError,
    MessageId,
    Producer,
    ProducerFencedError,
    ServiceError,
    SingleKeyWriter,
    Transaction,
    WriterFencedError,
)
from txnkeeper.fleet.process import ProcessStartError, RuntimeProcess, write_admin_token
from txnkeeper.pb import txnkeeper_api_pb2 as api

FAILURES = ("silent_loss", "wrong_data", "bad_refusal", "unexpected_errors")
EXAMPLES = 3  # examples kept per category
RELEASE = "3.0.0"  # single-key transactions and named producers need format level 3
STORE_ARGS = ("--srk-enabled", "true")
BATCH_ON = {"enabled": True, "maxRecords": 512, "maxSizeBytes": 4194304, "maxDelayMillis": 1}
OPERATION_TIMEOUT = 15.0  # seconds a client operation (and a writer's or producer's resync) may take
TXN_TIMEOUT_MS = 20_000  # workload transactions: ended by the application well before
START_TIMEOUT = 90.0  # a (re)started pod is ready within this on a loaded machine, or the trial fails
STALL = 60.0  # the checker gives up on a topic that served nothing for this long before its sentinel
LATE = 20.0  # seconds the checker waits past a sentinel for a redelivery it expects
SETTLE = 60.0  # in-doubt transactions reach a final status within this after the restart
WRITER_IDS = ("w0", "w1")
PRODUCER_NAMES = ("p0", "p1")
SEND_WINDOW = 8  # a named producer's sends in flight
COMMIT_WINDOW = 4  # a single-key writer's commits in flight
PACE = 0.005  # seconds between a writer's commits and between a named producer's sends
INPUT_BACKLOG = 40  # inputs the input producer keeps ahead of the transactions consuming them
ABORT_SHARE = 0.15  # full transactions the application aborts on purpose


# --- what the applications were told ----------------------------------------------------------------


@dataclass
class FullTxn:
    """One full transaction: consumed ``input`` (acked in it), produced two outputs."""

    label: str
    input: str
    intent: str  # "commit" or "abort"
    txn: Transaction | None = None
    outputs: dict[str, MessageId | None] = field(default_factory=dict)  # payload -> id (None: no receipt)
    outcome: str = "unknown"  # "committed" / "aborted" (acknowledged), "not-begun", "unknown"
    status: str = ""  # the coordinator's answer for an in-doubt one after the restart


@dataclass
class SrkTxn:
    """One single-key transaction of ``writer`` (instance ``instance``), ``events`` in order."""

    writer: str
    instance: int
    number: int
    events: list[str]
    ids: list[MessageId] | None = None  # the commit's answer
    outcome: str = "unknown"  # "committed" (acknowledged) or "unknown"


@dataclass
class NamedSend:
    name: str
    instance: int
    number: int
    message_id: MessageId | None = None
    outcome: str = "unknown"  # "acknowledged" or "unknown"


@dataclass
class Record:
    """Everything acknowledged (or refused) to the applications of one trial, over all its cycles."""

    inputs_sent: set[str] = field(default_factory=set)
    inputs: dict[str, MessageId] = field(default_factory=dict)  # acknowledged plain sends
    txns: dict[str, FullTxn] = field(default_factory=dict)
    srk: dict[tuple[str, int, int], SrkTxn] = field(default_factory=dict)
    named: dict[str, NamedSend] = field(default_factory=dict)  # by payload
    sentinels: dict[str, MessageId] = field(default_factory=dict)  # "<topic> <payload>" -> id
    instances: Counter[str] = field(default_factory=Counter)  # instances opened per writer id / name
    refusals: Counter[str] = field(default_factory=Counter)  # clear refusals seen, by error type
    bad_refusals: list[str] = field(default_factory=list)

    def refused(self, exc: BaseException, what: str) -> None:
        """Judge an error an operation got: clear (a ServiceError with a code and a message) or not."""
        if isinstance(exc, asyncio.CancelledError):
            return  # the harness's own cancellation of what was still in flight at the cycle's end
        # A typed error is clear (the client's own, e.g. TransactionFailedError, name what failed);
        # a bare ServiceError with UNKNOWN_ERROR is what an unhandled server exception becomes.
        generic = type(exc) is ServiceError and exc.code == api.UNKNOWN_ERROR
        if isinstance(exc, ServiceError) and not generic and str(exc).strip():
            self.refusals[type(exc).__name__] += 1
        else:
            self.bad_refusals.append(
                f"{what}: {type(exc).__name__} (code {getattr(exc, 'code', '-')}): {exc}"
            )


def input_payload(n: int) -> str:
    return f"i|{n}"


def output_payload(label: str, source: str, k: int) -> str:
    return f"o|{label}|{source}|{k}"


def srk_payload(writer: str, instance: int, number: int, i: int) -> str:
    return f"s|{writer}|{instance}|{number}|{i}"


def named_payload(name: str, instance: int, number: int) -> str:
    return f"n|{name}|{instance}|{number}"


@dataclass(frozen=True)
class Topics:
    """The topics of one trial; the input and output topics are on different store pods (when there
    are several) so that every full transaction spans two stores."""

    inputs: str
    outputs: str
    srk: str
    named: str

    @classmethod
    def of_trial(cls, trial_seed: int, stores: int) -> Topics:
        base = f"persistent://soak/ns/t{trial_seed}"
        inputs = f"{base}-in"
        outputs = f"{base}-out"
        suffix = 0
        while stores > 1 and zlib.crc32(outputs.encode()) % stores == zlib.crc32(inputs.encode()) % stores:
            suffix += 1
            outputs = f"{base}-out{suffix}"
        return cls(inputs, outputs, f"{base}-srk", f"{base}-named")

    def all(self) -> tuple[str, ...]:
        return (self.inputs, self.outputs, self.srk, self.named)


PORTS = random.SystemRandom()  # not a trial's generator: probing must not shift a replay's choices
WORK = "work"  # the subscription the full transactions consume the inputs of


# --- the pods -------------------------------------------------------------------------------------


class Pods:
    """One coordinator pod and ``stores`` store pods of a trial, each on its own data directory."""

    def __init__(self, root: Path, stores: int, config: dict[str, Any]) -> None:
        token = write_admin_token(root / "token", "soak-admin-token")
        self.members: list[RuntimeProcess] = []
        for name, role, extra in [
            ("tc-0", "coordinator", ()),
            *((f"pas-{i}", "store", STORE_ARGS) for i in range(stores)),
        ]:
            pod = RuntimeProcess.in_work_dir(
                root, name, role, token_file=token, release=RELEASE, extra_args=extra, config=config
            )
            pod.listen = f"127.0.0.1:{fixed_port()}"
            self.members.append(pod)

    @property
    def coordinator(self) -> RuntimeProcess:
        return self.members[0]

    @property
    def stores(self) -> list[RuntimeProcess]:
        return self.members[1:]

    async def start(self, pods: list[RuntimeProcess] | None = None) -> None:
        todo = pods if pods is not None else self.members
        for pod in todo:
            pod.start()
        await asyncio.gather(*(self.ready(pod) for pod in todo))

    @staticmethod
    async def ready(pod: RuntimeProcess) -> None:
        await pod.wait_started(START_TIMEOUT)

    def client(self) -> Client:
        return Client(
            coordinators=[self.coordinator.listen],
            stores=[pod.listen for pod in self.stores],
            operation_timeout=OPERATION_TIMEOUT,
        )

    def dead(self) -> list[RuntimeProcess]:
        return [pod for pod in self.members if not pod.running()]

    async def stop(self) -> None:
        await asyncio.gather(*(pod.stop() for pod in self.members), return_exceptions=True)


def fixed_port() -> int:
    """A free port below the ephemeral range, for a pod's client port, which stays the same across
    its restarts (clients and the coordinator remember it). Below the range, no outgoing connection is
    given it as its local port while the pod is down (a port 0 answer would be in the range, and a
    restart then found it taken now and then)."""
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(1000):
        port = PORTS.randrange(max(1024, low - 12_000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port found below the ephemeral range (which starts at {low})")


# --- the applications -----------------------------------------------------------------------------


class Workload:
    """The applications of one cycle: each actor runs until ``stop`` and then waits for what it has
    in flight; clients are closed at the end, as a stopped application's are."""

    def __init__(self, pods: Pods, topics: Topics, record: Record, rng: random.Random, cycle: int) -> None:
        self.pods = pods
        self.topics = topics
        self.record = record
        self.rng = rng
        self.cycle = cycle
        self.stop = asyncio.Event()
        self.clients: list[Client] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.takeovers = 0

    def new_client(self) -> Client:
        client = self.pods.client()
        self.clients.append(client)
        return client

    def start(self) -> None:
        app = self.new_client()
        self.tasks.append(asyncio.ensure_future(self.inputs(app)))
        self.tasks.append(asyncio.ensure_future(self.transactions(app)))
        for writer_id in WRITER_IDS:
            self.tasks.append(asyncio.ensure_future(self.single_key_writer(writer_id)))
        for name in PRODUCER_NAMES:
            self.tasks.append(asyncio.ensure_future(self.named_producer(name)))

    def take_over(self) -> None:
        """A second instance of a writer id or producer name opens while the first one is running."""
        self.takeovers += 1
        if self.rng.random() < 0.5:
            self.tasks.append(asyncio.ensure_future(self.single_key_writer(self.rng.choice(WRITER_IDS))))
        else:
            self.tasks.append(asyncio.ensure_future(self.named_producer(self.rng.choice(PRODUCER_NAMES))))

    async def finish(self, stats: Stats) -> list[str]:
        """Stop the actors, resolve in-doubt transactions, close every client; returns what hung."""
        self.stop.set()
        hung: list[str] = []
        with stats.phase("stop_actors"):
            done, pending = await asyncio.wait(self.tasks, timeout=4 * OPERATION_TIMEOUT)
        for task in pending:
            task.cancel()
            hung.append(f"an application actor did not stop within {4 * OPERATION_TIMEOUT}s")
        for task in done:
            failure = task.exception()
            if failure is not None:
                hung.append(f"an application actor failed: {type(failure).__name__}: {failure}")
        await asyncio.gather(*pending, return_exceptions=True)
        with stats.phase("settle_transactions"):
            await settle_transactions(self.record, self.clients[0])
        with stats.phase("close_clients"):
            for client in self.clients:
                with contextlib.suppress(ServiceError):
                    await asyncio.wait_for(client.close(), OPERATION_TIMEOUT)
        return hung

    async def backoff(self) -> None:
        await asyncio.sleep(0.05 + 0.15 * self.rng.random())

    async def inputs(self, app: Client) -> None:
        """Plain sends of numbered inputs, kept a little ahead of the transactions consuming them."""
        record = self.record
        producer: Producer | None = None
        while not self.stop.is_set():
            consumed = sum(1 for t in record.txns.values() if t.outcome == "committed")
            if len(record.inputs) - consumed >= INPUT_BACKLOG:
                await asyncio.sleep(0.05)
                continue
            try:
                if producer is None:
                    producer = await app.create_producer(self.topics.inputs)
                batch = [input_payload(len(record.inputs_sent) + i) for i in range(10)]
                record.inputs_sent.update(batch)
                futures = [producer.send(p.encode()) for p in batch]
            except ServiceError as exc:
                record.refused(exc, "create/send of a plain producer")
                await self.backoff()
                continue
            for payload, outcome in zip(batch, await gather(futures), strict=True):
                if isinstance(outcome, MessageId):
                    record.inputs[payload] = outcome
                else:
                    record.refused(outcome, "plain send")

    async def transactions(self, app: Client) -> None:
        """Two workers: receive an input, begin, produce two outputs and ack the input in the
        transaction, then commit (or abort, on purpose, a share of them)."""
        consumer: Consumer | None = None
        producer: Producer | None = None
        while not self.stop.is_set() and (consumer is None or producer is None):
            try:
                if consumer is None:
                    consumer = await app.subscribe(self.topics.inputs, WORK, receiver_queue_size=20)
                producer = await app.create_producer(self.topics.outputs)
            except ServiceError as exc:
                self.record.refused(exc, "subscribe/create producer")
                await self.backoff()
        if consumer is None or producer is None:
            return
        counter = iter(range(1 << 30))
        await asyncio.gather(*(self.transaction_worker(app, consumer, producer, counter) for _ in range(2)))

    async def transaction_worker(
        self, app: Client, consumer: Consumer, producer: Producer, counter: Any
    ) -> None:
        record = self.record
        while not self.stop.is_set():
            try:
                message = await consumer.receive(timeout=0.3)
            except TimeoutError:
                continue
            except ServiceError as exc:
                record.refused(exc, "receive")
                await self.backoff()
                continue
            source = message.data.decode()
            if not source.startswith("i|"):  # a checker's sentinel
                with contextlib.suppress(ServiceError):
                    await consumer.acknowledge(message)
                continue
            label = f"c{self.cycle}-{next(counter)}"
            entry = FullTxn(label, source, "abort" if self.rng.random() < ABORT_SHARE else "commit")
            record.txns[label] = entry
            try:
                txn = await app.new_transaction(
                    TXN_TIMEOUT_MS,
                    topics=[self.topics.outputs],
                    subscriptions=[(self.topics.inputs, WORK)],
                )
            except ServiceError as exc:
                record.refused(exc, "begin")
                entry.outcome = "not-begun"
                continue
            entry.txn = txn
            payloads = [output_payload(label, source, k) for k in range(2)]
            entry.outputs = dict.fromkeys(payloads)
            try:
                sends = [producer.send(p.encode(), txn=txn) for p in payloads]
                acked = consumer.acknowledge(message, txn=txn)
            except ServiceError as exc:
                record.refused(exc, "transactional send/ack")
                continue  # left OPEN: aborted when the cycle settles
            outcomes = await gather([*sends, acked])
            for payload, outcome in zip(payloads, outcomes, strict=False):
                if isinstance(outcome, MessageId):
                    entry.outputs[payload] = outcome
                else:
                    record.refused(outcome, "transactional send")
            if isinstance(outcomes[-1], BaseException):
                record.refused(outcomes[-1], "transactional ack")
            try:
                if entry.intent == "abort":
                    await txn.abort()
                else:
                    await txn.commit()
            except ServiceError as exc:
                record.refused(exc, entry.intent)
            entry.outcome = {"COMMITTED": "committed", "ABORTED": "aborted"}.get(txn.state, "unknown")

    async def single_key_writer(self, writer_id: str) -> None:
        """An instance of writer ``writer_id``: one-to-three-event transactions, commits pipelined,
        until it is fenced by a newer instance; after any other failure a new instance continues."""
        record = self.record
        while not self.stop.is_set():
            record.instances[writer_id] += 1
            instance = record.instances[writer_id]
            app = self.new_client()
            try:
                writer = await app.create_single_key_writer(
                    self.topics.srk, f"key-{writer_id}", TXN_TIMEOUT_MS, writer_id=writer_id
                )
            except ServiceError as exc:
                record.refused(exc, f"open writer {writer_id}")
                await self.backoff()
                continue
            fenced = await self.commit_loop(writer, writer_id, instance)
            await writer.close()
            if fenced:
                return
            await self.backoff()

    async def commit_loop(self, writer: SingleKeyWriter, writer_id: str, instance: int) -> bool:
        record = self.record
        in_flight: dict[asyncio.Future[list[MessageId]], SrkTxn] = {}
        fenced = False
        number = 0
        while not self.stop.is_set() and not fenced:
            try:
                txn = writer.begin_transaction()
            except ServiceError as exc:
                fenced = isinstance(exc, WriterFencedError)
                break
            entry = SrkTxn(writer_id, instance, number, [])
            for i in range(1 + self.rng.randrange(3)):
                entry.events.append(srk_payload(writer_id, instance, number, i))
                txn.write(entry.events[-1].encode())
            record.srk[(writer_id, instance, number)] = entry
            number += 1
            in_flight[asyncio.ensure_future(txn.commit())] = entry
            # Paced (and at least one loop turn, in which the commit ends the transaction and numbers
            # its block): the checker reads everything back after each cycle, and a flood of tiny
            # commits would only slow it and the pods' restarts, not find more.
            await asyncio.sleep(PACE)
            if len(in_flight) >= COMMIT_WINDOW:
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                fenced = self.srk_answered(done, in_flight) or fenced
        if in_flight:
            done, pending = await asyncio.wait(in_flight, timeout=3 * OPERATION_TIMEOUT)
            fenced = self.srk_answered(done, in_flight) or fenced
            for future in pending:
                future.cancel()
        return fenced

    def srk_answered(
        self,
        done: set[asyncio.Future[list[MessageId]]],
        in_flight: dict[asyncio.Future[list[MessageId]], SrkTxn],
    ) -> bool:
        fenced = False
        for future in done:
            entry = in_flight.pop(future)
            failure = future.exception()
            if failure is None:
                entry.ids = future.result()
                entry.outcome = "committed"
            else:
                fenced = fenced or isinstance(failure, WriterFencedError)
                self.record.refused(failure, f"commit of writer {entry.writer}")
        return fenced

    async def named_producer(self, name: str) -> None:
        """An instance of producer ``name``: pipelined sends until it is fenced by a newer instance;
        after any other failure a new instance continues."""
        record = self.record
        while not self.stop.is_set():
            record.instances[name] += 1
            instance = record.instances[name]
            app = self.new_client()
            try:
                producer = await app.create_producer(self.topics.named, producer_name=name)
            except ServiceError as exc:
                record.refused(exc, f"open producer {name}")
                await self.backoff()
                continue
            fenced = await self.send_loop(producer, name, instance)
            await producer.abandon()
            if fenced:
                return
            await self.backoff()

    async def send_loop(self, producer: Producer, name: str, instance: int) -> bool:
        record = self.record
        in_flight: dict[asyncio.Future[MessageId], NamedSend] = {}
        failed = fenced = False
        number = 0
        while not self.stop.is_set() and not failed:
            payload = named_payload(name, instance, number)
            entry = record.named[payload] = NamedSend(name, instance, number)
            number += 1
            try:
                in_flight[producer.send(payload.encode())] = entry
            except ServiceError as exc:
                record.refused(exc, f"send of producer {name}")
                fenced = isinstance(exc, ProducerFencedError)
                break
            await asyncio.sleep(PACE)
            if len(in_flight) >= SEND_WINDOW:
                done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                failed, fenced = self.sends_answered(done, in_flight)
        if in_flight:
            done, pending = await asyncio.wait(in_flight, timeout=3 * OPERATION_TIMEOUT)
            _, more_fenced = self.sends_answered(done, in_flight)
            fenced = fenced or more_fenced
            for future in pending:
                future.cancel()
        return fenced

    def sends_answered(
        self, done: set[asyncio.Future[MessageId]], in_flight: dict[asyncio.Future[MessageId], NamedSend]
    ) -> tuple[bool, bool]:
        failed = fenced = False
        for future in done:
            entry = in_flight.pop(future)
            failure = future.exception()
            if failure is None:
                entry.message_id = future.result()
                entry.outcome = "acknowledged"
            else:
                failed = True
                fenced = fenced or isinstance(failure, ProducerFencedError)
                self.record.refused(failure, f"send of producer {entry.name}")
        return failed, fenced


async def gather(futures: list[Any]) -> list[Any]:
    """Every outcome (a result or the exception), waiting for all of them."""
    return list(await asyncio.gather(*futures, return_exceptions=True))


async def settle_transactions(record: Record, app: Client) -> None:
    """End every full transaction the applications left in doubt, as an application does after a
    crash: retry a commit whose answer was lost (the coordinator answers a repeated end
    idempotently), abort one never ended; then ask the coordinator for what is still in doubt."""
    for entry in record.txns.values():
        txn = entry.txn
        if txn is None or entry.outcome != "unknown":
            continue
        # A commit whose operation failed was turned into an abort by the client: which end was
        # attempted shows in what the client refuses (retry commit() / not a commit to retry).
        ends = [txn.abort] if txn.state == "OPEN" or entry.intent == "abort" else [txn.commit, txn.abort]
        for _ in range(3):
            if txn.state not in ("OPEN", "ERROR") or not ends:
                break
            try:
                await ends[0]()
            except InvalidTxnStatusError:
                ends.pop(0)
            except ServiceError as exc:
                record.refused(exc, f"retried end of {entry.label}")
                if exc.code not in (api.UNAVAILABLE, api.SERVER_CLOSING):
                    break
        entry.outcome = {"COMMITTED": "committed", "ABORTED": "aborted"}.get(txn.state, "unknown")
    deadline = time.monotonic() + SETTLE
    for entry in record.txns.values():
        txn = entry.txn
        if txn is None or entry.outcome != "unknown" or entry.status in ("COMMITTED", "ABORTED", "UNKNOWN"):
            continue
        while True:
            try:
                entry.status = await app.transaction_status(txn)
            except ServiceError as exc:
                entry.status = f"error: {exc}"
            if entry.status in ("COMMITTED", "ABORTED", "UNKNOWN") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)


# --- the checker ----------------------------------------------------------------------------------


class Stalled(Exception):
    """A topic served nothing for ``STALL`` seconds before the checker's sentinel."""


Read = list[tuple[str, MessageId]]


async def read_to_sentinel(
    client: Client,
    topic: str,
    subscription: str,
    sentinel: str,
    *,
    ack: Callable[[str], bool] = lambda _: False,
    missing: Callable[[Read], bool] = lambda _: False,
) -> Read:
    """Everything ``subscription`` delivers before ``sentinel`` (which it acknowledges), in order;
    messages for which ``ack(payload)`` is true are acknowledged too. While ``missing(read)`` says
    something expected has not come yet, reading goes on for up to ``LATE`` seconds past the
    sentinel: a redelivery may be scheduled after it (an abort the coordinator logged reaches the
    store a moment later)."""
    consumer = await client.subscribe(topic, subscription, receiver_queue_size=500)
    seen: Read = []
    try:
        while True:
            try:
                message = await consumer.receive(timeout=STALL)
            except TimeoutError:
                raise Stalled(
                    f"{topic}/{subscription} delivered nothing for {STALL}s before the sentinel "
                    f"({len(seen)} messages read)"
                ) from None
            payload = message.data.decode(errors="replace")
            if payload == sentinel or ack(payload):
                await consumer.acknowledge(message)
            if payload == sentinel:
                break
            seen.append((payload, message.message_id))
        deadline = time.monotonic() + LATE
        while missing(seen) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                message = await consumer.receive(timeout=max(0.01, deadline - time.monotonic()))
                payload = message.data.decode(errors="replace")
                if ack(payload):
                    await consumer.acknowledge(message)
                seen.append((payload, message.message_id))
        return seen
    finally:
        await consumer.close()


async def produce_sentinels(client: Client, topics: Topics, sentinel: str, record: Record) -> None:
    deadline = time.monotonic() + STALL
    for topic in topics.all():
        while True:
            try:
                producer = await client.create_producer(topic)
                record.sentinels[f"{topic} {sentinel}"] = await producer.send(sentinel.encode())
                await producer.close()
                break
            except ServiceError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def observe(pods: Pods, topics: Topics, record: Record, cycle: int) -> tuple[dict[str, Read], Read]:
    """Read every topic (a fresh subscription from the start) and the work subscription's backlog."""
    sentinel = f"END|{cycle}"
    async with pods.client() as client:
        await produce_sentinels(client, topics, sentinel, record)
        reads = {
            topic: await read_to_sentinel(client, topic, f"audit-{cycle}", sentinel) for topic in topics.all()
        }
        outputs = {payload for payload, _ in reads[topics.outputs]}
        consumed = {t.input for t in record.txns.values() if committed_here(t, outputs)}
        waited_for = set(record.inputs) - consumed

        def missing(read: Read) -> bool:
            return bool(waited_for - {payload for payload, _ in read})

        # Checkers' sentinels are acknowledged; nothing else is, so it goes back to the workload.
        work = await read_to_sentinel(
            client,
            topics.inputs,
            WORK,
            sentinel,
            ack=lambda payload: payload.startswith("END|"),
            missing=missing,
        )
    return reads, work


def committed_here(entry: FullTxn, outputs: set[str]) -> bool:
    """Whether ``entry`` counts as committed: acknowledged or answered so, or (in doubt) visible."""
    if entry.outcome == "aborted" or entry.status == "ABORTED":
        return False
    return (
        entry.outcome == "committed"
        or entry.status == "COMMITTED"
        or any(p in outputs for p in entry.outputs)
    )


Finding = tuple[str, str]


def judge(record: Record, topics: Topics, reads: dict[str, Read], work: Read) -> list[Finding]:
    """Compare what the topics hold with what was acknowledged (pure: a test plants damage in it)."""
    findings: list[Finding] = []

    def loss(message: str) -> None:
        findings.append(("silent_loss", message))

    def wrong(message: str) -> None:
        findings.append(("wrong_data", message))

    sentinels = {key.split(" ", 1)[1] for key in record.sentinels}

    def positions(topic: str) -> tuple[Counter[str], dict[MessageId, str]]:
        counts: Counter[str] = Counter()
        at: dict[MessageId, str] = {}
        for payload, message_id in reads[topic]:
            counts[payload] += 1
            at[message_id] = payload
            if payload.startswith("END|") and payload not in sentinels:
                wrong(f"{topic} serves {payload!r}, never written")
        return counts, at

    # Inputs: plain sends, each acknowledged one present once, where its receipt said.
    counts, at = positions(topics.inputs)
    for payload in counts:
        if not payload.startswith("END|") and payload not in record.inputs_sent:
            wrong(f"input topic serves {payload!r}, never written")
    for payload, message_id in record.inputs.items():
        if counts[payload] == 0:
            loss(f"acknowledged input {payload} at {message_id} is missing")
        elif at.get(message_id) != payload:
            wrong(f"input {payload}'s receipt {message_id} holds {at.get(message_id)!r}")
        if counts[payload] > 1:
            wrong(f"input {payload} is stored {counts[payload]} times")

    # Full transactions: a committed one's outputs once each; an aborted one's never; an in-doubt
    # one's all or none. Its ack: an input consumed by a committed transaction is never delivered
    # again, and one no committed transaction consumed is still there.
    counts, at = positions(topics.outputs)
    labels = {entry_payload: entry for entry in record.txns.values() for entry_payload in entry.outputs}
    for payload in counts:
        if not payload.startswith("END|") and payload not in labels:
            wrong(f"output topic serves {payload!r}, never written")
    consumed: Counter[str] = Counter()
    for entry in record.txns.values():
        present = [p for p in entry.outputs if counts[p]]
        for payload in present:
            if counts[payload] > 1:
                wrong(f"txn {entry.label}: output {payload} delivered {counts[payload]} times")
        aborted = entry.outcome == "aborted" or entry.status == "ABORTED"
        committed = entry.outcome == "committed" or entry.status == "COMMITTED"
        if aborted and present:
            wrong(f"txn {entry.label} ({entry.outcome}, {entry.status!r}) was aborted: {present} delivered")
        elif committed:
            for payload, receipt in entry.outputs.items():
                if not counts[payload]:
                    loss(
                        f"txn {entry.label} committed ({entry.outcome}, {entry.status!r}): {payload} missing"
                    )
                elif receipt is not None and at.get(receipt) != payload:
                    wrong(f"txn {entry.label}: {payload}'s receipt {receipt} holds {at.get(receipt)!r}")
        elif present and len(present) != len(entry.outputs):
            wrong(f"txn {entry.label} (in doubt, status {entry.status!r}) is partly visible: {present}")
        if committed or (not aborted and present):
            consumed[entry.input] += 1
    for source, times in consumed.items():
        if times > 1:
            wrong(f"input {source} was consumed by {times} committed transactions")
    delivered = Counter(payload for payload, _ in work)
    for payload in delivered:
        if payload.startswith("END|"):
            loss(f"the work subscription delivered sentinel {payload} again: its acknowledgement was lost")
        elif payload not in record.inputs_sent:
            wrong(f"the work subscription delivered {payload!r}, never written")
        elif consumed[payload]:
            wrong(f"input {payload} was delivered again after a committed transaction acknowledged it")
    for payload in record.inputs:
        if not consumed[payload] and not delivered[payload]:
            loss(f"input {payload} was neither consumed by a committed transaction nor redelivered")

    # Single-key transactions: a committed one's events once each, at the ids its commit returned;
    # an in-doubt one whole or absent; per writer instance, blocks in commit order.
    counts, at = positions(topics.srk)
    order: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for payload, _ in reads[topics.srk]:
        if payload.startswith("END|"):
            continue
        parts = payload.split("|")
        key = (parts[1], int(parts[2]), int(parts[3])) if len(parts) == 5 and parts[0] == "s" else None
        srk = record.srk.get(key) if key is not None else None
        if srk is None or payload not in srk.events:
            wrong(f"single-key topic serves {payload!r}, never written")
            continue
        order.setdefault((srk.writer, srk.instance), []).append((srk.number, int(parts[4])))
    for srk in record.srk.values():
        present = [e for e in srk.events if counts[e]]
        for event in present:
            if counts[event] > 1:
                wrong(f"single-key event {event} delivered {counts[event]} times")
        if srk.outcome == "committed":
            assert srk.ids is not None
            for event, message_id in zip(srk.events, srk.ids, strict=False):
                if not counts[event]:
                    loss(f"committed single-key event {event} (at {message_id}) is missing")
                elif at.get(message_id) != event:
                    wrong(f"a commit returned {message_id} for {event}: it holds {at.get(message_id)!r}")
            if len(srk.ids) != len(srk.events):
                wrong(f"single-key commit of {len(srk.events)} events returned {len(srk.ids)} ids")
        elif present and len(present) != len(srk.events):
            wrong(f"in-doubt single-key transaction {srk.events[0]} is partly visible: {present}")
    for (writer, instance), applied in order.items():
        if applied != sorted(applied):
            wrong(f"writer {writer} instance {instance}: blocks applied out of order: {applied[:12]}")

    # Named producers: an acknowledged send once, where its receipt said; any other at most once.
    counts, at = positions(topics.named)
    for payload in counts:
        if not payload.startswith("END|") and payload not in record.named:
            wrong(f"named-producer topic serves {payload!r}, never written")
    for payload, send in record.named.items():
        if counts[payload] > 1:
            wrong(f"send {payload} of producer {send.name} stored {counts[payload]} times")
        if send.outcome != "acknowledged":
            continue
        if not counts[payload]:
            loss(f"acknowledged send {payload} (receipt {send.message_id}) is missing")
        elif (
            send.message_id is not None
            and send.message_id.ledger_id >= 0
            and at.get(send.message_id) != payload
        ):
            wrong(f"send {payload}'s receipt {send.message_id} holds {at.get(send.message_id)!r}")
    return findings


# --- trials ---------------------------------------------------------------------------------------


@dataclass
class Stats:
    kills: int = 0
    kills_by_pod: Counter[str] = field(default_factory=Counter)
    kills_during_recovery: int = 0
    cycles: int = 0
    trials: int = 0
    verifications: int = 0
    takeovers: int = 0  # concurrent: a second instance opened while the first wrote
    reopened: int = 0  # instances opened of a writer id or producer name that had one before
    acknowledged: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # verifications with such a finding
    findings: Counter[str] = field(default_factory=Counter)  # every finding
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failed_trials: list[int] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # where the time went

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + time.monotonic() - started

    def fail(self, category: str, trial_seed: int, message: str, cycle: int) -> None:
        self.failures[category] += 1
        if trial_seed not in self.failed_trials:
            self.failed_trials.append(trial_seed)
        examples = self.examples.setdefault(category, [])
        if len(examples) < EXAMPLES:
            examples.append({"trial_seed": trial_seed, "cycle": cycle, "message": message[:600]})


async def kill_cycle(pods: Pods, rng: random.Random, stats: Stats) -> None:
    """SIGKILL one pod, two or all of them at a random moment, let the applications meet the dead
    pods for a while, restart them on their data directories (sometimes killing one again during its
    recovery). Restarts run side by side, so a cycle with more victims costs little more time."""
    await asyncio.sleep(rng.uniform(0.05, 0.8))
    roll = rng.random()
    victims = rng.sample(pods.members, min(len(pods.members), 1 if roll < 0.3 else 2 if roll < 0.65 else 3))
    for pod in victims:
        pod.kill()
        stats.kills += 1
        stats.kills_by_pod[pod.role] += 1
    await asyncio.sleep(rng.uniform(0.0, 0.4))
    for pod in victims:
        pod.start()
        if rng.random() < 0.15:  # again, while it replays its logs
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            pod.kill()
            stats.kills += 1
            stats.kills_during_recovery += 1
            stats.kills_by_pod[pod.role] += 1
            pod.start()
    await asyncio.gather(*(pods.ready(pod) for pod in victims))
    await asyncio.sleep(rng.uniform(0.0, 0.3))  # the applications reconnect and go on


def count_acknowledged(record: Record) -> Counter[str]:
    return Counter(
        {
            "plain_sends": len(record.inputs),
            "full_txn_commits": sum(1 for t in record.txns.values() if t.outcome == "committed"),
            "full_txn_aborts": sum(1 for t in record.txns.values() if t.outcome == "aborted"),
            "full_txns_in_doubt": sum(1 for t in record.txns.values() if t.outcome == "unknown"),
            "single_key_commits": sum(1 for t in record.srk.values() if t.outcome == "committed"),
            "single_key_commits_in_doubt": sum(1 for t in record.srk.values() if t.outcome == "unknown"),
            "named_sends": sum(1 for s in record.named.values() if s.outcome == "acknowledged"),
            "named_sends_in_doubt": sum(1 for s in record.named.values() if s.outcome == "unknown"),
        }
    )


async def run_trial(
    trial_seed: int, workdir: Path, stats: Stats, stores: int, max_kills: int, *, concurrent: bool = True
) -> None:
    """One trial: fresh pods, 3-8 kill/restart cycles each judged, then the pods are stopped."""
    rng = random.Random(trial_seed)
    stats.trials += 1
    root = workdir / f"trial-{trial_seed}"
    root.mkdir(parents=True)
    pods = Pods(root, stores, BATCH_ON if rng.random() < 0.5 else {})
    topics = Topics.of_trial(trial_seed, stores)
    record = Record()
    cycles = rng.randint(3, 8)
    cycle = 0
    try:
        try:
            with stats.phase("start_pods"):
                await pods.start()
        except ProcessStartError as exc:
            stats.fail("unexpected_errors", trial_seed, f"pods did not start: {exc}", cycle)
            return
        for cycle in range(cycles):
            if stats.kills >= max_kills and cycle:
                break
            stats.cycles += 1
            workload = Workload(pods, topics, record, rng, cycle)
            workload.start()
            moment = rng.uniform(0.05, 1.2)  # drawn either way: a replay makes the same choices
            takeover = asyncio.get_running_loop().call_later(
                moment, workload.take_over if concurrent else int
            )
            try:
                with stats.phase("kill_and_restart"):
                    await kill_cycle(pods, rng, stats)
            except ProcessStartError as exc:
                stats.fail("unexpected_errors", trial_seed, f"a killed pod did not come back: {exc}", cycle)
                return
            finally:
                takeover.cancel()
                with stats.phase("stop_applications"):
                    hung = await workload.finish(stats)
                stats.takeovers += workload.takeovers
            for message in hung:
                stats.fail("unexpected_errors", trial_seed, message, cycle)
            for pod in pods.dead():
                stats.fail(
                    "unexpected_errors", trial_seed, f"{pod.name} died by itself: {pod.log_tail()}", cycle
                )
                return
            with stats.phase("check"):
                verified = await verify(
                    pods, topics=topics, record=record, stats=stats, trial_seed=trial_seed, cycle=cycle
                )
            if not verified:
                return
    finally:
        await pods.stop()
        stats.acknowledged.update(count_acknowledged(record))
        stats.refusals.update(record.refusals)
        stats.reopened += sum(count - 1 for count in record.instances.values())
        shutil.rmtree(root, ignore_errors=True)


async def verify(
    pods: Pods, *, topics: Topics, record: Record, stats: Stats, trial_seed: int, cycle: int
) -> bool:
    """Judge the trial's topics against its record; False once the trial cannot go on."""
    stats.verifications += 1
    for message in record.bad_refusals:
        stats.fail("bad_refusal", trial_seed, message, cycle)
    record.bad_refusals.clear()
    try:
        reads, work = await asyncio.wait_for(observe(pods, topics, record, cycle), 10 * STALL)
    except (Stalled, ServiceError, TimeoutError) as exc:
        stats.fail(
            "unexpected_errors", trial_seed, f"the checker could not read: {type(exc).__name__}: {exc}", cycle
        )
        return False
    findings = judge(record, topics, reads, work)
    for category in sorted({category for category, _ in findings}):
        messages = [m for c, m in findings if c == category]
        stats.findings[category] += len(messages)
        stats.fail(category, trial_seed, f"{messages[0]} (+{len(messages) - 1} more)", cycle)
    return not findings


def report(stats: Stats, seed: int, stores: int, started: float) -> dict[str, Any]:
    return {
        "seed": seed,
        "pods": {"coordinators": 1, "stores": stores},
        "kills": stats.kills,
        "kills_by_pod": dict(sorted(stats.kills_by_pod.items())),
        "kills_during_recovery": stats.kills_during_recovery,
        "cycles": stats.cycles,
        "trials": stats.trials,
        "verifications": stats.verifications,
        "takeovers": stats.takeovers,
        "reopened_instances": stats.reopened,
        "acknowledged": dict(sorted(stats.acknowledged.items())),
        "refusals_by_error": dict(sorted(stats.refusals.items())),
        **{category: stats.failures[category] for category in FAILURES},
        "findings_by_category": dict(sorted(stats.findings.items())),
        "examples": stats.examples,
        "failed_trial_seeds": stats.failed_trials,
        "replay": "python -m tests.fault.cluster_soak --trial-seed SEED --json",
        "seconds": round(time.monotonic() - started, 1),
        "seconds_by_phase": {name: round(value, 1) for name, value in sorted(stats.phase_seconds.items())},
    }


def cluster_soak(
    kills: int,
    seed: int,
    workdir: Path,
    stores: int = 2,
    progress: Path | None = None,
    *,
    concurrent_takeovers: bool = True,
) -> dict[str, Any]:
    """Run trials until ``kills`` SIGKILLs happened; returns the JSON verdict (see the module doc).
    With ``progress``, the verdict so far is written there after each trial (a long run stopped
    early still tells what it saw)."""
    stats = Stats()
    master = random.Random(seed)
    started = time.monotonic()

    async def run() -> None:
        while stats.kills < kills:
            await run_trial(
                master.randrange(1 << 32), workdir, stats, stores, kills, concurrent=concurrent_takeovers
            )
            if progress is not None:
                partial = progress.with_suffix(".tmp")
                partial.write_text(json.dumps(report(stats, seed, stores, started), indent=1, sort_keys=True))
                partial.replace(progress)

    asyncio.run(run())
    return report(stats, seed, stores, started)


def replay(
    trial_seed: int, workdir: Path, stores: int, *, concurrent_takeovers: bool = True
) -> dict[str, Any]:
    stats = Stats()
    started = time.monotonic()
    asyncio.run(run_trial(trial_seed, workdir, stats, stores, 1 << 30, concurrent=concurrent_takeovers))
    return {"trial_seed": trial_seed, **report(stats, trial_seed, stores, started)}


def failed(report: dict[str, Any]) -> bool:
    return any(report[category] for category in FAILURES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fault.cluster_soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs to run (default 1000)")
    parser.add_argument("--stores", type=int, default=2, help="store pods per trial (default 2)")
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random, printed)")
    parser.add_argument("--trial-seed", type=int, default=None, help="replay one trial's random choices")
    parser.add_argument("--json", action="store_true", help="print only the JSON verdict")
    parser.add_argument("--workdir", type=Path, default=None, help="where trials run (default: a temp dir)")
    parser.add_argument(
        "--no-concurrent-takeovers",
        dest="concurrent_takeovers",
        action="store_false",
        help="for diagnosis: no second instance opens while the first still writes (applications still"
        " restart as new instances each cycle), to tell whether a finding needs one",
    )
    parser.add_argument(
        "--progress-file", type=Path, default=None, help="the verdict so far, after each trial"
    )
    args = parser.parse_args(argv)
    # Refusals while a pod is down are expected, thousands of times: keep the output to the verdict.
    logging.getLogger("txnkeeper").setLevel(logging.CRITICAL)
    if args.kills <= 0 or args.stores <= 0:
        parser.error("--kills and --stores must be positive")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    with tempfile.TemporaryDirectory(prefix="txnkeeper-cluster-soak-", dir=args.workdir) as tmp:
        if args.trial_seed is not None:
            result = replay(
                args.trial_seed, Path(tmp), args.stores, concurrent_takeovers=args.concurrent_takeovers
            )
        else:
            result = cluster_soak(
                args.kills,
                seed,
                Path(tmp),
                args.stores,
                args.progress_file,
                concurrent_takeovers=args.concurrent_takeovers,
            )
    if not args.json:
        print(
            f"cluster soak: {result['kills']} kills; failures are listed with their trial seed",
            file=sys.stderr,
        )
    print(json.dumps(result, indent=1, sort_keys=True))
    return 1 if failed(result) else 0


if __name__ == "__main__":
    sys.exit(main())
