"""The verifier against a real `txnkeeper serve` coordinator: batched data live, then invalidated.

The whole PIP-160 downgrade check on a real pod: a transaction open while batching was on keeps a
batched record live across the rollover (not safe); once it ends and the store is rolled over again,
the verifier proves the store clean (safe), and only the report for the newest markers is fresh.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.client import Client
from txnkeeper.verifier import PodEndpoint, RolloverMarkers, report_is_fresh, verify

pytestmark = pytest.mark.spark

TOKEN = "verifier-test-token"
READY = re.compile(r"ready: client (\S+), admin (\S+)")


class ServeProcess:
    """A coordinator pod; readiness comes from its own "ready" log line (no polling, no sleeping)."""

    def __init__(self, workdir: Path) -> None:
        (workdir / "token").write_text(TOKEN)
        (workdir / "token").chmod(0o600)  # serve refuses a token file others can read
        (workdir / "cluster-secret").write_text("verifier-test-cluster-secret")  # transactions need one
        (workdir / "cluster-secret").chmod(0o600)
        (workdir / "config.json").write_text(json.dumps({"batchedWrite": {"enabled": True}}))
        command = [
            sys.executable, "-m", "txnkeeper.cli", "serve", "--role", "coordinator",
            "--data-dir", str(workdir / "data"), "--release", "2.0.0", "--coordinators", "1",
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pod-name", "tc-0",
            "--admin-token-file", str(workdir / "token"), "--config", str(workdir / "config.json"),
            "--cluster-secret-file", str(workdir / "cluster-secret"),
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = READY.search(line)
            if found:
                self.client_address, self.admin_url = found.group(1), f"http://{found.group(2)}"
                break
        else:
            raise RuntimeError(f"serve exited with {self.process.wait()}:\n{''.join(self.lines)}")
        # Keep draining its log so the pipe never fills and blocks the pod.
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()

    def _read_rest(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(self.process.stderr)

    def post(self, path: str, body: object) -> Any:
        request = urllib.request.Request(
            self.admin_url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.admin_url + path, timeout=30) as response:
            return json.loads(response.read())

    def wait_for_no_live_batched_entries(self, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while True:
            stores = self.get("/admin/v1/stores/ledgers")["stores"]
            live = {store["name"]: store["liveEntries"]["batched"] for store in stores}
            if not any(live.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"live batched entries remain after {deadline_s} s: {live}")
            self.process.poll()
            assert self.process.returncode is None, "the coordinator pod exited"
            threading.Event().wait(0.05)  # poll interval of a condition with a deadline

    def rollover(self) -> RolloverMarkers:
        answer = self.post("/admin/v1/stores/rollover", {})
        ledgers = {store["name"]: store["lastBatchedLedger"] for store in answer["stores"]}
        return RolloverMarkers(taken_at=datetime.now(UTC), ledgers=ledgers)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self._drain.join()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[ServeProcess]:
    pod = ServeProcess(tmp_path)
    yield pod
    pod.stop()


async def test_open_batched_transaction_blocks_until_it_ends(spark: Any, coordinator: ServeProcess) -> None:
    endpoint = PodEndpoint(pod="tc-0", url=coordinator.admin_url)
    async with Client(coordinators=[coordinator.client_address], stores=[]) as client:
        txn = await client.new_transaction(timeout_ms=120_000)
        coordinator.post("/admin/v1/batch-log", {"coordinator": {"batchEnabled": False}})
        first_markers = coordinator.rollover()
        assert list(first_markers.ledgers) == ["__transaction_log_0"]

        blocked = verify([endpoint], first_markers, spark=spark)
        assert not blocked.safe
        [row] = blocked.stores
        assert row.store == "__transaction_log_0" and row.pod == "tc-0"
        assert row.live_batched_entries is not None and row.live_batched_entries >= 1
        assert "carry the batched magic" in row.reason
        assert "<= LastBatchedLedger" in row.reason

        await txn.abort()
    # The coordinator deletes an ended transaction's records in its next housekeeping round (every
    # 50 ms), not inside abort(): wait for the pod to report them gone before rolling over.
    coordinator.wait_for_no_live_batched_entries(deadline_s=30.0)
    second_markers = coordinator.rollover()
    cleared = verify([endpoint], second_markers, spark=spark)
    assert cleared.safe, cleared.reason
    assert cleared.stores[0].oldest_live_ledger is not None
    assert cleared.stores[0].oldest_live_ledger > second_markers.ledgers["__transaction_log_0"]
    assert report_is_fresh(cleared, second_markers)
    assert not report_is_fresh(cleared, first_markers)
    assert not report_is_fresh(blocked, second_markers)
