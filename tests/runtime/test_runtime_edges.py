"""The edges of a pod: malformed frames refuse only their own connection; the admin API's token rule
and document shapes; format level 1 refuses batching."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.frames import FrameDecoder, encode_frame
from txnkeeper.protocol.rpc import split_address

pytestmark = pytest.mark.timeout(120)


async def _refused(address: str, raw: bytes) -> api.Command:
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)  # read to EOF: the server must close
    writer.close()
    (command,) = FrameDecoder().feed(data)
    return command


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff", api.MALFORMED_FRAME),
        (struct.pack(">I", 0), api.MALFORMED_FRAME),
        (struct.pack(">I", 1 << 30), api.FRAME_TOO_LARGE),
    ],
    ids=["garbage", "empty-command", "oversized"],
)
async def test_bad_frame_gets_error_and_close_others_unaffected(
    cluster: tuple[ServePod, ServePod], raw: bytes, code: int
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer("persistent://t/ns/edge")
        await producer.send(b"before")
        for address in (tc.listen, store.listen):
            error = await _refused(address, raw)
            assert error.WhichOneof("body") == "error" and error.error.code == code, error
        # The healthy connection (already open) and new ones keep working.
        await producer.send(b"after")
        txn = await client.new_transaction()
        await txn.commit()


async def test_unknown_request_is_an_error_not_a_disconnect(cluster: tuple[ServePod, ServePod]) -> None:
    tc, _ = cluster
    host, port = split_address(tc.listen)
    reader, writer = await asyncio.open_connection(host, port)
    # A response-only message sent as a request, then a valid request on the same connection.
    writer.write(encode_frame(api.Command(request_id=7, success=api.Success())))
    writer.write(encode_frame(api.Command(request_id=8, new_txn=api.NewTxn(timeout_ms=0))))
    writer.write(encode_frame(api.Command(request_id=9, new_txn=api.NewTxn(timeout_ms=1000))))
    await writer.drain()
    decoder = FrameDecoder()
    responses: dict[int, api.Command] = {}
    while len(responses) < 3:
        for command in decoder.feed(await asyncio.wait_for(reader.read(4096), 10)):
            responses[command.request_id] = command
    writer.close()
    assert responses[7].error.code == api.BAD_REQUEST
    assert responses[8].error.code == api.BAD_REQUEST and "timeout" in responses[8].error.message
    assert responses[9].WhichOneof("body") == "new_txn_response"


def test_mutating_admin_calls_need_the_token_and_change_nothing_without_it(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, _ = cluster
    url = tc.admin_url()
    status, before = http("GET", f"{url}/admin/v3/transactions/coordinatorStats")
    assert status == 200 and before["coordinatorArray"][0]["transactionLogBatchedWriteStat"]["batchEnabled"]
    change = {"coordinator": {"batchEnabled": False}}
    for token in (None, "wrong-token"):
        status, body = http("POST", f"{url}/admin/v1/batch-log", change, token=token)
        assert status == 401 and "error" in body
        status, body = http("POST", f"{url}/admin/v1/stores/rollover", {}, token=token)
        assert status == 401
    status, after = http("GET", f"{url}/admin/v3/transactions/coordinatorStats")
    assert after == before
    status, ledgers = http("GET", f"{url}/admin/v1/stores/ledgers")
    assert ledgers["stores"][0]["ledgers"] == [ledgers["stores"][0]["currentLedger"]]  # no rollover happened
    status, body = http("POST", f"{url}/admin/v1/batch-log", change, token=TOKEN)
    assert status == 200
    assert body["coordinatorArray"][0]["transactionLogBatchedWriteStat"]["batchEnabled"] is False
    status, body = http(
        "POST", f"{url}/admin/v1/batch-log", {"coordinator": {"batchedWriteMaxRecords": 0}}, TOKEN
    )
    assert status == 400 and "maxRecords" in body["error"]


async def test_admin_documents_have_the_pulsar_shapes(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe("persistent://t/ns/a", "s1")
        await (await client.create_producer("persistent://t/ns/a")).send(b"x")
        txn = await client.new_transaction()
        await consumer.acknowledge(await consumer.receive(timeout=10), txn=txn)
        await txn.commit()
    status, info = http("GET", f"{store.admin_url()}/admin/v1/info")
    assert info == {"pod": "pas-0", "role": "store", "release": "2.0.0", "formatLevel": 2}
    status, stats = http("GET", f"{store.admin_url()}/admin/v3/transactions/pendingAckStats")
    assert stats["subscriptionArray"] == [
        {
            "topic": "persistent://t/ns/a",
            "subscription": "s1",
            "transactionPendingAckBatchedWriteStat": {
                "batchEnabled": True,
                "batchedWriteMaxRecords": 512,
                "batchedWriteMaxSize": 4194304,
                "batchedWriteMaxDelayInMillis": 1,
                "batchedWriteFlushMode": "adaptive",
            },
        }
    ]
    status, stores = http("GET", f"{store.admin_url()}/admin/v1/stores")
    assert stores["stores"] == [
        {
            "kind": "pendingack",
            "name": "persistent://t/ns/a-s1__transaction_pending_ack",
            "topic": "persistent://t/ns/a",
            "subscription": "s1",
        }
    ]
    query = "topic=persistent://t/ns/a&subscription=s1"
    status, internal = http(
        "GET", f"{store.admin_url()}/admin/v3/transactions/pendingAckInternalStats?{query}"
    )
    assert status == 200
    stats_doc = internal["pendingAckLogStats"]
    assert stats_doc["managedLedgerName"] == "persistent://t/ns/a-s1__transaction_pending_ack"
    assert {"entriesAddedCounter", "ledgers", "cursors", "lastConfirmedEntry"} <= set(
        stats_doc["managedLedgerInternalStats"]
    )
    status, internal = http("GET", f"{tc.admin_url()}/admin/v3/transactions/coordinatorInternalStats/0")
    assert internal["transactionLogStats"]["managedLedgerName"] == "__transaction_log_0"
    status, _missing = http("GET", f"{tc.admin_url()}/admin/v3/transactions/coordinatorInternalStats/9")
    assert status == 404
    before = http("GET", f"{tc.admin_url()}/admin/v1/stores/ledgers")[1]["stores"][0]["currentLedger"]
    status, rolled = http("POST", f"{tc.admin_url()}/admin/v1/stores/rollover", {}, token=TOKEN)
    assert rolled["stores"][0] == {
        "name": "__transaction_log_0",
        "kind": "txnlog",
        "lastBatchedLedger": before,
    }
    status, ledgers = http("GET", f"{tc.admin_url()}/admin/v1/stores/ledgers")
    assert ledgers["stores"][0]["currentLedger"] > before
    status, metrics = http("GET", f"{tc.admin_url()}/metrics")
    assert 'txnkeeper_coordinator_committed_transactions_total{coordinator_id="0"} 1.0' in metrics
    assert 'txnkeeper_coordinator_ending_transactions{coordinator_id="0"} 0.0' in metrics  # delivered
    assert "pulsar_txn_tc_bufferedwriter_batch_records" in metrics


async def test_a_topic_reports_the_txn_outcomes_it_keeps(cluster: tuple[ServePod, ServePod]) -> None:
    """A topic keeps the outcomes of the txns that wrote to it for a while (each holds memory: the
    aborted ones until their marker's ledger is trimmed, the committed ones until their deadline +
    20 s): the gauge an operator alerts on counts them."""
    tc, store = cluster
    topic = "persistent://t/ns/kept-outcomes"
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(topic)
        for commit in (True, True, False):
            txn = await client.new_transaction()
            await producer.send(b"x", txn=txn)
            await (txn.commit() if commit else txn.abort())
    status, metrics = http("GET", f"{store.admin_url()}/metrics")
    assert status == 200
    assert f'txnkeeper_topic_kept_txn_outcomes{{topic="{topic}"}} 3.0' in metrics
    assert f'txnkeeper_topic_ongoing_transactions{{topic="{topic}"}} 0.0' in metrics


def test_format_level_one_refuses_batching(pods: object) -> None:
    make = pods
    assert callable(make)
    old: ServePod = make("tc-old", "coordinator", release="1.4.2")
    status, info = http("GET", f"{old.admin_url()}/admin/v1/info")
    assert info["formatLevel"] == 1 and info["release"] == "1.4.2"
    status, body = http(
        "POST", f"{old.admin_url()}/admin/v1/batch-log", {"coordinator": {"batchEnabled": True}}, TOKEN
    )
    assert status == 409 and "format level 1" in body["error"]
    status, stats = http("GET", f"{old.admin_url()}/admin/v3/transactions/coordinatorStats")
    assert stats["coordinatorArray"][0]["transactionLogBatchedWriteStat"]["batchEnabled"] is False


def _admin_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_admin_cli_verbs_and_sigterm_exit(cluster: tuple[ServePod, ServePod], tmp_path: Path) -> None:
    tc, _ = cluster
    url = tc.admin_url()
    stats = _admin_cli("--url", url, "coordinator-stats")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["coordinatorArray"][0]["coordinatorId"] == 0
    refused = _admin_cli("--url", url, "batch-log", "set", "--enabled", "false")
    assert refused.returncode == 1 and "401" in refused.stderr
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)  # the CLI refuses a token file others can read
    applied = _admin_cli(
        "--url",
        url,
        "--token-file",
        str(token),
        "batch-log",
        "set",
        "--target",
        "coordinator",
        "--enabled",
        "false",
        "--max-records",
        "64",
    )
    assert applied.returncode == 0, applied.stderr
    got = json.loads(_admin_cli("--url", url, "batch-log", "get").stdout)
    assert got["coordinator"]["batchEnabled"] is False and got["coordinator"]["batchedWriteMaxRecords"] == 64
    internal = _admin_cli("--url", url, "coordinator-internal-stats", "--coordinator-id", "0")
    assert json.loads(internal.stdout)["transactionLogStats"]["managedLedgerName"] == "__transaction_log_0"
    assert tc.kill(signal.SIGTERM) == 0  # graceful close exits cleanly
