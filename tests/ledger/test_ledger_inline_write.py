"""The group-commit writer's inline path: a small group that finds the writer idle is written and
fsynced on the loop's thread. It must keep every rule of the pool path (resolved only after its
fdatasync, a failed write cut back and reported the same way, order across barriers and rollovers)
and must hand writes back to the pool as soon as fsyncs are slow.

The tests set ``inline_sync_under_ms`` far above any real fsync on a loaded machine, so whether a
write is "fast" is decided by the injected delays, never by the machine's speed.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path

import pytest

from txnkeeper.ledger import (
    LedgerWriteError,
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerFactory,
    Position,
)
from txnkeeper.ledger.watermark import load_watermark

from .conftest import FaultyIO, FileKindIO, wait_for

WINDOW = 16  # writer._WINDOW: the writes measured before the inline path is taken
FAST_MS = 500.0  # any real fsync counts as fast, even on a loaded machine
SLOW_S = 0.6  # an injected delay that counts as slow


def inline_config(**kwargs: object) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(inline_sync_under_ms=FAST_MS, **kwargs)  # type: ignore[arg-type]


class SyncThreadIO(FaultyIO):
    """Records, for every ledger-file fdatasync, the thread it ran on; can fail or slow them down."""

    def __init__(self) -> None:
        super().__init__()
        self.sync_threads: list[int] = []
        self.sync_fails = 0  # how many of the next ledger-file fdatasyncs fail
        self.sync_delay = 0.0
        self.before_sync: list[asyncio.Future[Position]] = []  # appends that must still be pending

    def sync_data(self, fd: int) -> None:
        if fd in self.ledger_fds:
            self.sync_threads.append(threading.get_ident())
            assert not any(f.done() for f in self.before_sync), "an append resolved before its fsync"
            if self.sync_fails:
                self.sync_fails -= 1
                raise OSError(errno.EIO, "Input/output error")
            if self.sync_delay:
                time.sleep(self.sync_delay)  # a slow disk (the data is really synced below)
        super().sync_data(fd)

    def last_on(self, thread: int) -> bool:
        return self.sync_threads[-1] == thread


async def warm_up(ml: ManagedLedger, count: int = WINDOW) -> list[Position]:
    """Sequential appends that fill the writer's measurement window (all on the pool)."""
    return [await ml.add_entry(b"warm-%d" % i) for i in range(count)]


async def test_after_the_window_fills_lone_appends_are_fsynced_on_the_loop_thread(tmp_path: Path) -> None:
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    loop_thread = threading.get_ident()
    await warm_up(ml)
    assert loop_thread not in io.sync_threads, "unmeasured writes must go to the pool"
    for i in range(5):
        await ml.add_entry(b"inline-%d" % i)
        assert io.last_on(loop_thread)
    await factory.close()


async def test_an_inline_append_resolves_only_after_its_data_is_fdatasynced(tmp_path: Path) -> None:
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    await warm_up(ml)
    syncs = len(io.sync_threads)
    append = ml.add_entry(b"payload")
    io.before_sync.append(append)  # sync_data asserts it is still pending when the fsync starts
    position = await append
    assert len(io.sync_threads) == syncs + 1 and io.last_on(threading.get_ident())
    # What the append acknowledged is in the file (read through a fresh descriptor).
    assert await ml.read_entry(position) == b"payload"
    await factory.close()


@pytest.mark.parametrize("inline", [True, False])
async def test_a_failed_inline_fdatasync_fails_the_appends_and_leaves_the_ledger_as_the_pool_does(
    tmp_path: Path, inline: bool
) -> None:
    """The same scenario on both paths must end the same: the appends fail with the ledger's error,
    the file is cut back to the acknowledged entries, the next append rolls over to a new ledger,
    and a reopen finds exactly the acknowledged entries."""
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    config = inline_config() if inline else ManagedLedgerConfig(inline_sync_under_ms=None)
    ml = await factory.open("log", config)
    acked = await warm_up(ml)
    file = tmp_path / "log" / "ledgers" / f"{acked[0].ledger_id:020d}.ledger"
    size_before = file.stat().st_size
    io.sync_fails = 1  # the group's fdatasync fails; cutting it back (truncate + fdatasync) works
    with pytest.raises(LedgerWriteError, match="Input/output error"):
        await ml.add_entry(b"lost")
    failed_on_loop = io.sync_threads[-2] == threading.get_ident()  # [-1] is the cut's fdatasync
    assert failed_on_loop == inline
    assert file.stat().st_size == size_before, "the failed record is cut back"
    after = await ml.add_entry(b"after")
    assert after.ledger_id > acked[0].ledger_id and after.entry_id == 0
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert ml.torn_tails_cut == []
    data = [e.data for e in await ml.read_entries(Position(0, 0), 100)]
    assert data == [b"warm-%d" % i for i in range(WINDOW)] + [b"after"]
    await factory.close()


