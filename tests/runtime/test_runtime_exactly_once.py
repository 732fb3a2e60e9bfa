"""Exactly-once consume-process-produce across a killed instance and a zombie.

Instance A is SIGKILLed in the middle of a transaction (output written, input acked, not committed).
Instance Z stalls mid-transaction and is frozen (SIGSTOP) past its transaction timeout; a replacement
B takes over. Z then wakes up, tries to commit its stale transaction (refused) and keeps processing.
Every input must appear exactly once in the committed output.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_pods import ServePod
from runtime_waits import wait_for_line, wait_until

from txnkeeper.client import Client, Transaction
from txnkeeper.txnid import TxnID

pytestmark = pytest.mark.timeout(120)

IN = "persistent://t/ns/jobs"
OUT = "persistent://t/ns/results"
INPUTS = 120
PROCESSOR = Path(__file__).with_name("processor.py")


@pytest.fixture
def processors(tmp_path: Path) -> Iterator[dict[str, tuple[subprocess.Popen[bytes], Path]]]:
    started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)


def start_processor(
    started: dict[str, tuple[subprocess.Popen[bytes], Path]],
    tmp: Path,
    name: str,
    tc: ServePod,
    store: ServePod,
    *extra: str,
) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp / f"{name}.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(PROCESSOR),
                "--coordinator",
                tc.listen,
                "--store",
                store.listen,
                "--input",
                IN,
                "--output",
                OUT,
                "--txn-timeout-ms",
                "1500",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started[name] = (proc, out)
    return proc, out


async def test_exactly_once_with_killed_instance_and_zombie(
    cluster: tuple[ServePod, ServePod],
    processors: dict[str, tuple[subprocess.Popen[bytes], Path]],
    tmp_path: Path,
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        audit = await client.subscribe(OUT, "audit", receiver_queue_size=500)
        jobs = await client.create_producer(IN)
        await asyncio.gather(*(jobs.send(f"job-{i:04d}".encode()) for i in range(INPUTS)))

        a, a_out = start_processor(processors, tmp_path, "A", tc, store, "--stall-after", "15")
        z, z_out = start_processor(processors, tmp_path, "Z", tc, store, "--stall-after", "10")
        await wait_for_line(a_out, "MIDTXN", 60)
        a.send_signal(signal.SIGKILL)
        zombie_line = await wait_for_line(z_out, "MIDTXN", 60)
        z.send_signal(signal.SIGSTOP)
        start_processor(processors, tmp_path, "B", tc, store)

        most, least = zombie_line.split()[1].split(",")
        zombie_txn = Transaction(client.connections, TxnID(int(most), int(least)), tc.listen)

        async def zombie_txn_aborted() -> bool:
            return await client.transaction_status(zombie_txn) == "ABORTED"

        await wait_until(zombie_txn_aborted, 30, "the frozen zombie's transaction to time out")
        z.send_signal(signal.SIGCONT)
        z.send_signal(signal.SIGUSR1)
        line = await wait_for_line(z_out, "ZOMBIE-COMMIT", 30)
        assert line.startswith("ZOMBIE-COMMIT-FAILED"), line

        results: Counter[bytes] = Counter()

        async def all_processed() -> bool:
            while True:
                try:
                    message = await audit.receive(timeout=0.2)
                except TimeoutError:
                    return len(results) >= INPUTS
                await audit.acknowledge(message)
                results[message.data] += 1

        await wait_until(all_processed, 120, f"{INPUTS} distinct results")
        # Stop every processor, then read whatever else was committed: there must be nothing.
        for proc, _ in processors.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        await (await client.create_producer(OUT)).send(b"END")
        while True:
            message = await audit.receive(timeout=30)
            if message.data == b"END":
                break
            results[message.data] += 1
    duplicates = {k: v for k, v in results.items() if v > 1}
    assert not duplicates, f"processed more than once: {duplicates}"
    assert set(results) == {f"processed:job-{i:04d}".encode() for i in range(INPUTS)}
