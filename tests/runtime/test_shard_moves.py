"""Moving a shard between two real store pods by the §12 admin verbs (docs/contracts.md §12): the
target serves the shard's topics with everything the source held (committed and aborted transactions,
an open one ended after the move, individual and transactional acks, a named producer's and a
single-key writer's state), and every step survives a SIGKILL of the pod that just did it.

The coordinator's redirect following is the client library's and coordinator's part (not here): the
open transaction is ended the way the coordinator would end it once redirected, by EndTxnOnStore on
the new owner through an authenticated coordinator connection, after the old owner refused that same
end with NOT_SERVED_HERE naming the new owner.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pulsar as pulsar_client
import pytest
from aiohttp import web
from pulsar_wire import RawPulsar, T, command, free_port
from runtime_pods import TOKEN, ServePod, coordinator_connection, http, pod_gauge
from runtime_waits import wait_until

from txnkeeper.admin.move import MoveError, move_shard
from txnkeeper.client import Client, Consumer, Message
from txnkeeper.contract.placement import Member, Placement, shard_of
from txnkeeper.errors import ConnectionClosedError, NotServedHereError, ServiceError
from txnkeeper.ledger.names import encode_name
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection, connect

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
MOVED = 0  # starts on pod 0 (shard s on pod s mod 2), moves to pod 1
MOVE = "move-1"
SUB = "sub"


def _topic_in(shard: int, stem: str) -> str:
    for i in range(1000):
        name = f"persistent://t/ns/{stem}-{i}"
        if shard_of(name, SHARDS) == shard:
            return name
    raise AssertionError("no name hashes into the shard")


IN = _topic_in(MOVED, "in")
KEYED = _topic_in(MOVED, "keyed")


def _verb(pod: ServePod, verb: str, body: dict[str, Any], shard: int = MOVED) -> tuple[int, Any]:
    return http("POST", f"{pod.admin_url()}/admin/v1/shards/{shard}/{verb}", body, token=TOKEN)


def _record(epoch: int, owner: int, stores: list[ServePod], ports: list[int]) -> dict[str, Any]:
    placement = Placement.initial(
        "store-shards",
        2,
        SHARDS,
        {
            i: Member(f"127.0.0.1:{ports[i]}", f"pulsar://127.0.0.1:{ports[i]}", stores[i].admin_url())
            for i in range(2)
        },
    )
    for _ in range(epoch - 1):
        placement = placement.with_owner(MOVED, owner)
    return placement.to_json()


async def _refused(conn: RpcConnection, request: api.Command) -> NotServedHereError:
    with pytest.raises(NotServedHereError) as caught:
        await conn.request(request, 10)
    return caught.value


def _end(txn: tuple[int, int], commit: bool) -> api.Command:
    request = api.Command()
    end = request.end_txn_on_store
    end.txn_id.most, end.txn_id.least = txn
    end.action = api.COMMIT if commit else api.ABORT
    end.topics.append(IN)
    sub = end.subscriptions.add()
    sub.topic, sub.subscription = IN, SUB
    return request


def _files(pod: ServePod, topic: str) -> Path:
    return pod.data_dir / "ledgers" / encode_name(topic)


async def test_a_shard_moves_with_its_transactions_acks_and_writer_state(
    pods: Callable[..., ServePod],
) -> None:
    ports = [free_port(), free_port()]
    urls = ",".join(f"pulsar://127.0.0.1:{p}" for p in ports)
    tc = pods("tc-0", "coordinator", release="3.0.0")
    stores = [
        pods(
            f"pas-{i}",
            "store",
            release="3.0.0",
            extra=[
                *("--listen", f"127.0.0.1:{ports[i]}", "--replicas", "2", "--shards", str(SHARDS)),
                *("--pulsar-urls", urls, "--srk-enabled", "true"),
            ],
        )
        for i in range(2)
    ]
    source, target = stores

    # --- what the shard holds before the move ---------------------------------------------------------
    async with Client(coordinators=[tc.listen], stores=[s.listen for s in stores]) as client:
        assert client.store_for(IN) == source.listen and client.store_for(KEYED) == source.listen
        producer = await client.create_producer(IN)
        for i in range(6):
            await producer.send(f"m{i}".encode())
        committed = await client.new_transaction()
        await producer.send(b"c0", txn=committed)
        await producer.send(b"c1", txn=committed)
        await committed.commit()
        aborted = await client.new_transaction()
        await producer.send(b"a0", txn=aborted)
        await aborted.abort()
        consumer = await client.subscribe(IN, SUB)
        received: dict[bytes, Message] = {}
        while len(received) < 8:
            message = await consumer.receive(timeout=10)
            received[message.data] = message
        assert set(received) == {b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"c0", b"c1"}
        for name in (b"m0", b"m1", b"m2"):
            await consumer.acknowledge(received[name])
        still_open = await client.new_transaction(timeout_ms=170_000)
        await producer.send(b"o0", txn=still_open)
        await consumer.acknowledge(received[b"m3"], txn=still_open)  # pending until the txn ends
        open_id = (still_open.pb_id.most, still_open.pb_id.least)
        named = await client.create_producer(KEYED, producer_name="np")
        for i in range(3):
            await named.send(f"n{i}".encode())
        assert named.last_sequence_id == 2
        writer = await client.create_single_key_writer(KEYED, "k", 60_000, writer_id="w1")
        block = writer.begin_transaction()
        block.write(b"e0")
        block.write(b"e1")
        await block.commit()
        events = writer.last_event_number

    # --- 1. fence on the source, which survives a SIGKILL ------------------------------------------
    status, manifest = _verb(source, "fence", {"move": MOVE})
    assert status == 200, manifest
    assert {IN, KEYED} <= set(manifest["topics"]) and manifest["shard"] == MOVED
    paths = {f["path"] for f in manifest["files"]}
    assert any(p.startswith(f"ledgers/{encode_name(IN)}/") for p in paths)
    assert any("__transaction_pending_ack" in p for p in paths), "the subscription's pending-ack log"
    assert any(p.startswith("store/txnbuffer-snapshots/") for p in paths)
    conn = await connect(source.listen)
    try:
        moving = await _refused(conn, api.Command(produce=api.Produce(topic=IN, payload=b"x")))
        assert moving.owner_address == "" and "being moved" in str(moving)
    finally:
        conn.close()
    source.kill(signal.SIGKILL)
    source.start()
    status, again = _verb(source, "fence", {"move": MOVE})
    assert status == 200 and again["files"] == manifest["files"], "the same manifest after a restart"
    status, refused = _verb(source, "fence", {"move": "another"})
    assert status == 409 and MOVE in refused["error"]

    # --- release before the flip is refused; a file damaged in transit is refused -------------------
    status, refused = _verb(source, "release", {"move": MOVE})
    assert status == 409 and "still names it the owner" in refused["error"]
    biggest = max(manifest["files"], key=lambda f: f["size"])
    damaged = source.data_dir / biggest["path"]
    original = damaged.read_bytes()
    damaged.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    status, refused = _verb(target, "receive", {"move": MOVE, "source": source.admin_url()})
    assert status == 502, refused
    assert biggest["path"] in refused["error"] and f"{biggest['crc32c']:#010x}" in refused["error"]
    assert not _files(target, IN).exists(), "nothing installed"
    damaged.write_bytes(original)

    # --- 3. receive on the target, which survives a SIGKILL -----------------------------------------
    status, receipt = _verb(target, "receive", {"move": MOVE, "source": source.admin_url()})
    assert status == 200, receipt
    assert receipt["files"] == len(manifest["files"]) and receipt["bytes"] == manifest["bytes"]
    target.kill(signal.SIGKILL)
    target.start()
    status, repeated = _verb(target, "receive", {"move": MOVE, "source": source.admin_url()})
    assert status == 200 and repeated["bytes"] == receipt["bytes"]
    status, listing = http("GET", f"{target.admin_url()}/admin/v1/shards")
    row = next(r for r in listing["shards"] if r["shard"] == MOVED)
    assert row["state"] == "received" and row["owner"] == 0 and row["bytes"] > 0
    assert pod_gauge(target, "txnkeeper_shard_bytes", f'shard="{MOVED}"') == row["bytes"]

    # --- 4. the flip: the target first, then the source; 5. release -----------------------------------
    for i, pod in enumerate((target, source)):
        status, answer = http(
            "PUT", f"{pod.admin_url()}/admin/v1/placement", _record(2, 1, stores, ports), TOKEN
        )
        assert status == 200 and answer["epoch"] == 2, (i, answer)
    status, released = _verb(source, "release", {"move": MOVE})
    assert status == 200, released
    assert not _files(source, IN).exists() and not _files(source, KEYED).exists()
    status, again = _verb(source, "release", {"move": MOVE})
    assert status == 200 and again["topics"] == [], "release is idempotent"
    status, shards = http("GET", f"{source.admin_url()}/admin/v1/shards")
    assert MOVED not in {r["shard"] for r in shards["shards"]}
    assert pod_gauge(source, "txnkeeper_shard_moves_total", 'direction="out"') >= 1

    # --- the old owner redirects: own protocol, Pulsar's LOOKUP, the admin's topic verbs ---------------
    conn = await connect(source.listen)
    try:
        moved = await _refused(conn, api.Command(produce=api.Produce(topic=IN, payload=b"x")))
        assert moved.owner_address == target.listen and moved.placement_epoch == 2
    finally:
        conn.close()
    raw = RawPulsar(source.listen)
    try:
        raw.handshake()
        lookup = command(T.LOOKUP)
        lookup.lookupTopic.topic = IN
        lookup.lookupTopic.request_id = 1
        raw.send(lookup)
        answer = raw.expect(T.LOOKUP_RESPONSE).lookupTopicResponse
        assert answer.brokerServiceUrl == f"pulsar://127.0.0.1:{ports[1]}"
        open_producer = command(T.PRODUCER)
        open_producer.producer.topic = IN
        open_producer.producer.producer_id = 1
        open_producer.producer.request_id = 2
        raw.send(open_producer)
        error = raw.expect(T.ERROR).error
        assert error.error == pulsar.ServiceNotReady and target.listen in error.message
    finally:
        raw.close()
    quoted = urllib.parse.quote(IN)
    status, refused = http("GET", f"{source.admin_url()}/admin/v1/topics/retention?topic={quoted}")
    assert status == 409 and target.listen in refused["error"]

    # --- the open transaction ends on the new owner (as a redirected coordinator ends it) -------------
    old = await coordinator_connection(source)
    try:
        refused_end = await _refused(old, _end(open_id, commit=True))
        assert refused_end.owner_address == target.listen
    finally:
        old.close()
    new = await coordinator_connection(target)
    try:
        await new.request(_end(open_id, commit=True), 10)
    finally:
        new.close()

    # --- the target serves everything the source held, once --------------------------------------------
    async with Client(coordinators=[tc.listen], stores=[target.listen]) as client:
        producer = await client.create_producer(IN)
        await producer.send(b"end")
        consumer = await client.subscribe(IN, SUB)
        delivered: list[bytes] = []
        while not delivered or delivered[-1] != b"end":
            delivered.append((await consumer.receive(timeout=15)).data)
        # m0-m2 acked, m3 acked by the committed transaction, a0 aborted: never delivered.
        assert sorted(delivered) == sorted([b"m4", b"m5", b"c0", b"c1", b"o0", b"end"]), delivered
        named = await client.create_producer(KEYED, producer_name="np")
        assert named.last_sequence_id == 2, "the named producer's dedup state moved"
        writer = await client.create_single_key_writer(KEYED, "k", 60_000, writer_id="w1")
        assert writer.last_event_number == events, "the single-key writer's state moved"
    conn = await connect(target.listen)
    try:
        setup = api.Command()
        setup.setup_append.topic = KEYED
        setup.setup_append.writer_id = "np"
        setup.setup_append.producer_session = "resender"
        assert (await conn.request(setup, 10)).append_setup.last_event_number == 2
        resend = api.Command(
            produce=api.Produce(topic=KEYED, payload=b"n2", producer_name="np", sequence_id=2)
        )
        assert (await conn.request(resend, 10)).produce_receipt.duplicate, "a resend of seq 2 is a duplicate"
    finally:
        conn.close()
    assert pod_gauge(target, "txnkeeper_placement_epoch") == 2


async def test_a_store_without_replicas_serves_every_topic_and_takes_a_record(
    pods: Callable[..., ServePod],
) -> None:
    """Backwards compatible: no --replicas and no record, every topic is served (as before placement);
    a record PUT later starts the redirects, and a rollback (unfence) serves the shard again."""
    tc = pods("tc-0", "coordinator")
    store = pods("pas-0", "store")
    elsewhere = _topic_in(1, "elsewhere")
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        for topic in (IN, elsewhere):
            await (await client.create_producer(topic)).send(b"x")
    status, refused = http("GET", f"{store.admin_url()}/admin/v1/placement")
    assert status == 404 and "serves every topic" in refused["error"]
    status, listing = http("GET", f"{store.admin_url()}/admin/v1/shards")
    assert status == 200 and listing["shards"] == []
    record = Placement("store-shards", 1, (0, 1, 0, 1), {1: Member("127.0.0.1:1")}).to_json()
    status, answer = http("PUT", f"{store.admin_url()}/admin/v1/placement", record, TOKEN)
    assert status == 200 and answer == {"epoch": 1, "changed": True}
    status, answer = http("PUT", f"{store.admin_url()}/admin/v1/placement", record, TOKEN)
    assert status == 200 and answer["changed"] is False, "the same record again is a no-op"
    status, stale = http(
        "PUT", f"{store.admin_url()}/admin/v1/placement", {**record, "owners": [0, 0, 0, 0]}, TOKEN
    )
    assert status == 409, stale
    conn = await connect(store.listen)
    try:
        refused_topic = await _refused(conn, api.Command(produce=api.Produce(topic=elsewhere, payload=b"x")))
        assert refused_topic.owner_address == "127.0.0.1:1"
        await conn.request(api.Command(produce=api.Produce(topic=IN, payload=b"y")), 10)
    finally:
        conn.close()
    status, _ = _verb(store, "fence", {"move": "m"})
    assert status == 200
    status, _ = _verb(store, "unfence", {"move": "m"})
    assert status == 200
    store.kill(signal.SIGTERM)
    store.start()  # the record persisted: the redirect holds after a restart
    status, got = http("GET", f"{store.admin_url()}/admin/v1/placement")
    assert status == 200 and got == record
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        await (await client.create_producer(IN)).send(b"z")
        with pytest.raises(ServiceError):
            await (await client.create_producer(elsewhere)).send(b"z")


def _cli(pod: ServePod, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "admin",
            "--url",
            pod.admin_url(),
            "--token-file",
            str(pod.token_file),
            "shards",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


async def test_unload_and_move_from_the_cli_reconnect_the_shards_clients(
    pods: Callable[..., ServePod],
) -> None:
    ports = [free_port(), free_port()]
    urls = ",".join(f"pulsar://127.0.0.1:{p}" for p in ports)
    tc = pods("tc-0", "coordinator")
    stores = [
        pods(
            f"pas-{i}",
            "store",
            extra=[
                "--listen",
                f"127.0.0.1:{ports[i]}",
                "--replicas",
                "2",
                "--shards",
                "2",
                "--pulsar-urls",
                urls,
            ],
        )
        for i in range(2)
    ]
    source, target = stores
    topic = _topic_in(0, "cli")
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        consumer = await client.subscribe(topic, SUB)
        producer = await client.create_producer(topic)
        await producer.send(b"before")
        before = await consumer.receive(timeout=10)
        assert before.data == b"before"
        await consumer.acknowledge(before)
        raw = RawPulsar(source.listen)
        try:
            raw.handshake()
            open_producer = command(T.PRODUCER)
            open_producer.producer.topic = topic
            open_producer.producer.producer_id = 7
            open_producer.producer.request_id = 1
            raw.send(open_producer)
            raw.expect(T.PRODUCER_SUCCESS)
            code, out, err = _cli(source, "unload", topic)
            assert code == 0, err
            assert json.loads(out)["shard"] == 0 and topic in json.loads(out)["topics"]
            closed = raw.expect(T.CLOSE_PRODUCER)  # Pulsar's client looks the topic up again
            assert closed.close_producer.producer_id == 7
        finally:
            raw.close()

        # The own protocol's consumer lost its connection and subscribed again by itself; a send on
        # the connection being closed fails as any send on a lost connection does, and is retried.
        async def sent() -> bool:
            try:
                await producer.send(b"after-unload")
            except ConnectionClosedError:
                return False
            return True

        await wait_until(sent, 20, "a send after the unload")
        after = await consumer.receive(timeout=20)
        assert after.data == b"after-unload"  # "before" stays acknowledged across the unload
        await _acknowledged(consumer, after)
        await consumer.close()

    code, out, err = _cli(
        source, "move", "--shard", "0", "--from", source.admin_url(), "--to", target.admin_url()
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["steps"] == ["precopy", "fence", "receive", "placement", "release"]
    assert report["epoch"] == 2
    code, out, err = _cli(source, "list", source.admin_url(), target.admin_url())
    assert code == 0, err
    listed = json.loads(out)
    assert 0 not in {r["shard"] for r in listed[0]["shards"]}
    assert next(r for r in listed[1]["shards"] if r["shard"] == 0)["state"] == "serving"
    async with Client(coordinators=[tc.listen], stores=[target.listen]) as client:
        consumer = await client.subscribe(topic, SUB)
        await (await client.create_producer(topic)).send(b"on-target")
        got = await _receive_until(consumer, b"on-target")
        assert got == [b"on-target"], "what was acknowledged stays acknowledged on the new owner"


async def _acknowledged(consumer: Consumer, message: Message) -> None:
    """Acknowledge, again while the consumer is reconnecting (the ack needs its connection)."""

    async def acked() -> bool:
        try:
            await consumer.acknowledge(message)
        except ServiceError:
            return False
        return True

    await wait_until(acked, 20, "the acknowledgement")


async def _receive_until(consumer: Consumer, last: bytes) -> list[bytes]:
    got: list[bytes] = []
    while not got or got[-1] != last:
        got.append((await consumer.receive(timeout=20)).data)
    return got


HOSTILE: list[tuple[str, str, object, bool, int, str]] = [
    # (method, path, body, with token, status, text in the error)
    ("POST", "/admin/v1/shards/0/fence", {"move": "m"}, False, 401, ""),
    ("PUT", "/admin/v1/placement", {"kind": "store-shards"}, False, 401, ""),
    ("GET", "/admin/v1/shards/0/files?move=m&path=x", None, False, 401, ""),
    ("POST", "/admin/v1/shards/-1/fence", {"move": "m"}, True, 400, "shard must be"),
    ("POST", "/admin/v1/shards/%D9%A1/fence", {"move": "m"}, True, 400, "shard must be"),
    ("POST", "/admin/v1/shards/99999/fence", {"move": "m"}, True, 400, "shard must be"),
    ("POST", "/admin/v1/shards/7/fence", {"move": "m"}, True, 404, "does not exist"),
    ("POST", "/admin/v1/shards/0/fence", {}, True, 400, "'move'"),
    ("POST", "/admin/v1/shards/0/fence", {"move": ""}, True, 400, "'move'"),
    ("POST", "/admin/v1/shards/0/fence", {"move": "x" * 129}, True, 400, "'move'"),
    ("POST", "/admin/v1/shards/0/fence", {"move": "a\nb"}, True, 400, "'move'"),
    ("POST", "/admin/v1/shards/0/fence", {"move": 5}, True, 400, "'move'"),
    ("POST", "/admin/v1/shards/0/fence", {"move": "m", "extra": 1}, True, 400, "unknown key"),
    ("POST", "/admin/v1/shards/0/fence", [1], True, 400, "JSON object"),
    ("POST", "/admin/v1/shards/0/explode", {"move": "m"}, True, 404, "no admin API resource"),
    ("POST", "/admin/v1/shards/0/receive", {"move": "m"}, True, 400, "'source'"),
    (
        "POST",
        "/admin/v1/shards/1/receive",
        {"move": "m", "source": "file:///etc/passwd"},
        True,
        400,
        "http(s)",
    ),
    (
        "POST",
        "/admin/v1/shards/0/receive",
        {"move": "m", "source": "http://127.0.0.1:1"},
        True,
        409,
        "already owns",
    ),
    (
        "POST",
        "/admin/v1/shards/1/receive",
        {"move": "m", "source": "http://127.0.0.1:1"},
        True,
        502,
        "cannot be reached",
    ),
    ("POST", "/admin/v1/shards/1/fence", {"move": "m"}, True, 409, "owned by pod 1"),
    ("POST", "/admin/v1/shards/0/release", {"move": "m"}, True, 409, "still names it the owner"),
    ("POST", "/admin/v1/shards/0/discard", {"move": "m"}, True, 409, "owns shard 0"),
    ("POST", "/admin/v1/shards/1/unfence", {"move": "m"}, True, 409, "cannot take it back"),
    ("GET", "/admin/v1/shards/0/files?move=m&path=ledgers/x", None, True, 409, "not fenced"),
    ("GET", "/admin/v1/shards/0/files?move=m", None, True, 400, "'path'"),
    ("GET", "/admin/v1/shards/0/files?path=p", None, True, 400, "'move'"),
    ("PUT", "/admin/v1/placement", {"kind": "store-shards"}, True, 400, "epoch"),
    (
        "PUT",
        "/admin/v1/placement",
        {"kind": "coordinator-ids", "epoch": 2, "owners": [0, 1]},
        True,
        400,
        "store pod",
    ),
    (
        "PUT",
        "/admin/v1/placement",
        {"kind": "store-shards", "epoch": 2, "owners": [0]},
        True,
        400,
        "2 shards",
    ),
    (
        "PUT",
        "/admin/v1/placement",
        {"kind": "store-shards", "epoch": 1, "owners": [0, 0]},
        True,
        409,
        "not newer",
    ),
    (
        "PUT",
        "/admin/v1/placement",
        {"kind": "store-shards", "epoch": 3, "owners": [0, 1], "x": 1},
        True,
        400,
        "unknown keys",
    ),
]


def test_hostile_placement_and_shard_requests_are_refused_saying_why(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store", extra=["--replicas", "2", "--shards", "2"])
    for method, path, body, with_token, status, text in HOSTILE:
        got, answer = http(method, store.admin_url() + path, body, TOKEN if with_token else None)
        assert got == status, (method, path, body, answer)
        assert text in (answer["error"] if isinstance(answer, dict) else answer), (path, answer)
    # A fenced shard serves the files of its manifest only (no path outside it, no traversal).
    status, manifest = http("POST", f"{store.admin_url()}/admin/v1/shards/0/fence", {"move": "m"}, TOKEN)
    assert status == 200 and manifest["files"], manifest
    for path in ("../placement.json", "placement.json", "ledgers/../placement.json", "/etc/passwd"):
        query = urllib.parse.urlencode({"move": "m", "path": path})
        got, answer = http("GET", f"{store.admin_url()}/admin/v1/shards/0/files?{query}", None, TOKEN)
        assert got == 404 and "not a file of shard 0's manifest" in answer["error"], (path, answer)
    good = manifest["files"][0]
    query = urllib.parse.urlencode({"move": "m", "path": good["path"]})
    got, answer = http("GET", f"{store.admin_url()}/admin/v1/shards/0/files?{query}", None, TOKEN)
    assert got == 200
    status, _ = http("POST", f"{store.admin_url()}/admin/v1/shards/0/unfence", {"move": "m"}, TOKEN)
    assert status == 200


def test_pulsar_clients_follow_the_move_and_batch_index_acks_move_with_it(
    pods: Callable[..., ServePod],
) -> None:
    """Apache Pulsar's own client: batch-index acks made on the source hold on the target, and a live
    consumer and a producer of the moving shard are closed, look the topic up again and reconnect to
    the new owner by themselves."""
    ports = [free_port(), free_port()]
    urls = ",".join(f"pulsar://127.0.0.1:{p}" for p in ports)
    stores = [
        pods(
            f"pas-{i}",
            "store",
            extra=[
                "--listen",
                f"127.0.0.1:{ports[i]}",
                "--replicas",
                "2",
                "--shards",
                "2",
                "--pulsar-urls",
                urls,
            ],
        )
        for i in range(2)
    ]
    source, target = stores
    topic = _topic_in(0, "pulsar")
    client = pulsar_client.Client(f"pulsar://{source.listen}", operation_timeout_seconds=30)
    try:
        live = client.subscribe(topic, "live", initial_position=pulsar_client.InitialPosition.Earliest)
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
        )
        consumer = client.subscribe(
            topic, SUB, initial_position=pulsar_client.InitialPosition.Earliest, batch_index_ack_enabled=True
        )
        for i in range(30):
            producer.send_async(f"i{i}".encode(), None)
        producer.flush()
        received = [consumer.receive(timeout_millis=10_000) for _ in range(30)]
        assert max(m.message_id().batch_index() for m in received) > 0, "the producer batched"
        for message in received:
            if int(message.data()[1:]) % 3 == 0:
                consumer.acknowledge(message)
        consumer.close()  # flushes the grouped acks
        for _ in range(30):
            live.acknowledge(live.receive(timeout_millis=10_000))

        report = asyncio.run(move_shard(0, source.admin_url(), target.admin_url(), token=TOKEN))
        assert report.steps == ["precopy", "fence", "receive", "placement", "release"]

        producer.send(b"after-move")  # the producer was closed, looked the topic up and reconnected
        # (Acks the client still held back in its ack group may come back once: at least once.)
        while live.receive(timeout_millis=30_000).data() != b"after-move":
            pass
        left = sorted(f"i{i}" for i in range(30) if i % 3)
        again = client.subscribe(topic, SUB, batch_index_ack_enabled=True)
        got = sorted(again.receive(timeout_millis=20_000).data().decode() for _ in range(len(left) + 1))
        assert got == sorted([*left, "after-move"]), got
    finally:
        client.close()
    assert not _files(source, topic).exists() and _files(target, topic).exists()


async def test_a_target_killed_while_it_pulls_installs_nothing_and_a_rollback_restores_the_source(
    pods: Callable[..., ServePod],
) -> None:
    """The target is SIGKILLed while the second file is on its way (a stand-in source hands out the
    real source's manifest and first file, then holds the second): after its restart nothing of the
    shard is installed or listed, a discard removes the staged rest, and the receive repeated from the
    real source completes; then the move is rolled back (discard, unfence) and the source serves."""
    tc = pods("tc-0", "coordinator")
    stores = [pods(f"pas-{i}", "store", extra=["--replicas", "2", "--shards", str(SHARDS)]) for i in range(2)]
    source, target = stores
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        consumer = await client.subscribe(IN, SUB)
        producer = await client.create_producer(IN)
        for i in range(20):
            await producer.send(f"x{i}".encode() * 100)
        await consumer.close()
    status, manifest = _verb(source, "fence", {"move": MOVE})
    assert status == 200 and len(manifest["files"]) >= 2
    served: list[str] = []
    release = asyncio.Event()
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def fence(request: web.Request) -> web.Response:
        return web.json_response(manifest)

    async def files(request: web.Request) -> web.StreamResponse:
        served.append(request.query["path"])
        if len(served) > 1:
            await release.wait()  # held until the target is dead
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"{source.admin_url()}/admin/v1/shards/{MOVED}/files", params=request.query, headers=headers
            ) as response,
        ):
            return web.Response(body=await response.read())

    app = web.Application()
    app.router.add_post(f"/admin/v1/shards/{MOVED}/fence", fence)
    app.router.add_get(f"/admin/v1/shards/{MOVED}/files", files)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        receiving = asyncio.create_task(
            asyncio.to_thread(_verb, target, "receive", {"move": MOVE, "source": f"http://127.0.0.1:{port}"})
        )

        async def second_file_asked() -> bool:
            return len(served) >= 2

        await wait_until(second_file_asked, 30, "the target to ask for the second file")
        target.kill(signal.SIGKILL)
        release.set()
        await asyncio.gather(receiving, return_exceptions=True)
    finally:
        await runner.cleanup()
    target.start()
    assert (target.data_dir / "moves-in").exists(), "the staged first file is still there"
    assert not _files(target, IN).exists()
    status, listing = http("GET", f"{target.admin_url()}/admin/v1/shards")
    assert MOVED not in {r["shard"] for r in listing["shards"]}
    status, _ = _verb(target, "discard", {"move": MOVE})
    assert status == 200 and not list((target.data_dir / "moves-in").glob("*"))
    status, receipt = _verb(target, "receive", {"move": MOVE, "source": source.admin_url()})
    assert status == 200 and receipt["files"] == len(manifest["files"]), receipt
    assert _files(target, IN).exists()

    # Rolled back before the flip: the received copy goes, the source serves again (both idempotent).
    status, refused = _verb(source, "unfence", {"move": "other"})
    assert status == 409 and MOVE in refused["error"]
    for _ in range(2):
        status, discarded = _verb(target, "discard", {"move": MOVE})
        assert status == 200, discarded
        status, _ = _verb(source, "unfence", {"move": MOVE})
        assert status == 200
    assert not _files(target, IN).exists() and not list((target.data_dir / "moves-in").glob("*"))
    status, listing = http("GET", f"{target.admin_url()}/admin/v1/shards")
    assert MOVED not in {r["shard"] for r in listing["shards"]}
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        consumer = await client.subscribe(IN, SUB)
        assert (await consumer.receive(timeout=10)).data == b"x0" * 100


def test_a_move_to_a_pod_the_record_gives_no_address_is_refused_before_anything(
    pods: Callable[..., ServePod],
) -> None:
    """Clients follow a moved shard to the address the record gives its new owner; without one they
    could only wait out their timeouts, so the move is refused at its check (nothing fenced)."""
    stores = [pods(f"pas-{i}", "store", extra=["--replicas", "2", "--shards", "2"]) for i in range(2)]
    with pytest.raises(MoveError, match="gives no address for pod 1") as refused:
        asyncio.run(move_shard(0, stores[0].admin_url(), stores[1].admin_url(), token=TOKEN))
    assert refused.value.step == "check"
    with urllib.request.urlopen(f"{stores[0].admin_url()}/admin/v1/shards", timeout=10) as response:
        listing = json.loads(response.read())
    assert {row["shard"]: row["state"] for row in listing["shards"]}.get(0) == "serving"
