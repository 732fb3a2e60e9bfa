"""Hostile clients against real pods: they cannot wedge a topic with a made-up transaction, end a
transaction on a store, end or extend another client's transaction, create topics by ending
transactions on them, or run a pod out of memory or connections. Every refusal is an error frame with
a message saying what was wrong."""

from __future__ import annotations

import asyncio
import re
import signal
import struct
from collections.abc import Callable

import pytest
from runtime_pods import ServePod, coordinator_connection, http
from runtime_waits import wait_until

from txnkeeper.client import Client
from txnkeeper.client.transaction import Transaction
from txnkeeper.errors import ServiceError
from txnkeeper.ledger.names import encode_name
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, load_cluster_secret
from txnkeeper.protocol.frames import FrameDecoder
from txnkeeper.protocol.rpc import RpcConnection, connect, split_address
from txnkeeper.txnid import TxnID

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/hostile"


async def _error_of(conn: RpcConnection, command: api.Command) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        await conn.request(command, 10)
    return caught.value


def _secret(pod: ServePod) -> ClusterSecret:
    secret = load_cluster_secret(pod.secret_file)
    assert secret is not None
    return secret


async def test_made_up_txn_cannot_wedge_a_topic(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader")
        raw = await connect(store.listen)
        made_up = api.Command(
            produce=api.Produce(topic=TOPIC, payload=b"wedge", txn_id=api.TxnId(most=0, least=987654))
        )
        error = await _error_of(raw, made_up)
        assert error.code == api.UNAUTHORIZED and "no ticket" in str(error), error
        # A forged ticket (right shape, wrong MAC) and a real ticket for another topic are refused too.
        made_up.produce.ticket.CopyFrom(api.TxnTicket(topic=TOPIC, deadline_ms=2**62, mac=b"\x00" * 32))
        error = await _error_of(raw, made_up)
        assert error.code == api.UNAUTHORIZED and "not issued" in str(error), error
        txn = await client.new_transaction(timeout_ms=30_000)
        other = api.TxnTicket()
        _secret(store).fill_ticket(other, txn.txn_id, TOPIC + "-other", "", 2**40)
        stolen = api.Command(
            produce=api.Produce(
                topic=TOPIC, payload=b"x", txn_id=api.TxnId(most=txn.txn_id.most, least=txn.txn_id.least)
            )
        )
        stolen.produce.ticket.CopyFrom(other)
        error = await _error_of(raw, stolen)
        assert error.code == api.UNAUTHORIZED and "ticket is for" in str(error), error
        raw.close()

        # Other transactions and plain messages still dispatch, in order.
        producer = await client.create_producer(TOPIC)
        await producer.send(b"in-txn", txn=txn)
        await txn.commit()
        await producer.send(b"plain")
        received = [(await consumer.receive(timeout=10)).data for _ in range(2)]
        assert received == [b"in-txn", b"plain"]


async def test_only_authenticated_coordinators_end_txns_on_a_store(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader")
        producer = await client.create_producer(TOPIC)
        txn = await client.new_transaction(timeout_ms=30_000)
        await producer.send(b"must-not-be-committed-by-a-client", txn=txn)
        txn_pb = api.TxnId(most=txn.txn_id.most, least=txn.txn_id.least)
        raw = await connect(store.listen)
        end = api.EndTxnOnStore(txn_id=txn_pb, action=api.COMMIT, topics=[TOPIC])
        for command in (
            api.Command(end_txn_on_store=end),
            api.Command(end_txns_on_store=api.EndTxnsOnStore(ends=[end])),
            api.Command(
                end_txn_on_partition=api.EndTxnOnPartition(topic=TOPIC, txn_id=txn_pb, action=api.COMMIT)
            ),
        ):
            error = await _error_of(raw, command)
            assert error.code == api.UNAUTHORIZED and "authenticated coordinator" in str(error), error
        # A wrong proof does not authenticate the connection.
        challenge = api.Command()
        challenge.auth_challenge.SetInParent()
        await raw.request(challenge, 10)
        error = await _error_of(raw, api.Command(authenticate=api.Authenticate(proof=b"guess")))
        assert error.code == api.UNAUTHORIZED and "proof" in str(error), error
        raw.close()

        await txn.abort()
        await producer.send(b"after")
        assert (await consumer.receive(timeout=10)).data == b"after"  # the aborted message never shows


async def test_end_on_unknown_topic_creates_nothing_and_fences_the_txn(
    cluster: tuple[ServePod, ServePod],
) -> None:
    _, store = cluster
    unknown = "persistent://t/ns/never-produced"
    conn = await coordinator_connection(store)
    txn = TxnID(0, 424242)
    txn_pb = api.TxnId(most=txn.most, least=txn.least)
    deadline = 2**41  # far ahead: the fence holds for the whole test
    end = api.EndTxnOnStore(
        txn_id=txn_pb,
        action=api.ABORT,
        topics=[unknown],
        subscriptions=[api.SubscriptionRef(topic=unknown, subscription="s")],
        deadline_ms=deadline,
    )
    answer = await conn.request(api.Command(end_txns_on_store=api.EndTxnsOnStore(ends=[end])), 10)
    assert list(answer.end_txns_on_store_result.failed) == []
    await conn.request(
        api.Command(
            end_txn_on_partition=api.EndTxnOnPartition(topic=unknown, txn_id=txn_pb, action=api.ABORT)
        ),
        10,
    )
    assert not (store.data_dir / "ledgers" / encode_name(unknown)).exists()
    # A zombie with a still-valid ticket cannot write into the txn after its end.
    produce = api.Command(produce=api.Produce(topic=unknown, payload=b"zombie", txn_id=txn_pb))
    _secret(store).fill_ticket(produce.produce.ticket, txn, unknown, "", deadline)
    error = await _error_of(conn, produce)
    assert error.code == api.INVALID_TXN_STATUS and "already ended" in str(error), error
    conn.close()


async def test_only_the_owner_ends_or_extends_its_txn_across_reconnects_and_restarts(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with (
        Client(coordinators=[tc.listen], stores=[store.listen]) as owner,
        Client(coordinators=[tc.listen], stores=[store.listen]) as intruder,
    ):
        consumer = await owner.subscribe(TOPIC, "reader")
        producer = await owner.create_producer(TOPIC)
        txn = await owner.new_transaction(timeout_ms=60_000)
        await producer.send(b"owned", txn=txn)
        txn_pb = api.TxnId(most=txn.txn_id.most, least=txn.txn_id.least)
        for token, why in ((b"", "no owner token"), (b"\x01" * 32, "not transaction")):
            for command in (
                api.Command(end_txn=api.EndTxn(txn_id=txn_pb, action=api.ABORT, owner_token=token)),
                api.Command(
                    add_to_txn=api.AddToTxn(
                        txn_id=txn_pb, topics=[TOPIC + "-x"], store_address=store.listen, owner_token=token
                    )
                ),
            ):
                with pytest.raises(ServiceError) as caught:
                    await intruder.connections.request(tc.listen, command)
                assert caught.value.code == api.UNAUTHORIZED and why in str(caught.value), caught.value
        assert await intruder.transaction_status(txn) == "OPEN"

        # The coordinator restarts (the owner's connection breaks): the owner still commits, from a
        # new connection, with the same token.
        tc.restart()
        async with Client(coordinators=[tc.listen], stores=[store.listen]) as reconnected:
            resumed = Transaction(reconnected.connections, txn.txn_id, tc.listen, txn.owner_token)
            await resumed.commit()
        assert (await consumer.receive(timeout=20)).data == b"owned"


async def test_without_a_cluster_secret_transactions_are_refused_naming_the_flag(
    pods: Callable[..., ServePod],
) -> None:
    tc = pods("tc-0", "coordinator", secret=False)
    store = pods("pas-0", "store", secret=False)
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        with pytest.raises(ServiceError) as caught:
            await client.new_transaction()
        assert caught.value.code == api.UNAUTHORIZED and "--cluster-secret-file" in str(caught.value)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"plain messages still work")
    assert "--cluster-secret-file" in tc.log()


# --- resource limits ---------------------------------------------------------------------------------
def _metric(pod: ServePod, name: str, labels: str = "") -> float:
    status, text = http("GET", f"{pod.admin_url()}/metrics")
    assert status == 200
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" ([0-9.e+]+)"
    found = re.search(r"^" + pattern + "$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def _open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = split_address(address)
    return await asyncio.open_connection(host, port)


async def _closed_with_error(reader: asyncio.StreamReader, within: float) -> api.Command:
    """Read to EOF (the server closes) and return the error frame it sent first."""
    data = await asyncio.wait_for(reader.read(), within)
    (command,) = FrameDecoder().feed(data)
    return command


async def test_partial_large_frames_do_not_grow_memory(pods: Callable[..., ServePod]) -> None:
    budget = 16 * 1024 * 1024
    store = pods("pas-0", "store", extra=["--max-pending-bytes", str(budget), "--frame-timeout", "600"])
    connections = 80
    frame = 5 * 1024 * 1024
    sent_per_connection = frame - 64 * 1024  # most of a maximum-size frame, never completed
    chunk = b"\x00" * (256 * 1024)
    baseline = store.rss_bytes()
    opened = [await _open_raw(store.listen) for _ in range(connections)]

    async def fill(writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(struct.pack(">I", frame))
            for _ in range(sent_per_connection // len(chunk)):
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass  # closed by the server for exceeding the budget: what is expected of most

    await asyncio.gather(*(fill(writer) for _, writer in opened))

    async def settled() -> bool:
        return _metric(store, "txnkeeper_server_pending_bytes") <= budget and (
            _metric(store, "txnkeeper_server_closed_connections_total", 'reason="max_pending_bytes"')
            >= connections - budget // sent_per_connection - 1
        )

    await wait_until(settled, 60, "the server to hold at most its pending-bytes budget")
    grown = store.rss_bytes() - baseline
    # Unbounded, 80 x ~5 MiB would be ~400 MB; bounded it is the 16 MiB budget plus allocator slack.
    # (Which connections were closed is judged from the server's counters: a peer still writing when
    # its connection is closed may see a reset before it reads the error frame.)
    assert grown < 150 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
    assert f"over its limit of {budget} (max pending bytes)" in store.log()
    for _, writer in opened:
        writer.close()
    # The pod still serves.
    async with Client(coordinators=[], stores=[store.listen]) as client:
        await (await client.create_producer(TOPIC)).send(b"still serving")


async def test_half_sent_frame_and_idle_connection_are_closed_consumers_stay(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=["--idle-timeout", "1", "--frame-timeout", "1"])
    async with Client(coordinators=[], stores=[store.listen]) as consumer_side:
        consumer = await consumer_side.subscribe(TOPIC, "reader")
        subscribed_at = asyncio.get_running_loop().time()
        slow_reader, slow_writer = await _open_raw(store.listen)
        slow_writer.write(struct.pack(">I", 1000) + b"\x00" * 10)  # a frame that never completes
        idle_reader, _ = await _open_raw(store.listen)
        slow = await _closed_with_error(slow_reader, 30)
        assert slow.error.code == api.RESOURCE_LIMIT and "frame timeout" in slow.error.message, slow
        idle = await _closed_with_error(idle_reader, 30)
        assert idle.error.code == api.RESOURCE_LIMIT and "idle timeout" in idle.error.message, idle

        async def idle_long_enough() -> bool:
            return asyncio.get_running_loop().time() - subscribed_at > 3

        await wait_until(idle_long_enough, 10, "the consumer's connection to be idle past the timeout")
        async with Client(coordinators=[], stores=[store.listen]) as producer_side:
            await (await producer_side.create_producer(TOPIC)).send(b"to a quiet consumer")
        assert (await consumer.receive(timeout=10)).data == b"to a quiet consumer"
    assert _metric(store, "txnkeeper_server_closed_connections_total", 'reason="frame_timeout"') >= 1
    assert _metric(store, "txnkeeper_server_closed_connections_total", 'reason="idle_timeout"') >= 1


async def test_a_connection_waiting_for_an_answer_is_not_idle(pods: Callable[..., ServePod]) -> None:
    tc = pods("tc-0", "coordinator", extra=["--idle-timeout", "1"])
    store = pods("pas-0", "store")
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        txn = await client.new_transaction(timeout_ms=60_000)
        await (await client.create_producer(TOPIC)).send(b"slow commit", txn=txn)
        assert store.process is not None
        store.process.send_signal(signal.SIGSTOP)  # the commit waits for the frozen store
        try:
            commit = asyncio.ensure_future(txn.commit())
            started = asyncio.get_running_loop().time()

            async def waited_past_idle_timeout() -> bool:
                assert not commit.done(), commit  # not closed for idleness while it waits
                return asyncio.get_running_loop().time() - started > 3

            await wait_until(waited_past_idle_timeout, 20, "the commit to wait past the idle timeout")
        finally:
            store.process.send_signal(signal.SIGCONT)
        await asyncio.wait_for(commit, 30)
        assert txn.state == "COMMITTED"


async def test_connections_beyond_the_limit_are_refused(pods: Callable[..., ServePod]) -> None:
    store = pods("pas-0", "store", extra=["--max-connections", "3"])
    kept = [await connect(store.listen) for _ in range(3)]
    for conn in kept:  # each works
        await conn.request(api.Command(produce=api.Produce(topic=TOPIC, payload=b"ok")), 10)
    reader, _ = await _open_raw(store.listen)
    refused = await _closed_with_error(reader, 10)
    assert refused.error.code == api.RESOURCE_LIMIT and "max connections" in refused.error.message
    assert _metric(store, "txnkeeper_server_refused_connections_total", 'reason="max_connections"') == 1
    kept[0].close()

    async def slot_free() -> bool:
        try:
            conn = await connect(store.listen)
            await conn.request(api.Command(produce=api.Produce(topic=TOPIC, payload=b"again")), 5)
        except ServiceError:
            return False
        kept.append(conn)
        return True

    await wait_until(slot_free, 20, "a freed connection slot")
    for conn in kept:
        conn.close()
