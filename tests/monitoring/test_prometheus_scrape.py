"""A real Prometheus scrapes real txnkeeper pods: every dashboard query returns data, and an alert fires.

A coordinator pod and a store pod (`txnkeeper serve` processes: batched transaction log and pending-ack
stores, single-key transactions, offload to a filesystem tier) and the operator's metrics endpoint
(operator_exporter.py) are scraped every second by the Prometheus `make prometheus` builds, with the
chart's alert rules rendered by helm (TxnkeeperCoordinatorNotReady's `for:` shortened to 2s through the
chart's values). Prometheus is started before the workload so that every counter and histogram it reads
moved between two scrapes.

The dashboard check, per target of every panel, variables at "All":
- the query runs and returns at least one series (a misspelt label or a metric nobody exports returns
  none);
- every metric it names exists in the scrape (a query can return series for one of its metrics only);
- it returns at least one number that is not NaN, except for the queries in QUIET (empty: a panel
  whose events a run cannot cause would be listed there with why; its metrics must still be scraped).
The workload runs in two rounds around a restart of the store, so that every series has a sample before
it moves and round 1 reads from the tier; the check reads a scrape that started after the workload.
Then the coordinator pod is killed and the alert must fire for it (it did not before).
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from monitoring_tools import (
    HELM,
    HELM_MISSING,
    PROMETHEUS,
    PROMETHEUS_MISSING,
    PrometheusServer,
    dashboards,
    grafana_to_promql,
    metric_names,
    panel_queries,
    render_rules,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from pulsar_wire import free_port
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client

pytestmark = [
    pytest.mark.wallclock,
    pytest.mark.skipif(HELM is None, reason=HELM_MISSING),
    pytest.mark.skipif(PROMETHEUS is None, reason=PROMETHEUS_MISSING),
]

BATCH = {"enabled": True, "maxRecords": 512, "maxSizeBytes": 4194304, "maxDelayMillis": 1}
IN, OUT, SRK = (f"persistent://public/default/{name}" for name in ("in", "out", "srk"))
# (transactions, single-key blocks) per round. Round 1 does more than round 0: the store restarts in
# between, and a counter back at the value it had before the restart would look unchanged to rate().
ROUNDS = ((3, 1), (9, 2))
# Panels whose queries may divide rates of events this run does not cause (NaN: 0/0), with why. None:
# the run causes every event a panel divides by (the store's restart and a second offload make round
# 1's new subscription read from the tier); a panel added here must say which event it waits for.
QUIET: dict[str, str] = {}
RATE_INTERVAL = "2m"  # covers the whole run: every change of the workload is inside the window


def _wait(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what}")
        time.sleep(0.2)


def _value(prom: PrometheusServer, promql: str) -> float:
    result = prom.query(promql)
    return float(result[0]["value"][1]) if result else math.nan


async def _workload(tc: ServePod, store: ServePod, round_: int) -> None:
    """ROUNDS[round_] consume-process-produce transactions (every third aborted) and as many single-key
    blocks; in round 1 also a new subscription reading ``IN`` from its start (through the tier)."""
    transactions, blocks = ROUNDS[round_]
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(IN)
        for i in range(transactions):
            await producer.send((b"in-%d-%d-" % (round_, i)).ljust(1000, b"x"))  # blocks of 4 KiB fill
        consumer = await client.subscribe(IN, "app")
        out = await client.create_producer(OUT)
        for i in range(transactions):
            txn = await client.new_transaction(timeout_ms=30_000)
            message = await consumer.receive(timeout=10)
            await out.send(message.data.upper(), txn=txn)
            await consumer.acknowledge(message, txn=txn)
            await (txn.abort() if i % 3 == 0 else txn.commit())
        writer = await client.create_single_key_writer(SRK, "k", 30_000)
        for block in range(blocks):
            async with writer.begin_transaction() as srk_txn:
                srk_txn.write(b"event-%d-%d-a" % (round_, block))
                srk_txn.write(b"event-%d-%d-b" % (round_, block))
        if round_ == 1:
            audit = await client.subscribe(IN, "audit")
            first = await audit.receive(timeout=10)
            assert first.data.startswith(b"in-0-0-")  # round 0's ledger: only the tier holds it now


@pytest.fixture
def operator_exporter() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("operator_exporter.py"))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()  # printed once it listens
        assert port.isdigit(), f"operator exporter failed to start (exit {process.poll()})"
        yield f"127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait(10)


def _config(tc: ServePod, store: ServePod, operator: str) -> dict[str, Any]:
    """Static targets with the labels the chart's PodMonitors give (namespace, pod, role, resource)."""

    def target(pod: ServePod, role: str, resource: str) -> dict[str, Any]:
        labels = {"namespace": "test", "pod": pod.name, "role": role, "resource": resource}
        return {"targets": [pod.admin], "labels": labels}

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "txnkeeper-pods",
                "static_configs": [target(tc, "coordinator", "tc"), target(store, "store", "pas")],
            },
            {
                "job_name": "txnkeeper-operator",
                "honor_labels": True,
                "static_configs": [{"targets": [operator], "labels": {"role": "operator"}}],
            },
        ],
    }


def _offload(store: ServePod, *, new_segment: bool) -> None:
    status, doc = http("POST", f"{store.admin_url()}/admin/v1/topics/offload?topic={IN}", {}, TOKEN)
    assert status == 200 and bool(doc["offloaded"]) == new_segment, doc


def _scrape_after(prom: PrometheusServer, moment: float) -> None:
    """Wait until Prometheus scraped both pods after ``moment`` (Unix time): a scrape starts after it,
    so it sees everything done before it."""
    # timestamp() of a plain selector is the sample's (scrape's) time; of an expression it is "now".
    query = f"count(timestamp(txnkeeper_pod_ready) > {moment})"
    _wait(lambda: _value(prom, query) == 2, 30, f"both pods scraped after {moment}")


