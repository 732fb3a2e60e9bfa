"""The client follows placement (docs/contracts.md §12): real store and coordinator pods behind a real
redirector process (tests/runtime/redirector.py) that answers ``NOT_SERVED_HERE`` as a pod does when a
topic or coordinator id moved away (with the owner), or is being moved (without one).

What must hold: every kind of client object reaches the owner and keeps working there, a move in the
middle of a run raises nothing to the application, and nothing is lost or written twice (named
producers and single-key writers resume at the new owner with the de-duplication state it holds).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pulsar_wire import free_port
from runtime_pods import ServePod
from runtime_waits import wait_until

from txnkeeper.client import Client, Consumer, Message, MessageId
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.errors import ConnectionClosedError, NotServedHereError

TOPIC = "persistent://t/ns/moving"
PLAIN = "persistent://t/ns/plain"
OUT = "persistent://t/ns/out"
SRK = ["--srk-enabled", "true", "--release", "3.0.0"]  # single-key writers need a 3.x release
REDIRECTOR = Path(__file__).with_name("redirector.py")


class Redirector:
    """The redirector process (module docstring of redirector.py)."""

    def __init__(self, workdir: Path, name: str, owner: str, *, mode: str, moving_ms: int = 0) -> None:
        self.ports_file = workdir / f"{name}.json"
        self.ports_file.unlink(missing_ok=True)
        self.log = workdir / f"{name}.log"
        cmd = [sys.executable, str(REDIRECTOR), "--owner", owner, "--ports-file", str(self.ports_file)]
        cmd += ["--mode", mode, "--moving-ms", str(moving_ms)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not self.ports_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redirector {name} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        self.listen: str = json.loads(self.ports_file.read_text())["listen"]

    def move(self) -> None:
        """Cut the forwarded connections; refuse "being moved", then redirect."""
        self.process.send_signal(signal.SIGUSR1)

    def stats(self) -> dict[str, int]:
        path = self.ports_file.with_suffix(".stats")
        return json.loads(path.read_text()) if path.exists() else {"redirects": 0, "moving": 0}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@pytest.fixture
def redirectors(tmp_path: Path) -> Iterator[Callable[..., Redirector]]:
    started: list[Redirector] = []

    def make(name: str, owner: str, **kwargs: object) -> Redirector:
        redirector = Redirector(tmp_path, name, owner, **kwargs)  # type: ignore[arg-type]
        started.append(redirector)
        return redirector

    yield make
    for redirector in started:
        redirector.stop()


async def collect(consumer: Consumer, expected: set[bytes], within: float) -> dict[bytes, set[MessageId]]:
    """Receive (acking) until every payload of ``expected`` arrived: payload -> the message ids it
    arrived with (a payload written twice shows two ids; a redelivery shows the same one again)."""
    seen: dict[bytes, set[MessageId]] = {}
    deadline = time.monotonic() + within
    while not expected <= seen.keys():
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(expected - seen.keys())[:5]
            raise TimeoutError(f"{len(expected - seen.keys())} payloads never arrived, e.g. {missing}")
        try:
            message: Message = await consumer.receive(timeout=min(left, 5))
        except TimeoutError:
            continue
        seen.setdefault(message.data, set()).add(message.message_id)
        await consumer.acknowledge(message)
    return seen


async def test_every_client_object_follows_a_redirect_to_the_owner(
    pods: Callable[..., ServePod], redirectors: Callable[..., Redirector]
) -> None:
    tc = pods("tc-0", "coordinator")
    store = pods("pas-0", "store", extra=SRK)
    stores = redirectors("stores", store.listen, mode="redirect")
    coordinators = redirectors("coordinators", tc.listen, mode="redirect")
    async with Client(coordinators=[coordinators.listen], stores=[stores.listen]) as client:
        assert client.store_for(TOPIC) == stores.listen
        consumer = await client.subscribe(TOPIC, "app")
        assert consumer.store_address == store.listen  # redirected, and remembered for the topic
        assert client.store_for(TOPIC) == store.listen
        plain = await client.create_producer(PLAIN)
        named = await client.create_producer(TOPIC, producer_name="orders")
        writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=10_000)
        plain_id = await plain.send(b"plain")
        assert plain_id.ledger_id >= 0 and client.store_for(PLAIN) == store.listen
        for i in range(5):
            await named.send(f"named-{i}".encode())
        async with writer.begin_transaction() as block:
            block.write(b"block-1")
            block.write(b"block-2")
        # A transaction: its coordinator is found through the redirect as well.
        out = await client.create_producer(OUT)
        txn = await client.new_transaction(timeout_ms=30_000)
        assert txn.coordinator_address == tc.listen
        expected = {f"named-{i}".encode() for i in range(5)} | {b"block-1", b"block-2"}
        seen = await collect(consumer, expected, 30)
        await out.send(b"in-txn", txn=txn)
        await txn.commit()
        assert await client.transaction_status(txn) == "COMMITTED"
        # The coordinator was told OUT was at the redirector (the registration came first); the end
        # it sent there was refused with the owner, which is OUT's route now (durably).
        routes = RouteTable(tc.data_dir / "coordinator" / "routes.json")
        routes.load()
        assert routes.get(OUT) == store.listen
        verify = await client.subscribe(OUT, "verify")
        assert (await verify.receive(timeout=30)).data == b"in-txn"
    assert all(len(ids) == 1 for ids in seen.values()), seen
    assert stores.stats()["redirects"] >= 1 and coordinators.stats()["redirects"] >= 1


async def test_a_move_under_load_raises_nothing_and_loses_or_duplicates_nothing(
    pods: Callable[..., ServePod], redirectors: Callable[..., Redirector]
) -> None:
    tc = pods("tc-0", "coordinator")
    store = pods("pas-0", "store", extra=SRK)
    # The topic is served "at" the redirector (forwarded to the store) until the move; then the
    # redirector refuses "being moved" for 800 ms and redirects to the store from then on.
    moving = redirectors("moving", store.listen, mode="move", moving_ms=800)
    async with Client(coordinators=[tc.listen], stores=[moving.listen]) as client:
        consumer = await client.subscribe(TOPIC, "app")
        work = await client.subscribe(PLAIN, "work")
        named = await client.create_producer(TOPIC, producer_name="orders")
        writer = await client.create_single_key_writer(TOPIC, "k", txn_timeout_ms=60_000)
        plain = await client.create_producer(PLAIN)
        await plain.send(b"work-0")
        # A transaction begun before the move, with a send and an ack through the old address.
        out = await client.create_producer(OUT)
        txn = await client.new_transaction(timeout_ms=60_000)
        job = await work.receive(timeout=30)
        await work.acknowledge(job, txn=txn)
        await out.send(b"result-0", txn=txn)

        sends: list[asyncio.Future[MessageId]] = []
        blocks: list[list[MessageId]] = []

        async def writing(start: int, count: int) -> None:
            for i in range(start, start + count):
                async with writer.begin_transaction() as block:
                    block.write(f"block-{i}".encode())
                blocks.append(block.message_ids)

        for i in range(50):
            sends.append(named.send(f"named-{i}".encode()))
        first_blocks = asyncio.ensure_future(writing(0, 20))
        await asyncio.sleep(0)  # the sends and the first block are on the wire
        moving.move()
        for i in range(50, 100):
            sends.append(named.send(f"named-{i}".encode()))
        await first_blocks
        await writing(20, 10)
        ids = await asyncio.gather(*sends)  # no send failed through the move
        assert len(ids) == 100

        async def moved() -> bool:
            return client.store_for(TOPIC) == store.listen

        await wait_until(moved, 30, "the topic to move")
        await plain.send(b"work-1")  # a plain producer whose topic moved meanwhile
        await txn.commit()  # its end reaches the topic's new owner (the coordinator follows)
        expected = {f"named-{i}".encode() for i in range(100)} | {f"block-{i}".encode() for i in range(30)}
        seen = await collect(consumer, expected, 60)
        assert (await work.receive(timeout=30)).data == b"work-1"  # work-0's ack was committed
        verify = await client.subscribe(OUT, "verify")
        assert (await verify.receive(timeout=30)).data == b"result-0"
    written_twice = {payload: sorted(ids) for payload, ids in seen.items() if len(ids) > 1}
    assert not written_twice, f"payloads written twice across the move: {written_twice}"
    assert set(seen) == expected
    stats = moving.stats()
    assert stats["moving"] >= 1 and stats["redirects"] >= 1, stats
    assert len({tuple(b) for b in blocks}) == 30


async def test_a_client_gives_up_after_a_few_redirects_in_a_row(
    pods: Callable[..., ServePod], redirectors: Callable[..., Redirector]
) -> None:
    store = pods("pas-0", "store")
    # Pods that keep sending the client on (placement records out of step): 4 hops before the owner.
    owner = store.listen
    chain = []
    for i in range(4):
        chain.append(redirectors(f"hop-{i}", owner, mode="redirect"))
        owner = chain[-1].listen
    async with Client(coordinators=[], stores=[owner], operation_timeout=10) as client:
        producer = await client.create_producer(PLAIN)
        started = time.monotonic()
        with pytest.raises(NotServedHereError, match="redirected 4 times in a row") as refused:
            await producer.send(b"nowhere")
        assert refused.value.owner_address == store.listen  # the 4th redirect, not followed
        assert time.monotonic() - started < 10  # given up on by the hop count, not the timeout


async def test_a_store_address_that_cannot_be_reached_is_passed_over_for_one_that_redirects(
    pods: Callable[..., ServePod], redirectors: Callable[..., Redirector]
) -> None:
    store = pods("pas-0", "store")
    live = redirectors("live", store.listen, mode="redirect")
    gone = f"127.0.0.1:{free_port()}"  # a pod removed by a scale-in: nothing listens there
    first, second = [
        t for t in (f"persistent://t/ns/gone-{i}" for i in range(100)) if zlib.crc32(t.encode()) % 2 == 0
    ][:2]
    via_live = next(
        t for t in (f"persistent://t/ns/live-{i}" for i in range(100)) if zlib.crc32(t.encode()) % 2 == 1
    )
    # Before any store has answered by placement the client asks no other store: one started without
    # placement would serve the topic, splitting it between two pods (what the cluster soak caught).
    async with Client(coordinators=[], stores=[gone, live.listen], operation_timeout=10) as fresh:
        with pytest.raises(ConnectionClosedError, match="cannot connect"):
            await fresh.create_producer(first)
    async with Client(coordinators=[], stores=[gone, live.listen], operation_timeout=10) as client:
        await (await client.create_producer(via_live)).send(b"placement seen")  # redirected
        assert client.store_for(first) == gone and client.store_for(second) == gone
        consumer = await client.subscribe(first, "s")  # passed over to the live pod, then redirected
        assert client.store_for(first) == store.listen
        producer = await client.create_producer(second)
        await producer.send(b"reached")  # the same for a send
        assert client.store_for(second) == store.listen
        await (await client.create_producer(first)).send(b"first")
        assert (await consumer.receive(timeout=30)).data == b"first"
