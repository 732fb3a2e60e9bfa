"""A damaged tier must show (issue 25 item 9): consumers stalled at unreadable tier data with no error,
``offload-status`` stayed SUCCESS with an empty lastError, and nothing in the metrics or the pod's
offload summary (what the operator's OffloadHealthy condition reads) said anything was wrong.

Real ``txnkeeper serve`` pods and a real filesystem tier (``tier_pods``): a topic is offloaded and its
local file deleted, then the tier's data object is damaged under the running pod. The consumer must
get every message before the damage, then an error naming the position after a bounded wait (never a
wrong message); the status, a metric and the summary must name the segment; /ready stays 200 (the
pod's other topics are served); and once the object is restored delivery resumes by itself and every
signal clears. A pod restarted with a damaged tier under a topic it must replay at start still starts
and serves its other topics; the damaged topic's requests are refused DATA_UNREADABLE naming why (it
used to exit 1 at every start).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from txnkeeper.client import Client, DataUnreadableError, Message, ServiceError
from txnkeeper.contract.admin import AdminClient
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper_operator import gated
from txnkeeper_operator.engine import Condition
from txnkeeper_operator.resource import Resource

from .tier_pods import BLOCK_BYTES, ServePod, TieredTopic, http, offloaded_topic

# The consumer hears of unreadable data after a few failed reads (seconds); this is the test's
# deadline, generous for a loaded machine, not an expected duration.
ERROR_DEADLINE = 60.0
DAMAGED_BLOCK = 10  # blocks of 4 KiB hold three messages: entries 30..32 are in part 11


@pytest.fixture
def pods() -> Iterator[list[ServePod]]:
    started: list[ServePod] = []
    yield started
    for pod in started:
        pod.stop()


def flip_a_byte_of_entry_data(data: Path) -> None:
    raw = bytearray(data.read_bytes())
    raw[DAMAGED_BLOCK * BLOCK_BYTES + 128 + 40] ^= 0xFF  # inside the block's first entry's payload
    data.write_bytes(bytes(raw))


def wait_until(what: str, check: Callable[[], Any], deadline: float = ERROR_DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline}s: {what}")
        time.sleep(0.1)


def metric_value(store: ServePod, name: str, topic: str) -> float | None:
    text = http("GET", f"{store.admin_url()}/metrics")[1]
    prefix = f'{name}{{namespace="public/default",topic="{topic}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def cut_to_half(data: Path) -> None:
    blocks = data.stat().st_size // BLOCK_BYTES
    with open(data, "r+b") as f:
        f.truncate(blocks // 2 * BLOCK_BYTES)


def operator_view(summary: dict[str, Any]) -> Condition:
    """OffloadHealthy as the operator computes it from this pod's summary."""
    cr = Resource.from_body(
        {
            "apiVersion": "txnkeeper.io/v1",
            "kind": "PendingAckStore",
            "metadata": {"name": "pas", "namespace": "prod", "uid": "u-1", "generation": 1},
            "spec": {
                "version": "3.0.0",
                "replicas": 1,
                "offload": {"driver": "filesystem", "filesystem": {"claimName": "tier"}},
            },
        }
    )
    return gated.offload_condition(cr, [("pas-0", summary, None)])


@pytest.fixture(scope="module")
def damaged() -> Iterator[tuple[TieredTopic, str]]:
    """A pod whose topic's tier data has a damaged block that a consumer ran into (every message
    before it delivered); shared by the tests that only look at what the pod reports."""
    workdir = Path(tempfile.mkdtemp(prefix="damaged-tier-"))
    started: list[ServePod] = []
    try:
        topic = offloaded_topic(workdir, started)
        data, _ = topic.segment_files()
        flip_a_byte_of_entry_data(data)

        async def read_up_to_the_damage() -> None:
            async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
                consumer = await client.subscribe(topic.topic, "reader", receiver_queue_size=4)
                for _ in range(DAMAGED_BLOCK * 3):
                    await consumer.acknowledge(await consumer.receive(timeout=ERROR_DEADLINE))
                with contextlib.suppress(TimeoutError, ServiceError):  # the read of the damage
                    await consumer.receive(timeout=5)

        asyncio.run(read_up_to_the_damage())
        yield topic, data.name
    finally:
        for pod in started:
            pod.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_unreadable_tier_data_shows_in_offload_status(damaged: tuple[TieredTopic, str]) -> None:
    """(a) The topic's offload status is ERROR, naming the segment, the object and the problem."""
    topic, uuid = damaged
    doc = wait_until(
        "offload-status ERROR",
        lambda: (d := topic.admin("GET", "offload-status")[1])["status"] == "ERROR" and d,
    )
    assert uuid in doc["lastError"] and "block CRC-32 is" in doc["lastError"], doc
    assert "tier data unreadable: entries" in doc["lastError"], doc
    (unreadable,) = doc["unreadableSegments"]
    assert unreadable["segment"] == uuid and unreadable["object"] == uuid, unreadable
    assert unreadable["kind"] == "corrupt" and unreadable["failedReads"] >= 1, unreadable
    assert doc["tierReadErrors"] >= 1, doc