def _totals(prom: PrometheusServer) -> dict[str, float]:
    return {
        "committed": _value(prom, "sum(txnkeeper_coordinator_committed_transactions_total)"),
        "aborted": _value(prom, "sum(txnkeeper_coordinator_aborted_transactions_total)"),
        "offloaded": _value(prom, 'sum(txnkeeper_offload_segments{status="Offloaded"})'),
        "tier reads": _value(prom, "sum(brk_ledgeroffloader_read_ledger_latency_count)"),
    }


def _samples(prom: PrometheusServer, query: str) -> list[tuple[dict[str, str], list[str]]]:
    """What Prometheus holds of a query's metrics over the rate window (a few series), to say why."""
    found: list[tuple[dict[str, str], list[str]]] = []
    for metric in sorted(metric_names(query)):
        data = prom.api("query", query=f'{metric}{{le=~"|[+]Inf"}}[{RATE_INTERVAL}]')
        found += [(r["metric"], [v for _, v in r["values"]]) for r in data["result"][:4]]
    return found


def _check_dashboards(prom: PrometheusServer) -> None:
    scraped = set(prom.api("label/__name__/values"))
    problems: list[str] = []
    checked = 0
    for name, dashboard in dashboards().items():
        for variable in dashboard["templating"]["list"]:
            definition = variable.get("definition", "")
            if definition.startswith("label_values("):  # label_values(<metric selector>, <label>)
                selector, label = grafana_to_promql(definition[13:-1], RATE_INTERVAL).rsplit(", ", 1)
                if not any(label in s["metric"] for s in prom.query(selector)):
                    problems.append(f"{name}: variable {variable['name']}: no {label} on {selector}")
        for where, query in panel_queries(dashboard):
            checked += 1
            missing = metric_names(query) - scraped
            if missing:
                problems.append(f"{name}: {where}: metrics not scraped: {sorted(missing)}")
                continue
            result = prom.query(grafana_to_promql(query, RATE_INTERVAL))
            numbers = [float(s["value"][1]) for s in result if not math.isnan(float(s["value"][1]))]
            if not result:
                problems.append(f"{name}: {where}: no series for {query}")
            elif not numbers and where.split(" [")[0] not in QUIET:
                problems.append(f"{name}: {where}: only NaN for {query}; samples: {_samples(prom, query)}")
    assert checked >= 40, f"only {checked} dashboard queries found"
    assert problems == [], "\n".join(problems)


def _alert_states(prom: PrometheusServer, name: str) -> dict[str, str]:
    """pod -> state of the named alert's active instances."""
    return {
        a["labels"].get("pod", ""): a["state"]
        for a in prom.api("alerts")["alerts"]
        if a["labels"]["alertname"] == name
    }


def test_dashboards_have_data_and_the_coordinator_alert_fires(tmp_path: Path, operator_exporter: str) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    offload = {  # manual offloads only (the test drives them), 4 KiB blocks, no deletion lag
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": -1,
        "managedLedgerOffloadDeletionLagMs": 0,
        "managedLedgerOffloadMaxBlockSizeInBytes": 4096,
        "managedLedgerOffloadMinBlockSizeInBytes": 4096,
    }
    tc = ServePod(tmp_path, "tc-0", "coordinator", config=BATCH)
    store = ServePod(
        tmp_path,
        "pas-0",
        "store",
        release="3.0.0",
        config={**BATCH, "singleKeyTransactions": {"enabled": True}, "offload": offload},
        # A fixed admin port (the last --admin-listen wins): Prometheus's target outlives the restart.
        extra=["--admin-listen", f"127.0.0.1:{free_port()}"],
    )
    rules = render_rules("metrics.prometheusRule.alerts.coordinatorNotReadyFor=2s")
    prom: PrometheusServer | None = None
    try:
        tc.start()
        store.start()
        prom = PrometheusServer(
            tmp_path / "prometheus", _config(tc, store, operator_exporter), rules, free_port()
        )
        prom.wait_ready()
        _wait(lambda: _value(prom, "count(up == 1)") == 3, 30, "every target scraped")
        _wait(lambda: _value(prom, "count(txnkeeper_pod_ready == 1)") == 2, 30, "both pods ready in a scrape")

        # Round 0 creates every topic, subscription and writer (so every series has a sample before
        # round 1 moves it: rates and quantiles need a change between two samples of a series).
        asyncio.run(_workload(tc, store, 0))
        _offload(store, new_segment=True)
        _scrape_after(prom, time.time())
        assert _totals(prom) == {"committed": 2, "aborted": 1, "offloaded": 1, "tier reads": 0}
        # A graceful restart closes the ledger; the next offload deletes its local file, so round 1's
        # new subscription reads round 0's messages from the tier.
        store.stop()
        store.start()
        _offload(store, new_segment=False)
        asyncio.run(_workload(tc, store, 1))
        _scrape_after(prom, time.time())
        totals = _totals(prom)
        assert (totals["committed"], totals["aborted"], totals["offloaded"]) == (8, 4, 1), totals
        assert totals["tier reads"] > 0, totals
        _check_dashboards(prom)

        assert _alert_states(prom, "TxnkeeperCoordinatorNotReady") == {}
        tc.kill()
        _wait(
            lambda: _alert_states(prom, "TxnkeeperCoordinatorNotReady") == {"tc-0": "firing"},
            30,
            "TxnkeeperCoordinatorNotReady firing for tc-0",
        )
    except BaseException:
        if prom is not None:
            print(prom.log()[-4000:])
        raise
    finally:
        if prom is not None:
            prom.stop()
        tc.stop()
        store.stop()
