"""Hostile clients against real pods: they cannot wedge a topic with a made-up transaction, end a
transaction on a store, end or extend another client's transaction, create topics by ending
transactions on them, or run a pod out of memory or connections. Every refusal is an error frame with
a message saying what was wrong."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_pods import ServePod, coordinator_connection, pod_gauge
from runtime_waits import wait_until

from txnkeeper.client import Client
from txnkeeper.client.transaction import Transaction
from txnkeeper.errors import ServiceError
from txnkeeper.ledger.names import encode_name
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, load_cluster_secret
from txnkeeper.protocol.frames import FrameDecoder, encode_frame
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


async def test_a_batch_of_ends_answers_each_end_on_its_own(cluster: tuple[ServePod, ServePod]) -> None:
    """EndTxnsOnStore waits on all its ends' parts at once but answers each end with its own
    outcome: one refused at the call, one whose marker write is refused, one applied."""
    _, store = cluster
    topic = "persistent://t/ns/batched-ends"
    conn = await coordinator_connection(store)
    secret = _secret(store)
    deadline = 2**41
    aborted, committed = api.TxnId(most=0, least=515151), api.TxnId(most=0, least=525252)
    for txn_pb in (aborted, committed):  # a message each, so the partition holds both txns
        produce = api.Command(produce=api.Produce(topic=topic, payload=b"m", txn_id=txn_pb))
        secret.fill_ticket(produce.produce.ticket, TxnID(txn_pb.most, txn_pb.least), topic, "", deadline)
        await conn.request(produce, 10)

    def end(txn_pb: api.TxnId, action: int, topics: list[str]) -> api.EndTxnOnStore:
        return api.EndTxnOnStore(txn_id=txn_pb, action=action, topics=topics, deadline_ms=deadline)  # type: ignore[arg-type]

    first = api.EndTxnsOnStore(ends=[end(aborted, api.ABORT, [topic])])
    assert (
        list((await conn.request(api.Command(end_txns_on_store=first), 10)).end_txns_on_store_result.failed)
        == []
    )
    batch = api.EndTxnsOnStore(
        ends=[
            end(api.TxnId(most=0, least=535353), api.COMMIT, []),  # names nothing: refused at the call
            end(aborted, api.COMMIT, [topic]),  # ended the other way already
            end(committed, api.COMMIT, [topic]),
        ]
    )
    result = (await conn.request(api.Command(end_txns_on_store=batch), 10)).end_txns_on_store_result
    assert list(result.failed) == [0, 1]
    assert result.errors[0].code == api.BAD_REQUEST and "names no partition" in result.errors[0].message
    assert result.errors[1].code == api.INVALID_TXN_STATUS and "other way" in result.errors[1].message
    # The third end was applied: the txn is committed there, so aborting it now is refused.
    again = api.EndTxnsOnStore(ends=[end(committed, api.ABORT, [topic])])
    result = (await conn.request(api.Command(end_txns_on_store=again), 10)).end_txns_on_store_result
    assert list(result.failed) == [0] and "other way" in result.errors[0].message
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
    # Every connection here is still handshaking (no frame completed): room for all of them, so that
    # the pending-bytes budget alone decides which are closed (the handshake limits have their own
    # tests, test_handshake_limits.py).
    limits = ["--max-pending-bytes", str(budget), "--frame-timeout", "600", "--handshake-timeout", "600"]
    store = pods("pas-0", "store", extra=[*limits, "--max-handshaking-connections", "128"])
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
        return pod_gauge(store, "txnkeeper_server_pending_bytes") <= budget and (
            pod_gauge(store, "txnkeeper_server_closed_connections_total", 'reason="max_pending_bytes"')
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


async def _open_small_window(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection with a small receive buffer, so answers it does not read back up quickly."""
    host, port = split_address(address)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    return await asyncio.open_connection(sock=sock)


class _UnreadRequests:
    """Pipelines GetTxnStatus requests for made-up transactions and reads none of the answers."""

    def __init__(self, writer: asyncio.StreamWriter, limit: int) -> None:
        self.writer, self.limit, self.sent = writer, limit, 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self.sent < self.limit:
            batch = []
            for _ in range(1000):
                self.sent += 1
                command = api.Command(
                    request_id=self.sent,
                    get_txn_status=api.GetTxnStatus(txn_id=api.TxnId(most=0, least=self.sent)),
                )
                batch.append(encode_frame(command))
            self.writer.write(b"".join(batch))
            await self.writer.drain()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await self.task


def _server_receive_queue(server_port: int, client_port: int) -> int:
    """Bytes the server's end of a loopback connection has received but not read (/proc/net/tcp)."""
    local, remote = f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[1], 16)
    return 0


async def test_a_client_that_reads_no_answers_cannot_grow_the_server(pods: Callable[..., ServePod]) -> None:
    tc = pods("tc-0", "coordinator")
    reader, writer = await _open_small_window(tc.listen)
    server_port = split_address(tc.listen)[1]
    client_port = writer.get_extra_info("sockname")[1]
    baseline = tc.rss_bytes()
    # Unbounded, 2M answers of ~30 bytes would be ~60 MB held (plus the objects on the way) for a peer
    # that never reads them; the sender would finish.
    requests = _UnreadRequests(writer, limit=2_000_000)

    async def stopped_reading() -> bool:
        assert not requests.task.done(), f"the server read all {requests.sent} requests"
        return (
            pod_gauge(tc, "txnkeeper_server_write_paused_connections") == 1
            and _server_receive_queue(server_port, client_port) >= 256 * 1024
        )

    await wait_until(stopped_reading, 120, "the server to stop reading a connection whose peer reads nothing")
    grown = tc.rss_bytes() - baseline
    assert grown < 64 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
    await requests.stop()
    # Once the peer reads, every request it sent is answered, in order: nothing was dropped.
    decoder, answered = FrameDecoder(), 0
    while answered < requests.sent:
        data = await asyncio.wait_for(reader.read(1 << 20), 120)
        assert data, f"connection closed after {answered} of {requests.sent} answers"
        for command in decoder.feed(data):
            answered += 1
            assert command.request_id == answered and command.WhichOneof("body") == "txn_status", command
    assert pod_gauge(tc, "txnkeeper_server_write_paused_connections") == 0
    writer.close()


async def test_a_client_that_stays_unread_is_cut_after_the_write_timeout(
    pods: Callable[..., ServePod],
) -> None:
    tc = pods("tc-0", "coordinator", extra=["--write-timeout", "1"])
    _, writer = await _open_small_window(tc.listen)
    requests = _UnreadRequests(writer, limit=10_000_000)

    async def cut() -> bool:
        return pod_gauge(tc, "txnkeeper_server_closed_connections_total", 'reason="write_timeout"') >= 1

    await wait_until(cut, 120, "the server to abort a connection that reads none of its answers")
    await requests.stop()
    writer.close()
    assert "has not read its answers" in tc.log() and "write timeout 1s" in tc.log()
    assert pod_gauge(tc, "txnkeeper_server_write_paused_connections") == 0
    async with Client(coordinators=[tc.listen], stores=[]) as client:
        txn = await client.new_transaction(timeout_ms=60_000)  # the pod still serves
        await txn.abort()


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
    assert pod_gauge(store, "txnkeeper_server_closed_connections_total", 'reason="frame_timeout"') >= 1
    assert pod_gauge(store, "txnkeeper_server_closed_connections_total", 'reason="idle_timeout"') >= 1


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
    assert pod_gauge(store, "txnkeeper_server_refused_connections_total", 'reason="max_connections"') == 1
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
