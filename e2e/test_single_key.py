"""PDP-44 single-key transactions through the operator on the cluster: a PendingAckStore at 3.x with
spec.singleKeyTransactions enabled; a single-key writer commits blocks of events to one topic while the
store pod that owns the topic is deleted and recreated; afterwards every acknowledged block is read back
exactly once, in order, and nothing else of that writer is there.

The writer speaks the wire protocol itself (SetupAppend, AppendBlock chunks, AppendBlockEnd, as
tests/runtime/srk_wire.py does) because the client library's single-key writer
(``Client.create_single_key_writer``) is not in this tree yet. After a broken connection it reconnects,
and SetupAppend's last event number says which blocks the store committed: an acknowledged block must
never be missing (a lost commit), a committed block whose answer was lost is not sent again.

It runs from the test process: pods are reached at their pod IPs on the local cluster and through a
``kubectl port-forward`` on kind (``Cluster.endpoint``), and topics are placed on store pods by the
client's hash over the pods in ordinal order, so the topic below is owned by ``acks-1``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from e2e.helpers import Cluster, pod_ready, wait_for
from e2e.test_operator import (  # noqa: F401 - `operator` is a fixture used by name
    PAS,
    apply,
    condition,
    get_cr,
    operator,
    settled_at,
    summary,
    wait_cr,
)
from txnkeeper.contract.formats import Feature, has_feature

Obj = dict[str, Any]
VERSION = "3.0.0"
REPLICAS = 2
OWNER = 1  # the ordinal of the store pod that owns TOPIC (and is deleted)
TOPIC = next(
    t
    for t in (f"persistent://public/default/single-key-{i}" for i in range(100))
    if zlib.crc32(t.encode()) % REPLICAS == OWNER
)
WRITER = "e2e-writer"
EVENTS_PER_BLOCK = 16
BLOCKS_BEFORE_DELETE = 20
BLOCKS_AFTER_RESTART = 10
MAX_BLOCKS = 5000  # the writer never runs away if the restart is never observed
SENTINEL = b"end-of-single-key-run"
RETRY_S = 0.5  # backoff between reconnection attempts while the pod is away (not a synchronisation)
DEADLINE_S = 900.0

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("txnkeeper.protocol.blocks") is None
    or not has_feature(VERSION, Feature.SINGLE_KEY_TRANSACTIONS),
    reason=f"this runtime has no single-key transactions at {VERSION} (txnkeeper.protocol.blocks and the "
    "'single-key-transactions' feature, issue 14); there is nothing to test",
)


def store_manifest() -> str:
    return f"""
apiVersion: txnkeeper.io/v1
kind: PendingAckStore
metadata: {{name: acks}}
spec:
  version: "{VERSION}"
  replicas: {REPLICAS}
  batchedWrite: {{enabled: false}}
  storage: {{size: 128Mi}}
  singleKeyTransactions: {{enabled: true, maxBlockBytes: 1048576}}
"""


@contextmanager
def pod_address(cluster: Cluster, ns: str, pod: str) -> Iterator[str | None]:
    """The pod's client port from this process, or None while the pod is not Ready (gone, starting)."""
    obj = cluster.pod(ns, pod)
    if obj is None or not pod_ready(obj) or obj["metadata"].get("deletionTimestamp"):
        yield None
        return
    with cluster.endpoint(ns, pod, 6650) as address:
        yield address


@dataclass
class WriterRun:
    """What the writer observed; read by the test thread while the writer thread runs."""

    acked_last: int = -1  # highest event number the store acknowledged (DataAppended or SetupAppend)
    blocks_acked: int = 0
    blocks_after_restart: int = 0
    reconnects: int = 0
    restarted: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    log: list[str] = field(default_factory=list)


async def _request(conn: Any, command: Any) -> Any:
    return await conn.request(command, 30.0)


