"""A checkpointed ``readStream`` query over a txnkeeper topic whose driver is SIGKILLed mid-stream and
started again: every committed message reaches the sink exactly once (no duplicates, no gaps), and no
aborted transaction's message ever does.

The driver is a real separate process (stream_driver.py, its JVM in its process group: the whole
group is killed, as a pod would be); the store and coordinator are real ``txnkeeper serve`` processes.
The sink's output is read from its own log (``_spark_metadata``), as Spark reads a file sink.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_pods import ServePod

from txnkeeper.client import Client

pytestmark = pytest.mark.spark

TOPIC = "persistent://public/default/stream-me"
DRIVER = Path(__file__).with_name("stream_driver.py")
DEADLINE_S = 240.0


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[ServePod, ServePod]]:
    tc = ServePod(tmp_path, "tc-0", "coordinator").start()
    store = ServePod(tmp_path, "pas-0", "store").start()
    yield tc, store
    store.stop()
    tc.stop()


async def _wave(tc: ServePod, store: ServePod, wave: int, committed: list[str], aborted: list[str]) -> None:
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        producer = await client.create_producer(TOPIC)
        for i in range(6):
            payload = f"w{wave}-plain-{i}"
            await producer.send(payload.encode(), key=f"k{i % 3}")
            committed.append(payload)
        for outcome in ("commit", "abort"):
            txn = await client.new_transaction(timeout_ms=60_000)
            payloads = [f"w{wave}-{outcome}-{i}" for i in range(3)]
            for payload in payloads:
                await producer.send(payload.encode(), txn=txn)
            if outcome == "commit":
                await txn.commit()
                committed.extend(payloads)
            else:
                await txn.abort()
                aborted.extend(payloads)


class Driver:
    def __init__(self, store: ServePod, workdir: Path, log_name: str) -> None:
        self.log = workdir / log_name
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), store.admin_url(), TOPIC, str(workdir / "checkpoint"),
                 str(workdir / "out")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the driver and its JVM (its process group) at once."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def alive(self) -> None:
        assert self.process.poll() is None, self.log.read_text(errors="replace")[-5000:]


def sink_rows(out: Path) -> list[str]:
    """The payloads the sink committed: the files its log lists (a file of a killed batch is not)."""
    log = out / "_spark_metadata"
    if not log.is_dir():
        return []
    files: set[str] = set()
    for entry in sorted(log.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        lines = entry.read_text().splitlines()
        for line in lines[1:]:  # the first line is the log's version
            item = json.loads(line)
            if item.get("action", "add") == "add":
                files.add(item["path"].removeprefix("file://"))
            else:
                files.discard(item["path"].removeprefix("file://"))
    rows = []
    for path in sorted(files):
        rows += [json.loads(line)["payload"] for line in Path(path).read_text().splitlines() if line]
    return rows


def wait_for(out: Path, driver: Driver, predicate: object, what: str) -> list[str]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        rows = sink_rows(out)
        if predicate(rows):  # type: ignore[operator]
            return rows
        driver.alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {DEADLINE_S} s; sink has {len(rows)} rows")
        time.sleep(0.2)  # poll interval of a condition with a deadline


def commits(workdir: Path) -> int:
    folder = workdir / "checkpoint" / "commits"
    return len([p for p in folder.iterdir() if p.name.isdecimal()]) if folder.is_dir() else 0


def test_a_killed_driver_resumes_without_duplicates_or_gaps(
    pods: tuple[ServePod, ServePod], tmp_path: Path
) -> None:
    tc, store = pods
    committed: list[str] = []
    aborted: list[str] = []
    out = tmp_path / "out"
    asyncio.run(_wave(tc, store, 1, committed, aborted))
    driver = Driver(store, tmp_path, "driver-1.log")
    try:
        wait_for(out, driver, lambda rows: len(rows) >= len(committed), "the first wave reaches the sink")
        asyncio.run(_wave(tc, store, 2, committed, aborted))
        seen = commits(tmp_path)
        wait_for(out, driver, lambda rows: commits(tmp_path) > seen, "a micro-batch after the first wave")
        # Data arrives while it is killed: the batch it plans or runs next may be cut anywhere.
        asyncio.run(_wave(tc, store, 3, committed, aborted))
    finally:
        driver.kill()
    before_restart = sink_rows(out)
    assert len(before_restart) == len(set(before_restart))
    asyncio.run(_wave(tc, store, 4, committed, aborted))
    driver = Driver(store, tmp_path, "driver-2.log")
    try:
        rows = wait_for(
            out, driver, lambda rows: len(rows) >= len(committed), "every committed message after the restart"
        )
        asyncio.run(_wave(tc, store, 5, committed, aborted))
        rows = wait_for(out, driver, lambda rows: len(rows) >= len(committed), "a wave after the restart")
    finally:
        driver.kill()
    duplicates = [p for p, n in Counter(rows).items() if n > 1]
    assert not duplicates, duplicates
    assert sorted(rows) == sorted(committed)
    assert not set(rows) & set(aborted)
