"""Tier slices keep clear of group commits: the ledger process publishes its commits in a shared page,
the read-back worker waits for a gap before each slice, boundedly; a page that is absent, stale or
stuck never stops offload, and a worker killed mid-upload behind it fails the segment, which is retried.

The page and the gate are real (a memfd mapped in both processes); the worker is the real process,
the tier a real directory, the ledgers real files.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerFactory, Position, commit_activity
from txnkeeper.ledger.commit_activity import IDLE_NS, CommitActivity, SliceGate
from txnkeeper.ledger.fileio import FileIO
from txnkeeper.ledger.ledger_file import GroupWriteFailed, LedgerFile
from txnkeeper.ledger.offload.filesystem import STREAMING_CATCH_UP_SLICE_BYTES, STREAMING_WRITE_SLICE_BYTES
from txnkeeper.ledger.offload.offloader import streaming_slice_bytes
from txnkeeper.ledger.readback import serve, shared_worker

from .conftest import Clock, wait_for
from .test_readback import data
from .test_streaming import NAME, ml_config, policy, tier_of
from .test_worker_upload import StoppingStore, hidden_uploads

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the commit page is a Linux memfd")


def page_values(page: CommitActivity) -> tuple[int, int]:
    """(in flight, last end ns) as the worker sees them, through a second mapping of the page."""
    gate = SliceGate(os.dup(page.fd))
    return gate.read()


@pytest.fixture
def page() -> Iterator[CommitActivity]:
    made = CommitActivity()
    yield made
    made.close()


@pytest.fixture
def held_commit() -> Iterator[CommitActivity]:
    """The process's shared page with one group commit in flight that never ends (a stuck page),
    released at teardown so later tests' workers do not wait."""
    shared = commit_activity.shared()
    if shared is None:
        pytest.skip("no commit page on this platform")
    shared.begin()
    yield shared
    shared.end()


def test_the_gate_opens_at_once_when_no_commit_ran_for_a_while(page: CommitActivity) -> None:
    gate = SliceGate(os.dup(page.fd))
    assert gate.read() == (0, 0)  # a new page: no commit ever
    assert gate.wait(max_wait_ns=60 * 10**9) == 0  # the first look lets it through: nothing waited


def test_the_gate_waits_for_the_commit_in_flight_to_end(page: CommitActivity) -> None:
    gate = SliceGate(os.dup(page.fd))
    page.begin()
    ending = threading.Event()
    seen: list[bool] = []

    def slice_() -> None:
        gate.wait(max_wait_ns=120 * 10**9)  # bound far beyond the test: only the commit's end opens it
        seen.append(ending.is_set())

    worker = threading.Thread(target=slice_)
    worker.start()
    ending.set()
    page.end()  # the commit ends: the gate sees a fresh end and none in flight
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert seen == [True]  # it opened only after the commit's end
    in_flight, last_end = gate.read()
    assert in_flight == 0 and last_end > 0


class SteppedClock:
    """The page's and the gate's clock, moved only by the gate's own polls: what the gate decides then
    depends on the rule alone, not on how long a loaded machine takes between two lines of the test."""

    def __init__(self) -> None:
        self.ns = time.monotonic_ns()

    def monotonic_ns(self) -> int:
        return self.ns

    def sleep(self, seconds: float) -> None:
        self.ns += max(1, int(seconds * 1e9))


def test_a_stuck_page_delays_a_slice_by_the_bound_only(
    page: CommitActivity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_activity, "time", SteppedClock())
    gate = SliceGate(os.dup(page.fd))
    page.begin()  # a commit that never ends (a page nobody updates any more)
    bound = 20_000_000
    assert gate.wait(max_wait_ns=bound) >= bound  # waited its bound, then went anyway
    page.end()
    assert gate.wait(max_wait_ns=60 * 10**9) == 0  # just ended: go at once


def test_between_commits_the_gate_waits_for_the_next_end_or_the_bound(page: CommitActivity) -> None:
    page.begin()
    page.end()
    gate = SliceGate(os.dup(page.fd))
    # Not fresh any more, not idle yet: the next commit is due, the slice waits for its end (bounded).
    deadline = time.monotonic() + 60
    while time.monotonic_ns() - gate.read()[1] <= commit_activity.FRESH_NS:
        assert time.monotonic() < deadline
    if time.monotonic_ns() - gate.read()[1] >= IDLE_NS:
        pytest.skip("the machine descheduled this test past the idle threshold")
    bound = 1_000_000
    waited = gate.wait(max_wait_ns=bound)
    assert waited >= bound or time.monotonic_ns() - gate.read()[1] >= IDLE_NS


