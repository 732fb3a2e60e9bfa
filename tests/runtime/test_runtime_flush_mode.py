"""The flush mode is a batch-log setting like the others: set with `txnkeeper admin batch-log set
--flush-mode`, named in the admin output (batchedWriteFlushMode) and in the metrics (a 0/1 gauge per
mode)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_pods import TOKEN, ServePod, http

pytestmark = pytest.mark.timeout(120)

GAUGE = 'pulsar_txn_tc_bufferedwriter_flush_mode{coordinator_id="0",mode="%s"}'


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def metric(url: str, mode: str) -> float:
    status, text = http("GET", f"{url}/metrics")
    assert status == 200
    for line in str(text).splitlines():
        if line.startswith(GAUGE % mode):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {GAUGE % mode} in /metrics")


def test_flush_mode_is_set_by_the_admin_cli_and_named_in_stats_and_metrics(
    cluster: tuple[ServePod, ServePod], tmp_path: Path
) -> None:
    tc, _ = cluster
    url = tc.admin_url()
    got = json.loads(admin("--url", url, "batch-log", "get").stdout)
    assert got["coordinator"]["batchedWriteFlushMode"] == "adaptive"
    assert (metric(url, "adaptive"), metric(url, "delay")) == (1.0, 0.0)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    applied = admin(
        "--url", url, "--token-file", str(token), "batch-log", "set", "--target", "coordinator",
        "--flush-mode", "delay",
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    got = json.loads(admin("--url", url, "batch-log", "get").stdout)
    assert got["coordinator"]["batchedWriteFlushMode"] == "delay"
    stats = json.loads(admin("--url", url, "coordinator-stats").stdout)
    assert stats["coordinatorArray"][0]["transactionLogBatchedWriteStat"]["batchedWriteFlushMode"] == "delay"
    assert (metric(url, "adaptive"), metric(url, "delay")) == (0.0, 1.0)
    refused = admin("--url", url, "--token-file", str(token), "batch-log", "set", "--flush-mode", "eager")
    assert refused.returncode == 2 and "invalid choice: 'eager'" in refused.stderr