async def _append(conn: Any, first: int) -> Any:
    """One block of EVENTS_PER_BLOCK events starting at event number ``first``; its DataAppended."""
    from txnkeeper.pb import txnkeeper_api_pb2 as api
    from txnkeeper.protocol.blocks import chunks, encode_events

    block = encode_events(f"{WRITER}:{n}".encode() for n in range(first, first + EVENTS_PER_BLOCK))
    pending = []
    for piece in chunks(block.data, 4096):
        command = api.Command()
        command.append_block.writer_id = WRITER
        command.append_block.data = piece
        pending.append(conn.request(command))
    end = api.Command()
    end.append_block_end.writer_id = WRITER
    end.append_block_end.first_event_number = first
    end.append_block_end.event_count = block.event_count
    end.append_block_end.total_bytes = block.total_bytes
    end.append_block_end.crc = block.crc
    end.append_block_end.key = "k"
    try:
        return (await _request(conn, end)).data_appended
    finally:
        for future in pending:  # an accepted chunk is never answered; a refused one's error is the End's
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()


async def write(cluster: Cluster, ns: str, run: WriterRun) -> None:
    from txnkeeper.errors import ServiceError
    from txnkeeper.pb import txnkeeper_api_pb2 as api
    from txnkeeper.protocol.rpc import connect

    fatal = {api.WRITER_FENCED, api.WRITER_STATE_LOST, api.EVENT_NUMBER_GAP}
    deadline = time.monotonic() + DEADLINE_S
    next_first = 0
    while run.blocks_after_restart < BLOCKS_AFTER_RESTART and run.blocks_acked < MAX_BLOCKS:
        assert time.monotonic() < deadline, f"writer not done within {DEADLINE_S}s: {run.log[-5:]}"
        try:
            with pod_address(cluster, ns, f"acks-{OWNER}") as address:
                if address is None:
                    raise ConnectionError(f"acks-{OWNER} is not Ready")
                conn = await connect(address)
                try:
                    setup = api.Command()
                    setup.setup_append.topic = TOPIC
                    setup.setup_append.writer_id = WRITER
                    last = (await _request(conn, setup)).append_setup.last_event_number
                    # The store's word on what it committed: never less than it acknowledged.
                    assert last >= run.acked_last, (
                        f"acknowledged events up to {run.acked_last} but the store's writer state says {last}"
                    )
                    if last > run.acked_last:
                        run.log.append(f"committed up to {last} without an answer; not resent")
                        run.acked_last = last
                        next_first = last + 1
                    while run.blocks_after_restart < BLOCKS_AFTER_RESTART and run.blocks_acked < MAX_BLOCKS:
                        answer = await _append(conn, next_first)
                        assert answer.event_number == next_first + EVENTS_PER_BLOCK - 1, answer
                        assert not answer.duplicate, f"block at {next_first} answered as a duplicate"
                        run.acked_last = answer.event_number
                        next_first = answer.event_number + 1
                        run.blocks_acked += 1
                        if run.restarted.is_set():
                            run.blocks_after_restart += 1
                finally:
                    conn.close()
        except ServiceError as exc:
            if exc.code in fatal:
                raise
            run.log.append(f"retry after {exc}")
        except (OSError, TimeoutError) as exc:  # ConnectionError is an OSError
            run.log.append(f"retry after {type(exc).__name__}: {exc}")
        else:
            continue
        run.reconnects += 1
        await asyncio.sleep(RETRY_S)


def _run_writer(cluster: Cluster, ns: str, run: WriterRun) -> None:
    try:
        asyncio.run(write(cluster, ns, run))
    except BaseException as exc:  # handed to the test thread
        run.failure = exc