def test_a_group_commit_publishes_its_start_and_end_even_when_it_fails(
    tmp_path: Path, page: CommitActivity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(commit_activity._shared, "page", page)
    ledger = LedgerFile(FileIO(), tmp_path, 1)
    ledger.create()
    before = time.monotonic_ns()
    ledger.write_and_sync([b"payload"], ledger.assigned_end, sync=True)
    in_flight, ended = page_values(page)
    assert in_flight == 0 and ended >= before
    ledger.close_for_writes()  # the next write fails (bad fd) and so does its cut
    with pytest.raises(GroupWriteFailed):
        ledger.write_and_sync([b"payload"], ledger.assigned_end, sync=True)
    in_flight, ended_after_failure = page_values(page)
    assert in_flight == 0 and ended_after_failure >= ended  # never left "in flight"


def test_the_worker_maps_the_ledger_process_page() -> None:
    worker = shared_worker()
    worker.start()
    pid = worker.pid
    shared = commit_activity.current()
    assert pid is not None and shared is not None
    targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    targets += Path(f"/proc/{pid}/maps").read_text().splitlines()
    assert any("txnkeeper-commit-activity" in t for t in targets), targets


def test_a_worker_given_no_usable_page_serves_without_waiting(tmp_path: Path) -> None:
    closed = os.open(tmp_path, os.O_RDONLY)
    os.close(closed)  # a descriptor that is not open: mapping it fails
    out = io.BytesIO()
    serve(io.BytesIO(b""), out, commit_page_fd=closed)  # no request: returns when its input ends
    assert out.getvalue() == b""


async def test_offload_completes_with_a_commit_stuck_in_flight(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory], held_commit: CommitActivity
) -> None:
    ml = await opened(tmp_path / "data").open(NAME, ml_config(policy(tier_of(tmp_path), Clock())))
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(data(n)) for n in range(40)]
    in_flight, _ = page_values(held_commit)
    assert in_flight >= 1  # the appends' own commits came and went; the stuck one is still published
    await wait_for(lambda: off.streamed_until() == acked[-1], "every entry streamed past a stuck page")
    done = await off.offload()
    assert done and done[-1].end == acked[-1]
    assert await off.read(1, 0, 10) == [data(n) for n in range(10)]
    entries = await ml.read_entries(Position(1, 0), 1000)
    assert [e.data for e in entries] == [data(n) for n in range(40)]


async def test_a_worker_killed_mid_upload_behind_a_stuck_page_fails_the_segment_which_is_retried(
    tmp_path: Path, opened: Callable[[Path], ManagedLedgerFactory], held_commit: CommitActivity
) -> None:
    tier = tier_of(tmp_path)
    store = StoppingStore(tier)
    pol = policy(tier, Clock(), offloadRetryIntervalSeconds=3600, store_factory=lambda c: store)
    ml = await opened(tmp_path / "data").open(NAME, ml_config(pol))
    off = ml.offloader
    assert off is not None
    acked = [await ml.add_entry(data(n)) for n in range(3)]
    await wait_for(lambda: off.streamed_until() == acked[-1], "the first entries streamed")
    store.armed = True  # the next block's write request dies unanswered in the worker
    acked += [await ml.add_entry(data(n)) for n in range(3, 40)]
    await wait_for(lambda: off.segment_counts()["Failed"] == 1, "the streaming segment recorded Failed")
    assert store.kill_error is None and store.killed is not None
    assert await store.list() == []  # nothing half-written under a key
    assert hidden_uploads(tier) == []
    done = await off.offload()  # retried by a new worker, still behind the stuck page's bound
    assert [s.end for s in done] == [acked[-1]]
    assert off.segment_counts() == {"Assigned": 0, "Offloaded": 1, "Failed": 0}
    assert await off.read(1, 0, 10) == [data(n) for n in range(10)]


def test_the_stream_syncs_small_slices_keeping_up_larger_catching_up_and_the_drivers_when_manual() -> None:
    assert streaming_slice_bytes(manual=False, behind=False) == STREAMING_WRITE_SLICE_BYTES == 32 * 1024
    assert streaming_slice_bytes(manual=False, behind=True) == STREAMING_CATCH_UP_SLICE_BYTES == 64 * 1024
    assert streaming_slice_bytes(manual=True, behind=False) is None  # the driver's (256 KiB)
    assert streaming_slice_bytes(manual=True, behind=True) is None
