"""Moving a coordinator id between two real coordinator pods (docs/contracts.md §12) with transactions
open on it: fence on the source, receive on the target, the placement record flips, release on the
source. Both pods are SIGKILLed in the middle and the verbs repeated.

What must hold: a transaction begun before the move commits after it through the new owner (the
client follows the redirect) and its effects are visible once; one that times out after the move is
aborted by the new owner; the source ends up holding nothing of the id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pulsar_wire import RawPulsar, T, command
from runtime_pods import TOKEN, ServePod, http
from runtime_waits import wait_until

from txnkeeper.client import Client, Consumer
from txnkeeper.server.pulsar_placement import TC_ASSIGN_TOPIC

IN = "persistent://t/ns/in"
OUT = "persistent://t/ns/out"
PLACED = ["--coordinators", "2", "--coordinator-ids", "auto", "--replicas", "2"]


def record(epoch: int, owners: list[int], tcs: list[ServePod]) -> dict[str, Any]:
    members = {str(i): {"address": tc.listen, "adminUrl": tc.admin_url()} for i, tc in enumerate(tcs)}
    return {"kind": "coordinator-ids", "epoch": epoch, "owners": owners, "members": members}


async def verb(pod: ServePod, c: int, name: str, body: dict[str, Any]) -> tuple[int, Any]:
    # Off the event loop: the client's connections see their pods die while the verbs run.
    url = f"{pod.admin_url()}/admin/v1/coordinators/{c}/{name}"
    return await asyncio.to_thread(http, "POST", url, body, TOKEN)


async def put(pod: ServePod, body: dict[str, Any]) -> None:
    url = f"{pod.admin_url()}/admin/v1/placement"
    status, answer = await asyncio.to_thread(http, "PUT", url, body, TOKEN)
    assert status == 200, answer


async def restart(pod: ServePod) -> None:
    pod.kill()
    await asyncio.to_thread(pod.start)


def tc_lookup(pod: ServePod, coordinator: int) -> str:
    """What LOOKUP of partition ``coordinator`` of the coordinator-assign topic answers on ``pod``."""
    raw = RawPulsar(pod.listen)
    try:
        raw.handshake()
        lookup = command(T.LOOKUP)
        lookup.lookupTopic.topic = f"{TC_ASSIGN_TOPIC}-partition-{coordinator}"
        lookup.lookupTopic.request_id = 1
        raw.send(lookup)
        return str(raw.expect(T.LOOKUP_RESPONSE).lookupTopicResponse.brokerServiceUrl)
    finally:
        raw.close()


async def next_payload(consumer: Consumer) -> bytes:
    message = await consumer.receive(timeout=30)
    await consumer.acknowledge(message)
    return message.data


async def test_a_coordinator_id_moves_with_its_open_transactions(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store")
    tc0 = pods("tc-0", "coordinator", extra=PLACED)
    tc1 = pods("tc-1", "coordinator", extra=PLACED)
    tcs = [tc0, tc1]
    for tc in tcs:  # the writer's record: today's placement (id c on pod c mod 2), with addresses
        await put(tc, record(2, [0, 1], tcs))
    async with Client(coordinators=[tc0.listen, tc1.listen], stores=[store.listen]) as client:
        source = await client.create_producer(IN)
        await source.send(b"job")
        work = await client.subscribe(IN, "work")
        verify = await client.subscribe(OUT, "verify")
        out = await client.create_producer(OUT)
        begun = [await client.new_transaction(timeout_ms=60_000) for _ in range(2)]
        txn = next(t for t in begun if t.txn_id.most == 1)
        assert txn.coordinator_address == tc1.listen
        job = await work.receive(timeout=30)
        await work.acknowledge(job, txn=txn)
        await out.send(b"result", txn=txn)
        doomed = await client.new_transaction(timeout_ms=8_000)
        while doomed.txn_id.most != 1:
            await doomed.abort()
            doomed = await client.new_transaction(timeout_ms=8_000)
        await out.send(b"doomed", txn=doomed)

        # 1. fence on the source; killed after it, the fence is repeated and gives the same files.
        status, manifest = await verb(tc1, 1, "fence", {"move": "m1"})
        assert status == 200, manifest
        assert manifest["coordinator"] == 1 and manifest["files"], manifest
        assert any(f["path"].endswith("1.sequence") for f in manifest["files"])
        status, refused = await verb(tc1, 1, "fence", {"move": "other"})
        assert status == 409 and "m1" in refused["error"]
        await restart(tc1)
        status, again = await verb(tc1, 1, "fence", {"move": "m1"})
        assert status == 200 and again["files"] == manifest["files"]

        # 2. receive on the target; killed after it, the receive is repeated.
        status, received = await verb(tc0, 1, "receive", {"move": "m1", "source": tc1.admin_url()})
        assert status == 200, received
        assert received["files"] == len(manifest["files"]) and received["bytes"] == manifest["bytes"]
        await restart(tc0)
        status, received = await verb(tc0, 1, "receive", {"move": "m1", "source": tc1.admin_url()})
        assert status == 200 and received["files"] == len(manifest["files"]), received
        status, refused = await verb(tc1, 1, "release", {"move": "m1"})
        assert status == 409  # the source still owns it by its record

        # 3. the record flips: target first, then the source.
        flipped = record(3, [0, 0], tcs)
        await put(tc0, flipped)
        await put(tc1, flipped)
        status, again = await verb(tc0, 1, "receive", {"move": "m1", "source": tc1.admin_url()})
        assert status == 409 and "owns" in again["error"], again  # the step is past: the owner says so
        # Pulsar's clients find coordinator 1 on the new owner: the lookup answers from the record.
        assert await asyncio.to_thread(tc_lookup, tc1, 1) == f"pulsar://{tc0.listen}"

        # The open transaction commits through the new owner (the client follows the redirect).
        await txn.commit()
        assert txn.coordinator_address == tc0.listen
        assert await next_payload(verify) == b"result"
        # The one that times out after the move is aborted by the new owner.
        deadline = time.monotonic() + 60

        async def aborted() -> bool:
            return await client.transaction_status(doomed) == "ABORTED"

        await wait_until(aborted, max(1.0, deadline - time.monotonic()), "the new owner to abort on timeout")
        await out.send(b"after")
        assert await next_payload(verify) == b"after"  # "doomed" was never visible
        await source.send(b"job-2")
        assert await next_payload(work) == b"job-2"  # the committed ack is not redelivered
        # New transactions on id 1 begin on the new owner.
        fresh = [await client.new_transaction(timeout_ms=10_000) for _ in range(4)]
        assert {t.txn_id.most for t in fresh} == {0, 1}
        for t in fresh:
            await t.abort()

    # 4. release on the source deletes its copy; repeated, it is a no-op.
    status, released = await verb(tc1, 1, "release", {"move": "m1"})
    assert status == 200, released
    assert not (tc1.data_dir / "coordinator" / "1.sequence").exists()
    assert not any((tc1.data_dir / "ledgers").glob("*transaction_log_1*"))
    assert (await verb(tc1, 1, "release", {"move": "m1"}))[0] == 200
    status, listing = http("GET", f"{tc0.admin_url()}/admin/v1/coordinators")
    assert status == 200
    rows = {row["coordinator"]: row for row in listing["coordinators"]}
    assert rows[1]["owner"] == 0 and rows[1]["state"] == "serving", listing
    assert listing["epoch"] == 3


async def test_a_move_rolled_back_serves_the_id_again_and_the_client_waits_it_out(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store")
    tc0 = pods("tc-0", "coordinator", extra=PLACED)
    tc1 = pods("tc-1", "coordinator", extra=PLACED)
    tcs = [tc0, tc1]
    for tc in tcs:
        await put(tc, record(2, [0, 1], tcs))
    async with Client(coordinators=[tc0.listen], stores=[store.listen]) as client:
        out = await client.create_producer(OUT)
        verify = await client.subscribe(OUT, "verify")
        txn = await client.new_transaction(timeout_ms=60_000)
        assert txn.txn_id.most == 0
        await out.send(b"kept", txn=txn)
        status, manifest = await verb(tc0, 0, "fence", {"move": "m0"})
        assert status == 200, manifest
        # Fenced: the commit is refused "being moved" and the client waits (raising nothing)...
        committing = asyncio.ensure_future(txn.commit())
        status, received = await verb(tc1, 0, "receive", {"move": "m0", "source": tc0.admin_url()})
        assert status == 200, received
        assert any((tc1.data_dir / "ledgers").glob("*transaction_log_0*"))
        assert not committing.done()
        # ...until the move is rolled back: the target drops its copy, the source serves the id again.
        status, discarded = await verb(tc1, 0, "discard", {"move": "m0"})
        assert status == 200, discarded
        assert not any((tc1.data_dir / "ledgers").glob("*transaction_log_0*"))
        assert (await verb(tc0, 0, "discard", {"move": "m0"}))[0] == 409  # the owner keeps its copy
        status, unfenced = await verb(tc0, 0, "unfence", {"move": "m0"})
        assert status == 200 and unfenced["state"] == "serving", unfenced
        await committing
        assert await next_payload(verify) == b"kept"
        status, refused = await verb(tc1, 0, "fence", {"move": "m0"})
        assert status == 409 and "owned by pod 0" in refused["error"]


async def test_a_file_damaged_on_the_way_is_refused_and_nothing_is_installed(
    pods: Callable[..., ServePod],
) -> None:
    tc0 = pods("tc-0", "coordinator", extra=PLACED)
    tc1 = pods("tc-1", "coordinator", extra=PLACED)
    tcs = [tc0, tc1]
    for tc in tcs:
        await put(tc, record(2, [0, 1], tcs))
    async with Client(coordinators=[tc1.listen], stores=[]) as client:
        for _ in range(3):
            await (await client.new_transaction(timeout_ms=60_000)).abort()
    status, manifest = await verb(tc1, 1, "fence", {"move": "m1"})
    assert status == 200, manifest
    entry = max((f for f in manifest["files"] if f["path"].startswith("ledgers/")), key=lambda f: f["size"])
    damaged = tc1.data_dir / entry["path"]
    original = damaged.read_bytes()
    damaged.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # the source's disk flips a bit
    status, refused = await verb(tc0, 1, "receive", {"move": "m1", "source": tc1.admin_url()})
    assert status == 502, refused
    assert entry["path"] in refused["error"] and str(entry["crc32c"]) in refused["error"]
    assert not any((tc0.data_dir / "ledgers").glob("*transaction_log_1*"))  # nothing installed
    status, listing = await asyncio.to_thread(http, "GET", f"{tc0.admin_url()}/admin/v1/coordinators")
    assert {r["coordinator"]: r["state"] for r in listing["coordinators"]}[1] == "elsewhere"
    damaged.write_bytes(original)
    status, received = await verb(tc0, 1, "receive", {"move": "m1", "source": tc1.admin_url()})
    assert status == 200 and received["files"] == len(manifest["files"]), received


async def test_the_coordinator_verbs_refuse_bad_requests_saying_why(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store")
    listed = pods("tc-9", "coordinator", extra=["--coordinators", "2", "--coordinator-ids", "0,1"])
    tc0 = pods("tc-0", "coordinator", extra=PLACED)
    base = f"{tc0.admin_url()}/admin/v1/coordinators"

    async def call(method: str, url: str, body: object = None, token: str | None = TOKEN) -> tuple[int, Any]:
        return await asyncio.to_thread(http, method, url, body, token)

    for pod in (store, listed):  # ids that do not move: said so
        status, answer = await call("POST", f"{pod.admin_url()}/admin/v1/coordinators/0/fence", {"move": "m"})
        assert status == 404 and "--coordinator-ids auto" in answer["error"], answer
    cases: list[tuple[str, str, object, int, str]] = [
        ("POST", f"{base}/0x1/fence", {"move": "m"}, 400, "plain digits"),
        ("POST", f"{base}/7/fence", {"move": "m"}, 404, "ids 0..1"),
        ("POST", f"{base}/0/fence", {"move": ""}, 400, "move id"),
        ("POST", f"{base}/0/fence", {"move": "m", "force": True}, 400, "unknown keys"),
        ("POST", f"{base}/1/fence", {"move": "m"}, 409, "owned by pod 1"),
        ("POST", f"{base}/0/receive", {"move": "m", "source": "file:///etc"}, 400, "admin URL"),
        ("POST", f"{base}/0/receive", {"move": "m", "source": "http://x"}, 409, "this pod owns"),
        ("POST", f"{base}/0/release", {"move": "m"}, 409, "still owns"),
        ("GET", f"{base}/0/files?move=m", None, 409, "not fenced"),
        ("PUT", f"{tc0.admin_url()}/admin/v1/placement", {"kind": "store-shards"}, 400, "epoch"),
    ]
    for method, url, body, expected, words in cases:
        status, answer = await call(method, url, body)
        assert status == expected and words in answer["error"], (method, url, status, answer)
    status, answer = await call("GET", f"{base}/0/files?move=m", token=None)
    assert status == 401  # the files are the coordinator's whole log: the token is needed
    status, answer = await call("POST", f"{base}/0/fence", {"move": "m"}, token=None)
    assert status == 401
    status, answer = await call("GET", f"{base}/0/files?move=m&path=placement.json", None)
    assert status == 409  # not fenced; fenced, only the manifest's paths are served
    status, manifest = await call("POST", f"{base}/0/fence", {"move": "m"})
    assert status == 200 and manifest["files"], manifest
    status, answer = await call("GET", f"{base}/0/files?move=m&path=placement.json", None)
    assert status == 404 and "not a file of coordinator 0" in answer["error"]
    status, answer = await call("GET", f"{base}/0/files?move=m&path=../../etc/passwd", None)
    assert status == 404


async def test_transactions_keep_committing_exactly_once_while_their_coordinator_id_moves(
    pods: Callable[..., ServePod],
) -> None:
    """Workers run consume-process-produce transactions on both coordinator ids while id 1 moves from
    tc-1 to tc-0: no commit is lost, none applied twice, and the workers see no error."""
    store = pods("pas-0", "store")
    tc0 = pods("tc-0", "coordinator", extra=PLACED)
    tc1 = pods("tc-1", "coordinator", extra=PLACED)
    tcs = [tc0, tc1]
    for tc in tcs:
        await put(tc, record(2, [0, 1], tcs))
    jobs = 120
    async with Client(coordinators=[tc0.listen, tc1.listen], stores=[store.listen]) as client:
        feeder = await client.create_producer(IN)
        for i in range(jobs):
            await feeder.send(f"job-{i}".encode())
        work = await client.subscribe(IN, "work", receiver_queue_size=8)
        out = await client.create_producer(OUT)
        verify = await client.subscribe(OUT, "verify")
        done: list[bytes] = []
        by_coordinator = {0: 0, 1: 0}

        async def worker() -> None:
            while len(done) < jobs:
                try:
                    job = await work.receive(timeout=1)
                except TimeoutError:
                    continue
                txn = await client.new_transaction(timeout_ms=60_000)
                await out.send(job.data.replace(b"job", b"result"), txn=txn)
                await work.acknowledge(job, txn=txn)
                await txn.commit()
                by_coordinator[txn.txn_id.most] += 1
                done.append(job.data)

        workers = [asyncio.ensure_future(worker()) for _ in range(4)]

        async def progressed(count: int) -> bool:
            for w in workers:
                if w.done():
                    w.result()  # a worker's error fails the test here
            return len(done) >= count

        await wait_until(lambda: progressed(20), 60, "transactions before the move")
        status, manifest = await verb(tc1, 1, "fence", {"move": "load"})
        assert status == 200, manifest
        status, received = await verb(tc0, 1, "receive", {"move": "load", "source": tc1.admin_url()})
        assert status == 200, received
        for tc in (tc0, tc1):
            await put(tc, record(3, [0, 0], tcs))
        moved_at = len(done)
        await wait_until(lambda: progressed(min(jobs, moved_at + 20)), 60, "transactions after the move")
        await asyncio.wait_for(asyncio.gather(*workers), 120)
        assert (await verb(tc1, 1, "release", {"move": "load"}))[0] == 200
        results: dict[bytes, int] = {}
        while len(results) < jobs:
            message = await verify.receive(timeout=30)
            results[message.data] = results.get(message.data, 0) + 1
            await verify.acknowledge(message)
    assert sorted(done) == sorted(f"job-{i}".encode() for i in range(jobs))  # each job committed once
    assert set(results) == {f"result-{i}".encode() for i in range(jobs)}
    assert all(count == 1 for count in results.values()), results
    assert by_coordinator[1] > 0 and by_coordinator[0] > 0