def test_unreadable_tier_data_shows_in_a_metric(damaged: tuple[TieredTopic, str]) -> None:
    """(b) txnkeeper_offload_unreadable_segments{topic} (what docs/reference.md's alert watches) and
    Pulsar's read error counter."""
    topic, _ = damaged
    wait_until(
        "the unreadable-segments gauge at 1",
        lambda: metric_value(topic.store, "txnkeeper_offload_unreadable_segments", topic.topic) == 1.0,
    )
    assert (metric_value(topic.store, "brk_ledgeroffloader_read_offload_error_total", topic.topic) or 0) > 0


def test_unreadable_tier_data_shows_in_the_operators_condition(damaged: tuple[TieredTopic, str]) -> None:
    """(c) The pod's offload summary, read with the operator's admin client, and the OffloadHealthy
    condition the operator computes from it: False, naming the pod, topic and segment. /ready stays
    200: the pod's other topics are served (docs/contracts.md §9)."""
    topic, uuid = damaged
    summary = wait_until(
        "the summary lists unreadable tier data",
        lambda: (s := asyncio.run(summary_of(topic))).get("unreadableTierData") and s,
    )
    (row,) = summary["unreadableTierData"]
    assert row["topic"] == topic.topic and row["segment"] == uuid and "CRC" in row["error"], row
    condition = operator_view(summary)
    assert (str(condition.status), condition.reason) == ("False", "UnreadableTierData"), condition
    assert f"pas-0: topic {topic.topic} segment {uuid}" in condition.message, condition
    assert http("GET", f"{topic.store.admin_url()}/ready")[0] == 200


def assert_it_shows(topic: TieredTopic, uuid: str, problem: str) -> None:
    """Everything above at once, for the tests that also repair the tier."""
    status, doc = topic.admin("GET", "offload-status")
    assert status == 200 and doc["status"] == "ERROR", doc
    assert uuid in doc["lastError"] and problem in doc["lastError"], doc
    assert metric_value(topic.store, "txnkeeper_offload_unreadable_segments", topic.topic) == 1.0
    summary = asyncio.run(summary_of(topic))
    (row,) = summary["unreadableTierData"]
    assert row["topic"] == topic.topic and row["segment"] == uuid and problem in row["error"], row
    assert operator_view(summary).reason == "UnreadableTierData"
    assert http("GET", f"{topic.store.admin_url()}/ready")[0] == 200


def assert_it_cleared(topic: TieredTopic) -> None:
    wait_until(
        "offload-status back to SUCCESS",
        lambda: topic.admin("GET", "offload-status")[1]["status"] == "SUCCESS",
    )
    assert metric_value(topic.store, "txnkeeper_offload_unreadable_segments", topic.topic) == 0.0
    summary = asyncio.run(summary_of(topic))
    assert summary["unreadableTierData"] == []
    assert str(operator_view(summary).status) == "True"


