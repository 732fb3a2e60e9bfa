"""Offload through a real store pod: the --config "offload" section, the admin verbs over HTTP and the
CLI, bad input as 400s, metrics, and read-through of offloaded ledgers by a real consumer.

Real ``txnkeeper serve`` processes (tests/runtime's ServePod) and a real filesystem tier.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# ServePod lives with the runtime tests (imported top-level there, as pytest's rootdir import does).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

TOPIC = "persistent://public/default/offloaded"


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[ServePod]]:
    started: list[ServePod] = []
    yield started
    for pod in started:
        pod.stop()


def start(started: list[ServePod], pod: ServePod) -> ServePod:
    started.append(pod)
    return pod.start()


def cli(store: ServePod, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "admin", "--url", store.admin_url(),
         "--token-file", str(store.token_file), "topics", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def api(
    store: ServePod, method: str, verb: str, topic: str | None = TOPIC, body: object = None
) -> tuple[int, Any]:
    query = "?" + urllib.parse.urlencode({"topic": topic}) if topic is not None else ""
    token = TOKEN if method != "GET" else None
    return http(method, f"{store.admin_url()}/admin/v1/topics/{verb}{query}", body, token)


async def produce(store: ServePod, tc: ServePod, count: int) -> None:
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(TOPIC)
        for i in range(count):
            await producer.send(f"m-{i}".encode())


async def consume(store: ServePod, tc: ServePod, count: int) -> list[bytes]:
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(TOPIC, "reader")
        return [(await consumer.receive(timeout=30)).data for _ in range(count)]


def test_offload_verbs_config_and_read_through_on_a_real_store_pod(
    tmp_path: Path, pods: list[ServePod]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    offload = {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": -1,  # manual only: this test drives every offload
        "managedLedgerOffloadDeletionLagMs": "0",  # Pulsar's properties give numbers as text
        "managedLedgerOffloadMaxBlockSizeInBytes": 4096,
    }
    tc = start(pods, ServePod(tmp_path, "tc-0", "coordinator"))
    store = start(pods, ServePod(tmp_path, "pas-0", "store", release="3.0.0", config={"offload": offload}))
    asyncio.run(produce(store, tc, 30))

    code, out, err = cli(store, "offload", TOPIC)
    assert code == 0, err
    result = json.loads(out)
    assert [s["status"] for s in result["offloaded"]] == ["Offloaded"]
    assert result["status"] == "SUCCESS" and result["lagBytes"] == 0 and result["mode"] == "streaming"
    code, out, err = cli(store, "offload-segments", TOPIC)
    assert code == 0, err
    (segment,) = json.loads(out)["segments"]
    assert segment["status"] == "Offloaded" and segment["begin"].endswith(":0")

    # A restart closes the ledger; the next offload pass deletes its local file (lag 0), and a
    # consumer then reads every message back from the tier.
    store.restart()
    status, doc = api(store, "POST", "offload", body={})
    assert status == 200, doc
    status, doc = api(store, "GET", "internal-stats")
    assert status == 200, doc
    flags = [ledger["offloaded"] for ledger in doc["managedLedgerInternalStats"]["ledgers"]]
    assert flags[0] is True, doc
    assert asyncio.run(consume(store, tc, 30)) == [f"m-{i}".encode() for i in range(30)]

    metrics = http("GET", f"{store.admin_url()}/metrics")[1]
    assert 'brk_ledgeroffloader_offload_error_total{namespace="public/default",topic="' + TOPIC in metrics
    assert (
        f'txnkeeper_offload_segments{{namespace="public/default",status="Offloaded",topic="{TOPIC}"}}'
        in metrics
    )
    assert "brk_ledgeroffloader_read_ledger_latency_count" in metrics

    # Per-topic policies over the pod's config, live; every bad input is a 400 naming the problem.
    code, out, err = cli(
        store, "offload-policies", "set", TOPIC, "offloadMode=ledger", "maxOffloadSegmentSizeInBytes=1024"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["override"] == {"offloadMode": "ledger", "maxOffloadSegmentSizeInBytes": 1024}
    assert doc["effective"]["fileSystemURI"] == str(tier) and doc["effective"]["offloadMode"] == "ledger"
    assert api(store, "GET", "offload-status")[1]["mode"] == "ledger"
    for body, expected in (
        ({"bogusKey": 1}, "unknown offload setting 'bogusKey'"),
        ({"maxOffloadSegmentSizeInBytes": "abc"}, "is not an integer"),
        ({"offloadMode": "sideways"}, "offloadMode='sideways' is not supported"),
        ({"managedLedgerOffloadDeletionLagMs": True}, "must be a number"),
        ({"fileSystemURI": str(tmp_path / "elsewhere")}, "cannot change on a live managed ledger"),
        ({}, "has no offload setting"),
    ):
        status, doc = api(store, "POST", "offload-policies", body=body)
        assert status in (400, 409) and expected in doc["error"], (body, doc)
    assert api(store, "GET", "offload-status", topic=None) == (
        400,
        {"error": "query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)"},
    )
    status, doc = api(store, "GET", "offload-status", topic="persistent://public/default/none")
    assert status == 404 and "not on this pod" in doc["error"]
    code, _, err = cli(store, "offload-policies", "set", TOPIC, "novalue")
    assert code == 2 and "KEY=VALUE" in err

    # Overrides survive a restart; remove reverts to the pod's settings.
    store.restart()
    assert api(store, "GET", "offload-policies")[1]["override"]["offloadMode"] == "ledger"
    code, out, err = cli(store, "offload-policies", "remove", TOPIC)
    assert code == 0 and json.loads(out)["override"] == {}, err
    assert api(store, "GET", "offload-status")[1]["mode"] == "streaming"
    status, doc = api(store, "DELETE", "offload-policies")
    assert status == 404 and "no offload-policies override" in doc["error"]


def test_a_bad_offload_section_stops_serve_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"offload": {"managedLedgerOffloadDriver": "filesystem"}}))
    done = subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "serve", "--role", "store", "--data-dir", str(tmp_path / "d"),
         "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "fileSystemURI (the offload directory) is required" in done.stderr
