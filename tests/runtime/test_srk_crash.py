"""A store SIGKILLed again and again while 8 raw-protocol writers append blocks: after each restart every
writer's last event number covers everything it was told was appended and falls on a block boundary;
at the end every block is in the topic exactly once, whole, and in event-number order per writer.

Writers send one block at a time, so at each kill up to 8 blocks are between AppendBlockEnd and
DataAppended. The kill is triggered by a count of answered blocks, not by time.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Callable

import pytest
from runtime_pods import ServePod
from srk_wire import SrkWire

from txnkeeper.client import Client
from txnkeeper.errors import ServiceError

pytestmark = pytest.mark.timeout(600)

TOPIC = "persistent://t/ns/srk-crash"
WRITERS = 8
BLOCKS = 25
EVENTS_PER_BLOCK = 3
KILLS = 6


def _block(writer: int, index: int) -> list[bytes]:
    first = index * EVENTS_PER_BLOCK
    return [f"w{writer}-{first + i}".encode() for i in range(EVENTS_PER_BLOCK)]


class Round:
    """One life of the store: every writer reconnects, checks the store's answer, appends until the kill."""

    def __init__(
        self, pod: ServePod, acknowledged: list[int], in_flight: list[int | None], kill_after: int | None
    ) -> None:
        self.pod = pod
        self.acknowledged = acknowledged  # last event number each writer saw in a DataAppended
        self.in_flight = in_flight  # the block index each writer awaits a DataAppended for
        self.kill_after = kill_after
        self.answered = 0
        self.killed = asyncio.Event()

    async def writer(self, writer: int) -> None:
        wire = await SrkWire.open(self.pod.listen)
        try:
            await self._append(wire, writer)
        finally:
            wire.close()

    async def _append(self, wire: SrkWire, writer: int) -> None:
        name = f"writer-{writer}"
        last = await wire.setup(TOPIC, name)
        # Nothing acknowledged is lost, and a block is never partly applied.
        assert last >= self.acknowledged[writer], (writer, last, self.acknowledged[writer])
        assert (last + 1) % EVENTS_PER_BLOCK == 0, (writer, last)
        self.acknowledged[writer] = last
        index = (last + 1) // EVENTS_PER_BLOCK
        sent = self.in_flight[writer]
        if sent is not None:  # PDP-44 reconnect: retransmit the unanswered block; committed -> duplicate
            first = sent * EVENTS_PER_BLOCK
            again = await wire.append(name, first, _block(writer, sent))
            assert again.duplicate == (last >= first + EVENTS_PER_BLOCK - 1), (writer, sent, last)
            self.in_flight[writer] = None
            index = max(index, sent + 1)
            self.acknowledged[writer] = max(last, again.event_number)
        while index < BLOCKS and not self.killed.is_set():
            first = index * EVENTS_PER_BLOCK
            self.in_flight[writer] = index
            appended = await wire.append(name, first, _block(writer, index))
            self.in_flight[writer] = None
            assert appended.previous_event_number == first - 1 and not appended.duplicate
            self.acknowledged[writer] = appended.event_number
            index += 1
            self.answered += 1
            if self.kill_after is not None and self.answered >= self.kill_after and not self.killed.is_set():
                self.killed.set()
                self.pod.kill()  # SIGKILL while the other writers' blocks are in flight


async def test_blocks_exactly_once_across_sigkills(pods: Callable[..., ServePod]) -> None:
    pod = pods("pas-0", "store", release="3.0.0", extra=["--srk-enabled", "true"])
    rng = random.Random(14)
    acknowledged = [-1] * WRITERS
    in_flight: list[int | None] = [None] * WRITERS
    retransmitted = 0
    kills = 0
    while min(acknowledged) < BLOCKS * EVENTS_PER_BLOCK - 1:
        retransmitted += sum(i is not None for i in in_flight)
        life = Round(pod, acknowledged, in_flight, rng.randint(5, 40) if kills < KILLS else None)
        results = await asyncio.gather(*(life.writer(w) for w in range(WRITERS)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                # Only the kill may interrupt a writer: its connection is lost.
                assert life.killed.is_set() and isinstance(result, ServiceError), result
        if life.killed.is_set():
            kills += 1
            pod.start()
    assert kills == KILLS
    assert retransmitted >= KILLS  # every kill caught at least one block between End and DataAppended

    per_writer: dict[str, list[str]] = defaultdict(list)
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        consumer = await client.subscribe(TOPIC, "audit")
        await (await client.create_producer(TOPIC)).send(b"end")
        while True:
            message = await consumer.receive(timeout=60)
            if message.data == b"end":
                break
            name, number = message.data.decode().split("-")
            assert message.key == "k"
            per_writer[name].append(number)
    expected = [str(n) for n in range(BLOCKS * EVENTS_PER_BLOCK)]
    for writer in range(WRITERS):
        assert per_writer[f"w{writer}"] == expected, writer