def test_a_consumer_stopped_by_a_damaged_block_gets_an_error_then_resumes(
    tmp_path: Path, pods: list[ServePod]
) -> None:
    topic = offloaded_topic(tmp_path, pods)
    data, _ = topic.segment_files()
    original = data.read_bytes()
    flip_a_byte_of_entry_data(data)
    uuid = data.name

    async def consume_until_the_error() -> tuple[list[Message], DataUnreadableError]:
        async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
            consumer = await client.subscribe(topic.topic, "reader", receiver_queue_size=4)
            received: list[Message] = []
            while True:
                try:
                    message = await consumer.receive(timeout=ERROR_DEADLINE)
                except DataUnreadableError as exc:
                    return received, exc
                received.append(message)
                await consumer.acknowledge(message)

    received, error = asyncio.run(consume_until_the_error())
    first_damaged = DAMAGED_BLOCK * 3
    assert [m.data for m in received] == topic.messages[:first_damaged]  # all before it, nothing wrong
    assert error.code == api.DATA_UNREADABLE
    text = str(error)
    assert f"cannot deliver the entries after {received[-1].message_id}" in text, text
    assert "offloaded tier data is unreadable" in text and uuid in text and "CRC" in text, text
    assert_it_shows(topic, uuid, "CRC")

    # The object restored: delivery resumes by itself, exactly where it stopped; every signal clears.
    data.write_bytes(original)

    async def consume_the_rest() -> list[bytes]:
        async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
            consumer = await client.subscribe(topic.topic, "reader", receiver_queue_size=4)
            rest = []
            for _ in range(len(topic.messages) - first_damaged):
                message = await consumer.receive(timeout=ERROR_DEADLINE)
                rest.append(message.data)
                await consumer.acknowledge(message)
            return rest

    assert asyncio.run(consume_the_rest()) == topic.messages[first_damaged:]
    assert_it_cleared(topic)


def test_a_pod_restarted_over_a_damaged_tier_starts_and_refuses_only_that_topic(
    tmp_path: Path, pods: list[ServePod]
) -> None:
    topic = offloaded_topic(tmp_path, pods, graceful=False)  # no snapshot: opening replays the tier
    healthy = "persistent://public/default/healthy"

    async def subscribe_both() -> None:
        async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
            await client.subscribe(topic.topic, "reader")  # registered: reopened at every start
            await client.subscribe(healthy, "reader")
            await (await client.create_producer(healthy)).send(b"before")

    asyncio.run(subscribe_both())
    topic.store.kill()
    data, _ = topic.segment_files()
    original = data.read_bytes()
    cut_to_half(data)
    uuid = data.name
    topic.store.start()  # used to exit 1: "failed to start: offloaded segment ... is corrupt"

    async def use_both() -> tuple[list[bytes], DataUnreadableError, DataUnreadableError]:
        async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
            consumer = await client.subscribe(healthy, "reader")
            await (await client.create_producer(healthy)).send(b"after")
            served = [(await consumer.receive(timeout=ERROR_DEADLINE)).data for _ in range(2)]
            with pytest.raises(DataUnreadableError) as refused_subscribe:
                await client.subscribe(topic.topic, "reader")
            with pytest.raises(DataUnreadableError) as refused_send:
                await (await client.create_producer(topic.topic)).send(b"lost?")
            return served, refused_subscribe.value, refused_send.value

    served, refused_subscribe, refused_send = asyncio.run(use_both())
    assert served == [b"before", b"after"]
    for refusal in (refused_subscribe, refused_send):
        text = str(refusal)
        assert f"topic {topic.topic!r} cannot be opened" in text, text
        assert "entries from the topic's first entry" in text and uuid in text, text
        assert "index says the data object is" in text and "other topics are served" in text, text
    assert_it_shows(topic, uuid, "index says the data object is")

    data.write_bytes(original)

    async def read_all() -> list[bytes]:
        async with Client(coordinators=[topic.tc.listen], stores=[topic.store.listen]) as client:
            deadline = time.monotonic() + ERROR_DEADLINE
            while True:  # reopened at a use once the data can be read (at most every few seconds)
                try:
                    consumer = await client.subscribe(topic.topic, "reader")
                    break
                except DataUnreadableError:
                    assert time.monotonic() < deadline, "the topic was not reopened"
                    await asyncio.sleep(0.2)
            return [(await consumer.receive(timeout=ERROR_DEADLINE)).data for _ in topic.messages]

    assert asyncio.run(read_all()) == topic.messages
    assert_it_cleared(topic)


async def summary_of(topic: TieredTopic) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        return await AdminClient(session).offload_summary(topic.store.admin_url())
