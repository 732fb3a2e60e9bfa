"""Streaming read-back in the worker process: same bytes as the in-process path, corruption refused,
a dead worker fails the segment (then retried), a killed ledger process leaves no worker behind.

Real managed ledgers on disk, a real filesystem tier and the real worker process over its pipes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerFactory, Position
from txnkeeper.ledger.entry_format import FILE_HEADER, RECORD_HEADER_SIZE
from txnkeeper.ledger.errors import CorruptEntryError
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offload.block import frame_entry
from txnkeeper.ledger.offload.offloader import Offloader
from txnkeeper.ledger.readback import shared_worker

from .conftest import Clock, wait_for
from .test_streaming import NAME, ml_config, policy, tier_of

ENTRY = 100  # fixed-size entries: record k of a ledger file starts at FILE_HEADER + k * (20 + ENTRY)


def data(n: int) -> bytes:
    return f"e-{n:05d}-".encode().ljust(ENTRY, b"x")


def record_offset(entry_id: int) -> int:
    return FILE_HEADER.size + entry_id * (RECORD_HEADER_SIZE + ENTRY)


def ledger_file(root: Path, ledger_id: int) -> Path:
    found = [p for p in root.rglob("*.ledger") if p.name == f"{ledger_id:020d}.ledger"]
    assert len(found) == 1, found
    return found[0]


def gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


async def test_framed_read_back_is_the_framing_of_the_checked_entries(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    ml = await opened(tmp_path).open(NAME, ml_config(None))
    sizes = [0, 1, 700, 5, 4096, 33]
    for n, size in enumerate(sizes):
        await ml.add_entry(bytes([n]) * size)
    expected = bytearray()
    for entry_id, body in enumerate(await ml.read_local(1, 1, 4), start=1):
        frame_entry(expected, entry_id, body)
    assert await ml.read_local_framed(1, 1, 4) == expected
    assert ml.local_payload_bytes(1, 1, 4) == sum(sizes[1:5])


async def test_a_flipped_byte_in_a_ledger_file_is_refused_and_never_uploaded(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    root = tmp_path / "data"
    factory = opened(root)
    ml = await factory.open(NAME, ml_config(None))
    for n in range(25):  # ledgers 1 and 2 closed (10 entries each), 3 open
        await ml.add_entry(data(n))
    await factory.close()
    path = ledger_file(root, 1)
    flip_at = record_offset(3) + RECORD_HEADER_SIZE + 7  # a body byte of entry 3
    with path.open("r+b") as f:
        f.seek(flip_at)
        byte = f.read(1)
        f.seek(flip_at)
        f.write(bytes([byte[0] ^ 0x01]))
    # Closed ledgers open without re-checking bodies; read-back checks every body it frames.
    ml = await opened(root).open(NAME, ml_config(None))
    with pytest.raises(CorruptEntryError) as err:
        await ml.read_local_framed(1, 0, 5)
    message = str(err.value)
    assert "entry 3" in message and str(path) in message and f"offset {record_offset(3)}" in message
    assert "bad data checksum" in message and "restore" in message

    clock = Clock()
    ml.set_offload_policy(policy(tier_of(tmp_path), clock, offloadRetryIntervalSeconds=3600))
    off = ml.offloader
    assert off is not None
    await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the streaming segment recorded Failed")
    status = off.status()
    assert (
        status["status"] == "ERROR" and "entry 3" in status["lastError"] and str(path) in status["lastError"]
    )
    assert off.segment_counts()["Offloaded"] == 0  # nothing of the damaged ledger is in the tier
    assert (await ml.add_entry(b"still producing")).ledger_id > 2  # producing is unaffected


def process_state(pid: int) -> str:
    """The one-letter state in /proc/<pid>/stat ("T": stopped by a signal)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def stop_process(pid: int, limit: float = 120.0) -> None:
    """SIGSTOP ``pid`` and return once it is stopped. The signal only takes effect when the process
    next runs: a worker at SCHED_IDLE on a loaded machine can first read a request written after the
    kill (a pipe read takes waiting data before it looks at signals) and stop with it consumed, never
    queued. Measured beside ``stress-ng --cpu 2``: 35 of 40 requests written at once were consumed."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + limit
    while process_state(pid) not in ("T", "t"):
        assert time.monotonic() < deadline, f"process {pid} did not stop within {limit} s"
        time.sleep(0.002)


def queued_input(pid: int) -> int:
    """Bytes waiting in the process's stdin pipe (a request it has not read yet)."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        queued: int = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        return queued
    finally:
        os.close(fd)


