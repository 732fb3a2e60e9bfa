"""Writer sessions against a real store process (issue 25 item 4): sessions that never wrote hold no
writer slot, so one connection cannot lock a topic's writers and named producers out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from runtime_pods import ServePod, http
from runtime_waits import wait_until
from srk_wire import SrkWire

from txnkeeper.client import Client
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.server.blocks import MAX_UNWRITTEN_SESSIONS_PER_CONNECTION

pytestmark = pytest.mark.timeout(240)

TOPIC = "persistent://t/ns/sessions"
RELEASE = "3.0.0"
MAX_WRITERS = 20
FLOOD = 10_000  # SetupAppends of one connection that never writes


def _store(pods: Callable[..., ServePod], name: str = "pas-0") -> ServePod:
    config = {"singleKeyTransactions": {"enabled": True, "maxWritersPerTopic": MAX_WRITERS}}
    return pods(name, "store", release=RELEASE, config=config)


def _setup_command(topic: str, writer_id: str) -> api.Command:
    command = api.Command()
    command.setup_append.topic = topic
    command.setup_append.writer_id = writer_id
    return command


def _writers_view(pod: ServePod, topic: str) -> dict[str, Any]:
    status, body = http("GET", f"{pod.admin_url()}/admin/v1/topics/writers?topic={topic}")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def test_sessions_that_never_write_do_not_lock_out_other_writers_and_producers(
    pods: Callable[..., ServePod],
) -> None:
    pod = _store(pods)
    flooder = await SrkWire.open(pod.listen)
    await flooder.setup(TOPIC, "warm-up")  # the topic exists before the flood
    answers = [flooder.conn.request(_setup_command(TOPIC, f"flood-{i}"), 60) for i in range(FLOOD)]
    await asyncio.wait(answers)

    # Another connection's new writer and a named producer are served while the flood's sessions live.
    victim = await SrkWire.open(pod.listen)
    assert await victim.setup(TOPIC, "victim") == -1
    applied = await victim.append("victim", 0, [b"victim-event"])
    assert not applied.duplicate
    async with Client(coordinators=[], stores=[pod.listen]) as client:
        producer = await client.create_producer(TOPIC, producer_name="app")
        await producer.send(b"named-send")
    # Whatever the flood got (sessions or refusals), every refusal is a clear resource limit.
    refused = [f.exception() for f in answers if f.exception() is not None]
    for exc in refused:
        assert isinstance(exc, ServiceError) and exc.code == api.RESOURCE_LIMIT, exc
        assert "never wrote" in str(exc), exc
    held = [i for i, f in enumerate(answers) if f.exception() is None]
    assert len(held) + 1 <= MAX_UNWRITTEN_SESSIONS_PER_CONNECTION  # with the warm-up's
    assert len(refused) == FLOOD - len(held)
    view = _writers_view(pod, TOPIC)
    assert sorted(w["writerId"] for w in view["writers"]) == ["app", "victim"]
    assert view["sessionsWithoutWrites"] == len(held) + 1
    # A session that wrote no longer counts against its connection's limit, nor one a newer session
    # of its id (elsewhere) fenced.
    with pytest.raises(ServiceError) as full:
        await flooder.setup(TOPIC, "one-more")
    assert full.value.code == api.RESOURCE_LIMIT
    await flooder.append(f"flood-{held[0]}", 0, [b"flood-event"])
    assert await flooder.setup(TOPIC, "after-a-write") == -1
    assert await victim.setup(TOPIC, f"flood-{held[1]}") == -1
    assert await flooder.setup(TOPIC, "after-a-fence") == -1

    # Closing the connections forgets their sessions that never wrote: nothing of them is left.
    flooder.close()
    victim.close()

    async def released() -> bool:
        return bool(_writers_view(pod, TOPIC)["sessionsWithoutWrites"] == 0)

    await wait_until(released, 30, "the flood's sessions to be released")
    rows = {w["writerId"] for w in _writers_view(pod, TOPIC)["writers"]}
    assert rows == {"app", "victim", f"flood-{held[0]}"}  # the writers that wrote stay


async def test_the_writer_limit_counts_writers_that_wrote(pods: Callable[..., ServePod]) -> None:
    pod = _store(pods)
    wire = await SrkWire.open(pod.listen)
    for i in range(MAX_WRITERS):
        assert await wire.setup(TOPIC, f"w{i}") == -1
        await wire.append(f"w{i}", 0, [b"x"])
    # A new writer still gets its session; its first block is what the limit refuses.
    assert await wire.setup(TOPIC, "one-too-many") == -1
    with pytest.raises(ServiceError) as many:
        await wire.append("one-too-many", 0, [b"y"])
    assert many.value.code == api.TOO_MANY_WRITERS
    assert f"maxWritersPerTopic {MAX_WRITERS}" in str(many.value)
    # Known writers go on.
    assert (await wire.append("w0", 1, [b"z"])).event_number == 1
    wire.close()