async def test_a_slow_fsync_sends_the_next_write_to_the_pool_and_fast_ones_bring_it_back(
    tmp_path: Path,
) -> None:
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    loop_thread = threading.get_ident()
    await warm_up(ml)
    await ml.add_entry(b"fast")
    assert io.last_on(loop_thread)

    io.sync_delay = SLOW_S
    await ml.add_entry(b"slow, still inline: nothing measured it slow yet")
    assert io.last_on(loop_thread)
    io.sync_delay = 0.0
    await ml.add_entry(b"after one slow write")
    assert not io.last_on(loop_thread), "one slow fsync must hand the next write to the pool"

    # Fast again: within one window of writes (as the slow one leaves it) the loop writes again.
    for i in range(WINDOW + 1):
        await ml.add_entry(b"recovering-%d" % i)
        if io.last_on(loop_thread):
            break
    assert io.last_on(loop_thread), "fast fsyncs must bring the inline path back"
    await factory.close()


async def test_concurrent_appends_keep_sharing_one_write_on_the_pool(tmp_path: Path) -> None:
    """A burst larger than a lone append's group goes to the pool (the loop keeps gathering the next
    group meanwhile), and its appends still share fsyncs."""
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    loop_thread = threading.get_ident()
    await warm_up(ml)
    syncs = len(io.sync_threads)
    positions = await asyncio.gather(*(ml.add_entry(b"burst-%d" % i) for i in range(64)))
    assert [p.entry_id for p in positions] == list(range(WINDOW, WINDOW + 64))
    burst = io.sync_threads[syncs:]
    assert len(burst) <= 8, f"64 concurrent appends took {len(burst)} fsyncs"
    assert burst[0] != loop_thread, "a group of 64 appends is not written on the loop thread"
    await factory.close()


async def test_order_is_kept_across_rollovers_with_the_inline_path(tmp_path: Path) -> None:
    """Rollover barriers run between groups whichever path writes them: every entry lands in order,
    each ledger's entry ids are contiguous, and a reopen reads them back the same."""
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config(max_entries_per_ledger=5))
    loop_thread = threading.get_ident()
    positions = await warm_up(ml, WINDOW + 4)
    inline_before = io.sync_threads.count(loop_thread)
    for round_no in range(6):  # lone appends and bursts, crossing rollovers
        positions.append(await ml.add_entry(b"lone-%d" % round_no))
        positions += await asyncio.gather(*(ml.add_entry(b"burst-%d-%d" % (round_no, i)) for i in range(3)))
    assert io.sync_threads.count(loop_thread) > inline_before, "the inline path took part"
    expected_ids = [(p.ledger_id, p.entry_id) for p in positions]
    by_ledger: dict[int, list[int]] = {}
    for ledger_id, entry_id in expected_ids:
        by_ledger.setdefault(ledger_id, []).append(entry_id)
    assert all(ids == list(range(len(ids))) for ids in by_ledger.values()), by_ledger
    assert sorted(by_ledger) == list(by_ledger), "ledgers are filled in order"
    datas = [await ml.read_entry(p) for p in positions]
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("log")
    assert [await ml.read_entry(p) for p in positions] == datas
    await factory.close()


async def test_start_queued_writes_leaves_an_inline_group_to_the_loop_thread(tmp_path: Path) -> None:
    """The buffered writer's early start must not push an inline-eligible group to the pool: the
    write then happens on the loop thread on the flush task's first step."""
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    await warm_up(ml)
    append = ml.add_entry(b"now")
    ml.start_queued_writes()
    assert (await append).entry_id == WINDOW
    assert io.last_on(threading.get_ident())
    await factory.close()


async def test_off_switch_keeps_every_write_on_the_pool(tmp_path: Path) -> None:
    io = SyncThreadIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", ManagedLedgerConfig(inline_sync_under_ms=None))
    await warm_up(ml, 2 * WINDOW)
    assert threading.get_ident() not in io.sync_threads
    await factory.close()
    with pytest.raises(ValueError, match="inline_sync_under_ms must be > 0"):
        ManagedLedgerConfig(inline_sync_under_ms=0)


class CountingWatermarkIO(FileKindIO):
    def __init__(self) -> None:
        super().__init__()
        self.watermark_syncs = 0

    def sync_data(self, fd: int) -> None:
        if fd in self.watermark_fds:
            self.watermark_syncs += 1
        super().sync_data(fd)


async def test_confirmed_watermark_writes_are_spaced_and_catch_up_without_more_appends(
    tmp_path: Path,
) -> None:
    """Confirmed writes start at most once per interval (not one per group), and the last value is
    still written on a timer when no append follows (the watermark never stays behind for long)."""
    io = CountingWatermarkIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    ml = await factory.open("log", inline_config())
    started = time.monotonic()
    positions = [await ml.add_entry(b"x%d" % i) for i in range(200)]
    elapsed = time.monotonic() - started
    directory = tmp_path / "log"

    def confirmed() -> Position | None:
        state = load_watermark(io, directory)
        return None if state is None else state.confirmed

    await wait_for(
        lambda: confirmed() == positions[-1], what="the confirmed watermark to reach the last entry"
    )
    # One write per interval (0.02 s) at most, plus the one starting the run and the catch-up.
    assert io.watermark_syncs <= elapsed / 0.02 + 3, (io.watermark_syncs, elapsed)
    await factory.close()
    assert confirmed() == positions[-1]
