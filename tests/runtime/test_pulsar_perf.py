"""Pulsar's own benchmark tool, `pulsar-perf` (Maven `org.apache.pulsar:pulsar-testclient` 4.0.8,
unchanged), against a coordinator pod and a store pod (issue 26): `produce`, `consume` and
`transaction` (consume, produce and ack in a transaction, commit) each run for a few seconds and
report no failure. `make test` resolves the jars (Makefile, PULSAR_PEER_LIB; bench/pulsar_peer)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from runtime_pods import ServePod

LIB = Path(os.environ.get("PULSAR_PEER_LIB", "/nonexistent"))
pytestmark = [
    pytest.mark.skipif(
        not any(LIB.glob("pulsar-testclient-*.jar")) or shutil.which("java") is None,
        reason="pulsar-perf is not resolved: `make test` resolves it (needs a JDK, Maven and Maven Central)",
    ),
    pytest.mark.timeout(600),
]


def _perf(tmp_path: Path, *args: str, timeout: float = 240) -> str:
    config = tmp_path / "client.conf"
    config.write_text("")  # pulsar-perf wants a client configuration file; its defaults suffice
    run = subprocess.run(
        [
            "java",
            "-Xmx512m",
            "-cp",
            f"{LIB}/*",
            "org.apache.pulsar.testclient.PulsarPerfTestTool",
            str(config),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=tmp_path,  # pulsar-perf writes histogram files (*.hgrm) where it runs
    )
    return run.stdout + run.stderr


def _count(pattern: str, output: str) -> int:
    found = re.search(pattern, output)
    assert found is not None, f"no {pattern!r} in pulsar-perf's output:\n{output[-4000:]}"
    return int(found.group(1))


def test_pulsar_perf_produces_consumes_and_runs_transactions(
    pulsar_pods: tuple[ServePod, ServePod], tmp_path: Path
) -> None:
    _, store = pulsar_pods
    url = f"pulsar://{store.listen}"
    produced = _perf(
        tmp_path, "produce", "-u", url, "-r", "2000", "-s", "100", "-m", "3000", "-time", "60",
        "persistent://public/default/perf-in",
    )  # fmt: skip
    sent = _count(r"Aggregated throughput stats --- (\d+) records sent", produced)
    assert sent >= 3000  # -m stops the tool once it reached the count; what was in flight is sent too
    consumed = _perf(
        tmp_path, "consume", "-u", url, "-ss", "check", "-sp", "Earliest", "-m", str(sent), "-time", "60",
        "persistent://public/default/perf-in",
    )  # fmt: skip
    assert _count(r"Aggregated throughput stats --- (\d+) records received", consumed) == sent
    assert _count(r"ack failed (\d+) msg", consumed) == 0
    transactions = _perf(
        tmp_path, "transaction", "-u", url, "--topics-c", "persistent://public/default/perf-in",
        "--topics-p", "persistent://public/default/perf-out", "-ss", "txn", "-sp", "Earliest",
        "-threads", "2", "-nmp", "1", "-nmc", "1", "-time", "10", "-tto", "60",
    )  # fmt: skip
    executed = _count(r"--- (\d+) transaction executed", transactions)
    assert executed > 0
    for failure in (
        "transaction open failed",
        "transaction end failed",
        "message ack failed",
        "message send failed",
    ):
        assert _count(rf"--- (\d+) {failure}", transactions) == 0, transactions[-4000:]