async def streamed_three(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> tuple[ManagedLedger, Offloader, list[Position]]:
    """A streaming ledger (a Failed segment is retried only by hand) whose first 3 entries streamed."""
    ml = await opened(tmp_path / "data").open(
        NAME, ml_config(policy(tier_of(tmp_path), Clock(), offloadRetryIntervalSeconds=3600))
    )
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(data(n)) for n in range(3)]
    await wait_for(lambda: off.streamed_until() == acked[-1], "the first entries streamed")
    return ml, off, acked


async def test_a_read_back_worker_killed_mid_call_fails_the_segment_and_a_new_worker_retries_it(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    ml, off, acked = await streamed_three(tmp_path, opened)
    begin = off.segments()[0].begin
    pid = shared_worker().pid
    assert pid is not None
    stop_process(pid)  # the next request waits in its pipe ...
    acked += [await ml.add_entry(data(n)) for n in range(3, 15)]  # producing never waits for offload
    await wait_for(lambda: queued_input(pid) > 0, "a read-back request sent to the stopped worker")
    os.kill(pid, signal.SIGKILL)  # ... and the worker dies with it unanswered
    await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the streaming segment recorded Failed")
    last_error = off.status()["lastError"]
    assert "read-back worker" in last_error and f"pid {pid}" in last_error and "retried" in last_error
    done = await off.offload()  # the retry (manual: the retry interval is an hour) uses a new worker
    assert [(s.begin, s.end) for s in done] == [(begin, acked[-1])]
    assert shared_worker().pid not in (None, pid)
    entries = await ml.read_entries(Position(1, 0), 1000)
    assert [e.data for e in entries] == [data(n) for n in range(15)]


async def test_a_worker_that_died_between_calls_is_replaced_without_failing_anything(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    ml, off, acked = await streamed_three(tmp_path, opened)
    pid = shared_worker().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await wait_for(lambda: gone_or_zombie(pid), "the idle worker dead")
    acked += [await ml.add_entry(data(n)) for n in range(3, 15)]
    await wait_for(lambda: off.streamed_until() == acked[-1], "the later entries streamed")
    assert off.segment_counts() == {"Assigned": 1, "Offloaded": 0, "Failed": 0}
    assert shared_worker().pid not in (None, pid)


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
    from txnkeeper.ledger.offload import OffloadConfig
    from txnkeeper.ledger.offload.offloader import OffloadPolicy
    from txnkeeper.ledger.readback import shared_worker

    async def main(root: Path) -> None:
        policy = OffloadPolicy(
            OffloadConfig(fileSystemURI=str(root / "tier")),
            managedLedgerOffloadThresholdInBytes=0,
            managedLedgerOffloadDeletionLagMs=0,
        )
        factory = ManagedLedgerFactory(root / "data")
        ml = await factory.open("persistent://public/default/k", ManagedLedgerConfig(offload=policy))
        last = None
        for n in range(20):
            last = await ml.add_entry(b"x" * 100)
        while ml.offloader.streamed_until() != last:
            await asyncio.sleep(0.02)  # polling the background stream (deadline: the parent's)
        print(shared_worker().pid, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until killed

    asyncio.run(main(Path(sys.argv[1])))
    """
)


def test_a_killed_ledger_process_leaves_no_read_back_worker(tmp_path: Path) -> None:
    (tmp_path / "tier").mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the pytest timeout bounds this if the child never streams
        worker = int(line)
        assert not gone_or_zombie(worker)
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 60
    while not gone_or_zombie(worker):  # its stdin closed with the ledger process: it exits
        assert time.monotonic() < deadline, f"read-back worker {worker} outlived its killed ledger process"
        time.sleep(0.02)