async def read_back(cluster: Cluster, ns: str) -> list[bytes]:
    """Every message of TOPIC up to the sentinel, through the real client's consumer."""
    from txnkeeper.client import Client

    with (
        cluster.endpoint(ns, "acks-0", 6650) as first,
        cluster.endpoint(ns, "acks-1", 6650) as second,
    ):
        async with Client(coordinators=[], stores=[first, second]) as client:
            assert client.store_for(TOPIC) == [first, second][OWNER]
            await (await client.create_producer(TOPIC)).send(SENTINEL)
            consumer = await client.subscribe(TOPIC, "single-key-audit")
            got: list[bytes] = []
            while True:
                message = await consumer.receive(timeout=60)
                if message.data == SENTINEL:
                    return got
                got.append(message.data)


async def subscribe_first(cluster: Cluster, ns: str) -> None:
    """Create the audit subscription before anything is written, so it sees every event."""
    from txnkeeper.client import Client

    with cluster.endpoint(ns, f"acks-{OWNER}", 6650) as address:
        stores = [address] * REPLICAS  # only the owner is used: the hash picks index OWNER
        async with Client(coordinators=[], stores=stores) as client:
            await (await client.subscribe(TOPIC, "single-key-audit")).close()


def _pod_uid(cluster: Cluster, ns: str, name: str) -> str | None:
    obj = cluster.pod(ns, name)
    return None if obj is None else str(obj["metadata"]["uid"])


@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("operator")
def test_single_key_blocks_survive_a_store_pod_deletion_exactly_once(
    cluster: Cluster, namespace: str
) -> None:
    ns = namespace
    apply(cluster, ns, store_manifest())
    ready = wait_cr(cluster, ns, PAS, "acks", settled_at(VERSION, "Disabled"), f"Ready at {VERSION}", 300)
    assert condition(ready, "FeaturesSupported").get("status") == "True", summary(ready)
    asyncio.run(subscribe_first(cluster, ns))

    run = WriterRun()
    writer = threading.Thread(target=_run_writer, args=(cluster, ns, run), name="single-key-writer")
    writer.start()
    try:
        wait_for(
            lambda: run.failure is not None or run.blocks_acked >= BLOCKS_BEFORE_DELETE,
            f"{BLOCKS_BEFORE_DELETE} blocks acknowledged",
            300,
        )
        assert run.failure is None, f"writer failed before the deletion: {run.failure!r} {run.log[-5:]}"
        old_uid = _pod_uid(cluster, ns, f"acks-{OWNER}")
        cluster.core.delete_namespaced_pod(f"acks-{OWNER}", ns)

        def back() -> bool:
            obj = cluster.pod(ns, f"acks-{OWNER}")
            return obj is not None and obj["metadata"]["uid"] != old_uid and pod_ready(obj)

        wait_for(back, f"acks-{OWNER} recreated and Ready", 300)
        run.restarted.set()
        wait_for(lambda: not writer.is_alive(), "the writer to finish", DEADLINE_S)
    finally:
        run.restarted.set()  # lets the writer finish if the test failed meanwhile
        writer.join(DEADLINE_S)
    assert run.failure is None, f"writer failed: {run.failure!r}; last log: {run.log[-10:]}"
    # The old process is gone, so the blocks written after the restart went over a new connection.
    assert run.reconnects >= 1 and run.blocks_after_restart >= BLOCKS_AFTER_RESTART, run.log[-10:]
    wait_cr(cluster, ns, PAS, "acks", settled_at(VERSION, "Disabled"), "Ready again", 300)

    got = asyncio.run(read_back(cluster, ns))
    expected = [f"{WRITER}:{n}".encode() for n in range(run.acked_last + 1)]
    duplicates = len(got) - len(set(got))
    missing = sorted(set(expected) - set(got), key=lambda b: int(b.split(b":")[1]))
    extra = sorted(set(got) - set(expected))
    assert not missing, f"{len(missing)} acknowledged events not read back, first {missing[:5]}"
    assert not extra, f"events never acknowledged were read: {extra[:5]}"
    assert duplicates == 0, f"{duplicates} events read more than once"
    assert got == expected, "events out of order"
    final = get_cr(cluster, ns, PAS, "acks")
    assert condition(final, "FeaturesSupported").get("status") == "True", summary(final)
