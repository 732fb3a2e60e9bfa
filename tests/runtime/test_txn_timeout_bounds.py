"""Operators bound how long one transaction can hold a topic (issue 25 item 10).

A transaction's first message on a topic holds back everything after it from every subscription until
the transaction ends (Pulsar's transaction-buffer rule). Before, any client could begin a 24 h
transaction and hold a topic for 24 h. Now: a maximum transaction timeout per process and per
namespace or topic (a begin or registration asking for more is refused with BAD_REQUEST naming the
limit), an admin verb that aborts a transaction (``txnkeeper admin transactions abort TXNID``), and a
gauge of the oldest open transaction's age per topic on the store pods.
Real ``txnkeeper serve`` pods over real sockets; the CLI runs as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_pods import TOKEN, ServePod, http, pod_metric
from runtime_waits import wait_until

from txnkeeper.client import Client
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/held"
BATCH = {"enabled": True, "maxRecords": 512, "maxSizeBytes": 4194304, "maxDelayMillis": 1}


def _admin_cli(pod: ServePod, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "admin",
            "--url",
            pod.admin_url(),
            "--token-file",
            str(pod.token_file),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_begin_asking_for_more_than_the_maximum_is_refused(
    pods: Callable[..., ServePod],
) -> None:
    tc = pods("tc-0", "coordinator", config=BATCH)
    store = pods("pas-0", "store", config=BATCH)
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        with pytest.raises(ServiceError) as caught:
            await client.new_transaction(timeout_ms=24 * 3600 * 1000)  # what any client could ask
        error = caught.value
        assert error.code == api.BAD_REQUEST, error
        assert "86400000 ms" in str(error) and "maximum of 900000 ms" in str(error), error
        assert "--max-txn-timeout-ms" in str(error), error
        txn = await client.new_transaction(timeout_ms=900_000)  # at the maximum: accepted
        await txn.abort()


async def test_namespace_and_topic_maximums_refuse_longer_transactions_there(
    pods: Callable[..., ServePod],
) -> None:
    config: dict[str, Any] = {
        "batchedWrite": BATCH,
        "transactions": {
            "maxTimeoutMs": 600_000,
            "namespaces": {"t/strict": {"maxTimeoutMs": 60_000}},
            "topics": {"persistent://t/ns/tight": {"maxTimeoutMs": 20_000}},
        },
    }
    tc = pods("tc-0", "coordinator", config=config)
    store = pods("pas-0", "store", config=BATCH)
    strict, tight = "persistent://t/strict/orders", "persistent://t/ns/tight"
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        with pytest.raises(ServiceError) as caught:
            await client.new_transaction(timeout_ms=700_000)
        assert "maximum of 600000 ms" in str(caught.value), caught.value
        # Registered with the begin: refused before anything is written there.
        with pytest.raises(ServiceError) as caught:
            await client.new_transaction(timeout_ms=120_000, topics=[strict])
        assert caught.value.code == api.BAD_REQUEST, caught.value
        assert strict in str(caught.value) and "namespace t/strict" in str(caught.value), caught.value
        assert "60000 ms" in str(caught.value), caught.value
        # Registered at first use: the send fails, the transaction cannot commit, nothing is written.
        txn = await client.new_transaction(timeout_ms=30_000)
        producer = await client.create_producer(tight)
        with pytest.raises(ServiceError) as caught:
            await producer.send(b"too long for this topic", txn=txn)
        assert "maximum of 20000 ms" in str(caught.value) and tight in str(caught.value), caught.value
        await txn.abort()
        # Within every maximum: works.
        ok = await client.new_transaction(timeout_ms=20_000, topics=[tight, strict])
        await producer.send(b"fits", txn=ok)
        await ok.commit()
        consumer = await client.subscribe(tight, "reader")
        assert (await consumer.receive(timeout=20)).data == b"fits"


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"maxTimeoutMs": 0}, "maxTimeoutMs must be an integer in 1..86400000"),
        ({"maxTimeoutMs": 86_400_001}, "in 1..86400000"),
        ({"maxTimeoutMs": "900000"}, "must be an integer"),
        ({"maxTimeoutMs": True}, "must be an integer"),
        ({"maxTimeout": 5}, "unknown key(s) ['maxTimeout']"),
        ({"namespaces": {"t/ns": {"maxTimeoutMs": 1_000_000}}}, "above the process maximum of 900000 ms"),
        ({"namespaces": {"t": {"maxTimeoutMs": 5}}}, "namespace 't' is not TENANT/NAMESPACE"),
        ({"namespaces": {"t/ns": 5}}, "must be an object"),
        ({"topics": {"": {"maxTimeoutMs": 5}}}, "topic name '' must be 1..512 printable characters"),
        ({"topics": {"persistent://t/ns/x": {"maxTimeoutMs": 5, "other": 1}}}, "unknown key(s) ['other']"),
        ([], "must be an object"),
    ],
)
def test_bad_transaction_settings_stop_serve_naming_them(
    tmp_path: Path, section: object, fragment: str
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"transactions": section}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "serve",
            "--role",
            "coordinator",
            "--data-dir",
            str(tmp_path / "data"),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "transactions" in result.stderr and fragment in result.stderr, result.stderr
    assert not (tmp_path / "data").exists()


async def test_an_operator_aborts_a_transaction_that_holds_a_topic(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader")
        producer = await client.create_producer(TOPIC)
        long_txn = await client.new_transaction(timeout_ms=900_000)
        await producer.send(b"held by a long transaction", txn=long_txn)
        await producer.send(b"plain, after it")

        async def held_for_a_while() -> bool:
            age = pod_metric(store, "txnkeeper_topic_oldest_open_txn_age_seconds", f'topic="{TOPIC}"')
            return age is not None and age >= 1.0

        await wait_until(held_for_a_while, 30, "the oldest open transaction's age to show on the store")
        with pytest.raises(TimeoutError):
            await consumer.receive(timeout=0.5)  # the plain message waits behind the open transaction

        txn_id = f"({long_txn.txn_id.most},{long_txn.txn_id.least})"
        result = _admin_cli(tc, "transactions", "abort", txn_id)
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer == {"txnId": txn_id, "status": "ABORTED", "alreadyEnded": False}, answer

        assert (await consumer.receive(timeout=20)).data == b"plain, after it"
        assert pod_metric(store, "txnkeeper_topic_oldest_open_txn_age_seconds", f'topic="{TOPIC}"') == 0.0
        # The client learns why when it tries to commit.
        with pytest.raises(ServiceError) as caught:
            await long_txn.commit()
        assert "aborted by an admin request" in str(caught.value), caught.value
        # Again: idempotent, and says so.
        again = _admin_cli(tc, "transactions", "abort", f"{long_txn.txn_id.most}:{long_txn.txn_id.least}")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["alreadyEnded"] is True
    assert f"transaction {txn_id} aborted by an admin request" in tc.log()


async def test_an_admin_abort_refuses_a_committed_transaction(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        txn = await client.new_transaction(timeout_ms=60_000)
        await (await client.create_producer(TOPIC)).send(b"committed", txn=txn)
        await txn.commit()
    status, body = http(
        "POST",
        f"{tc.admin_url()}/admin/v3/transactions/abortTransaction/{txn.txn_id.most}/{txn.txn_id.least}",
        None,
        TOKEN,
    )
    assert status == 409 and "COMMITTED" in body["error"], body


# (path after /admin/v3/transactions/abortTransaction/, token, status, a fragment of the error)
HOSTILE_ABORTS: list[tuple[str, str | None, int, str]] = [
    ("0/1", None, 401, "Authorization"),
    ("0/1", "wrong-token", 401, "token"),
    ("0/999999", TOKEN, 404, "transaction (0,999999) not found"),
    ("7/1", TOKEN, 404, "coordinator 7 is not hosted on this pod"),
    ("abc/1", TOKEN, 400, "coordinator id must be"),
    ("0/abc", TOKEN, 400, "transaction sequence must be"),
    ("-1/1", TOKEN, 400, "coordinator id must be"),
    ("0/-1", TOKEN, 400, "transaction sequence must be"),
    ("0/1.5", TOKEN, 400, "transaction sequence must be"),
    ("0/+1", TOKEN, 400, "transaction sequence must be"),
    ("0/%D9%A1", TOKEN, 400, "transaction sequence must be"),  # an Arabic-Indic digit one
    ("%C2%B2/1", TOKEN, 400, "coordinator id must be"),  # superscript two
    ("0/18446744073709551616", TOKEN, 400, "transaction sequence must be"),  # 2**64
    ("0/" + "9" * 5000, TOKEN, 400, "transaction sequence must be"),
    ("0/%00", TOKEN, 400, "transaction sequence must be"),
    ("0", TOKEN, 404, "no admin API resource"),
    ("0/1/2", TOKEN, 404, "no admin API resource"),
    ("", TOKEN, 404, "no admin API resource"),
]


@pytest.mark.parametrize(("tail", "token", "status", "fragment"), HOSTILE_ABORTS)
def test_hostile_admin_aborts_are_refused_saying_why(
    cluster: tuple[ServePod, ServePod], tail: str, token: str | None, status: int, fragment: str
) -> None:
    tc, _ = cluster
    got, body = http("POST", f"{tc.admin_url()}/admin/v3/transactions/abortTransaction/{tail}", None, token)
    assert got == status, (got, body)
    assert isinstance(body, dict) and fragment in body["error"], body


def test_admin_abort_on_a_store_pod_and_with_get_are_refused(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    status, body = http(
        "POST", f"{store.admin_url()}/admin/v3/transactions/abortTransaction/0/1", None, TOKEN
    )
    assert status == 404 and "hosts no transaction coordinator" in body["error"], body
    request = urllib.request.Request(f"{tc.admin_url()}/admin/v3/transactions/abortTransaction/0/1")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 405


@pytest.mark.parametrize(
    ("txn_id", "fragment"),
    [
        ("abc", "not a transaction id"),
        ("(0,)", "not a transaction id"),
        ("0", "not a transaction id"),
        ("-1:5", "not a transaction id"),
        ("0:18446744073709551616", "out of range"),
        ("\u0660:\u0665", "not a transaction id"),  # Arabic-Indic digits
        ("0:5:6", "not a transaction id"),
        ("", "not a transaction id"),
    ],
)
def test_hostile_txn_ids_on_the_cli_are_refused_before_any_call(
    tmp_path: Path, txn_id: str, fragment: str
) -> None:
    # No pod at this URL: a refusal before any call cannot be a connection error.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnkeeper.cli",
            "admin",
            "--url",
            "http://127.0.0.1:9",
            "transactions",
            "abort",
            "--",
            txn_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result
    assert fragment in result.stderr and "(MOST,LEAST) or MOST:LEAST" in result.stderr, result.stderr
    assert "cannot reach" not in result.stderr
