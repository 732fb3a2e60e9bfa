"""Streaming blocks built and written by the read-back worker (filesystem tier): the ledger process
handles no block bytes; a worker killed mid-upload fails the segment, which is retried and never served
half-written; a block lost with a replaced worker is staged again; the worker runs at SCHED_IDLE.

Real managed ledgers on disk, a real filesystem tier and the real worker process over its pipes; faults
are injected by killing or stopping that process at a chosen call.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerFactory, Position
from txnkeeper.ledger.offload import BlobUpload, FileSystemBlobStore, timeline
from txnkeeper.ledger.offload.errors import OffloadRangeError
from txnkeeper.ledger.offload.filesystem import _FileUpload
from txnkeeper.ledger.readback import run_when_idle, shared_worker

from .conftest import Clock, wait_for
from .test_readback import data, gone_or_zombie, queued_input, stop_process
from .test_streaming import NAME, ml_config, policy, tier_of


class _StoppingUpload(_FileUpload):
    def __init__(self, store: StoppingStore, key: str, final: Path) -> None:
        super().__init__(store, key, final)
        self.stopping = store

    def local_file(self) -> str:
        path = super().local_file()
        if self.stopping.armed:  # called just before the block's write request is sent to the worker
            self.stopping.armed = False
            self.stopping.stop_and_kill_worker()
        return path


class StoppingStore(FileSystemBlobStore):
    """A filesystem tier that, once armed, stops the worker as a block upload is about to be sent to
    it and kills it with that request unanswered: a worker that dies mid-upload."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.armed = False
        self.killed: int | None = None
        self.kill_error: BaseException | None = None
        self._killer: threading.Thread | None = None

    def open_upload(self, key: str) -> BlobUpload:
        return _StoppingUpload(self, key, self._path(key))

    def stop_and_kill_worker(self) -> None:
        pid = shared_worker().pid
        assert pid is not None
        stop_process(pid)  # blocking, on the upload's thread: the request is sent only once it stopped

        def kill_once_queued() -> None:
            try:
                deadline = time.monotonic() + 120
                while queued_input(pid) == 0:  # the write request waits in the stopped worker's pipe
                    assert time.monotonic() < deadline, "no upload request reached the stopped worker"
                    time.sleep(0.005)
                os.kill(pid, signal.SIGKILL)
                self.killed = pid
            except BaseException as exc:  # reported by the test, not lost in the thread
                self.kill_error = exc
                os.kill(pid, signal.SIGKILL)

        self._killer = threading.Thread(target=kill_once_queued, daemon=True)
        self._killer.start()


def hidden_uploads(tier: Path) -> list[str]:
    return [p.name for p in tier.iterdir() if p.name.startswith(".txnkeeper-upload-")]


async def test_streaming_blocks_are_staged_and_written_by_the_worker_not_the_ledger_process(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    ml = await opened(tmp_path / "data").open(NAME, ml_config(policy(tier_of(tmp_path), Clock())))
    off = ml.offloader
    assert off is not None
    timeline.start()
    try:
        acked = [await ml.add_entry(data(n)) for n in range(40)]
        await wait_for(lambda: off.streamed_until() == acked[-1], "every entry streamed")
        done = await off.offload()
    finally:
        spans = timeline.stop()
    kinds = [kind for kind, _, _ in spans]
    assert done and done[-1].end == acked[-1]
    assert kinds.count("worker_upload") >= 5  # 40 entries of 112 framed bytes in 896-byte blocks ...
    assert "seal" not in kinds  # ... sealed and written by the worker process: here, only the
    assert kinds.count("tier_write") == len(off.segments())  # index objects (one write each)
    assert await off.read(1, 0, 10) == [data(n) for n in range(10)]  # from the tier, CRCs checked
    assert await off.read(4, 0, 10) == [data(n) for n in range(30, 40)]


async def test_a_worker_killed_mid_upload_fails_the_segment_which_is_retried_and_never_served_half_written(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    tier = tier_of(tmp_path)
    store = StoppingStore(tier)
    pol = policy(tier, Clock(), offloadRetryIntervalSeconds=3600, store_factory=lambda c: store)
    ml = await opened(tmp_path / "data").open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(data(n)) for n in range(3)]
    await wait_for(lambda: off.streamed_until() == acked[-1], "the first entries streamed")
    begin = off.segments()[0].begin
    store.armed = True
    acked += [await ml.add_entry(data(n)) for n in range(3, 40)]  # producing never waits for offload
    await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the streaming segment recorded Failed")
    assert store.kill_error is None
    killed = store.killed
    assert killed is not None
    last_error = off.status()["lastError"]
    assert f"pid {killed}" in last_error and "writing staged block" in last_error and "retried" in last_error
    assert await store.list() == []  # nothing under a key: no half-written object can be read
    assert hidden_uploads(tier) == []  # and the aborted upload's file is gone
    with pytest.raises(OffloadRangeError, match="no Offloaded segment"):
        await off.read(1, 0, 1)
    done = await off.offload()  # the retry (manual: the retry interval is an hour), with a new worker
    assert [(s.begin, s.end) for s in done] == [(begin, acked[-1])]
    assert off.segment_counts() == {"Assigned": 0, "Offloaded": 1, "Failed": 0}
    assert shared_worker().pid not in (None, killed)
    assert await off.read(1, 0, 10) == [data(n) for n in range(10)]
    entries = await ml.read_entries(Position(1, 0), 1000)
    assert [e.data for e in entries] == [data(n) for n in range(40)]


async def test_a_block_staged_in_a_worker_that_died_idle_is_staged_again_from_the_local_files(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory]
) -> None:
    pol = policy(tier_of(tmp_path), Clock(), offloadRetryIntervalSeconds=3600)  # 896-byte blocks: 8 entries
    ml = await opened(tmp_path / "data").open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(data(n)) for n in range(5)]  # one block of ledger 1, staged, not written
    await wait_for(lambda: off.streamed_until() == acked[-1], "the first entries staged")
    pid = shared_worker().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the staged entries die with it
    await wait_for(lambda: gone_or_zombie(pid), "the idle worker dead")
    acked += [await ml.add_entry(data(n)) for n in range(5, 25)]
    await wait_for(lambda: off.streamed_until() == acked[-1], "the later entries streamed")
    assert off.segment_counts() == {"Assigned": 1, "Offloaded": 0, "Failed": 0}
    done = await off.offload()
    assert [(s.begin, s.end) for s in done] == [(Position(1, 0), acked[-1])]
    # Read from the tier: the block of ledger 1 holds the entries staged before the kill, again.
    assert await off.read(1, 0, 10) == [data(n) for n in range(10)]
    assert await off.read(3, 0, 5) == [data(n) for n in range(20, 25)]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_worker_runs_at_sched_idle_and_a_platform_without_it_is_no_error() -> None:
    worker = shared_worker()
    worker.start()
    pid = worker.pid
    assert pid is not None
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE

    def refused() -> None:
        raise PermissionError(1, "Operation not permitted")

    def missing() -> None:
        raise AttributeError("module 'os' has no attribute 'SCHED_IDLE'")

    assert run_when_idle(refused) is False
    assert run_when_idle(missing) is False


def test_a_write_for_a_block_the_worker_does_not_hold_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "upload"
    target.write_bytes(b"")
    worker = shared_worker()
    block = worker.new_block()
    with pytest.raises(OSError, match=f"no staged block {block}"):
        worker.write_block(block, ledger_id=1, first_entry_id=0, min_size=1024, path=str(target), offset=0)
    assert target.read_bytes() == b""  # nothing written
