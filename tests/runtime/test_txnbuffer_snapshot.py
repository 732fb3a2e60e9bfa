"""Transaction buffer snapshots on real ledgers: recovery replays only what the snapshot does not
cover, yet restores every outcome; a damaged or stale snapshot is never used (full replay, WARNING)."""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txnkeeper import statefile
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.position import Position
from txnkeeper.topic import snapshot as snapshots
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.txnbuffer import UNKNOWN_FIRST, TxnOutcome
from txnkeeper.topic.txnfence import now_ms
from txnkeeper.txnid import TxnID

TOPIC = "persistent://t/ns/snap"
COMMITTED, ABORTED, OPEN, LATE = TxnID(1, 1), TxnID(1, 2), TxnID(1, 3), TxnID(1, 4)


async def open_partition(
    root: Path, every: int = 1_000_000, per_ledger: int = 50
) -> tuple[Partition, ManagedLedgerFactory]:
    factory = ManagedLedgerFactory(root / "ledgers")
    ledger = await factory.open(TOPIC, ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    partition = Partition(
        TOPIC, ledger, snapshots.snapshot_path(root / "snapshots", TOPIC), snapshot_every=every
    )
    await partition.recover()
    return partition, factory


async def write_history(partition: Partition, filler: int) -> None:
    await partition.publish(b"c", "", COMMITTED)
    await partition.publish(b"a", "", ABORTED)
    await partition.publish(b"o", "", OPEN)
    await partition.end_txn(COMMITTED, commit=True)
    await partition.end_txn(ABORTED, commit=False, deadline_ms=now_ms() + 600_000)
    for i in range(filler):
        await partition.publish(f"m{i}".encode(), "", None)


def assert_outcomes(partition: Partition) -> None:
    assert partition.buffer.outcome(COMMITTED) is TxnOutcome.COMMITTED
    assert partition.buffer.outcome(ABORTED) is TxnOutcome.ABORTED
    assert partition.buffer.outcome(OPEN) is TxnOutcome.OPEN
    assert not partition.buffer.accepts_message(ABORTED)  # still fences zombies after the restart
    assert partition.buffer.ongoing >= 1


async def test_recovery_replays_only_entries_after_the_snapshot(tmp_path: Path) -> None:
    partition, factory = await open_partition(tmp_path, every=10)
    path = snapshots.snapshot_path(tmp_path / "snapshots", TOPIC)
    await write_history(partition, filler=100)
    deadline = time.monotonic() + 30
    while not path.exists():  # taken on its own every 10 entries, in the background
        assert time.monotonic() < deadline, "no periodic snapshot was written"
        await asyncio.sleep(0.01)
    assert await partition.write_snapshot()
    await partition.end_txn(LATE, commit=False)  # after the last snapshot
    await factory.close()  # no close(): as after a crash, the marker is only in the ledger
    partition, factory = await open_partition(tmp_path, every=10)
    assert partition.replayed_entries == 1  # only LATE's marker, not the 105 entries before it
    assert_outcomes(partition)
    assert partition.buffer.outcome(LATE) is TxnOutcome.ABORTED  # from the replay after the snapshot
    await partition.close()
    await factory.close()
    partition, factory = await open_partition(tmp_path, every=10)
    assert partition.replayed_entries == 0  # a clean close snapshots everything
    assert_outcomes(partition)
    assert partition.buffer.outcome(LATE) is TxnOutcome.ABORTED
    await factory.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-topic", "ahead"])
async def test_an_unusable_snapshot_is_rebuilt_by_a_full_replay(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    partition, factory = await open_partition(tmp_path)
    await write_history(partition, filler=20)
    await partition.close()
    await factory.close()
    path = snapshots.snapshot_path(tmp_path / "snapshots", TOPIC)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-5] ^= 0x01
        path.write_bytes(bytes(raw))
    elif damage == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        loaded = snapshots.read(path, TOPIC)
        assert loaded is not None
        if damage == "other-topic":
            wrong = snapshots.BufferSnapshot("persistent://t/ns/other", loaded.covers, b"", [])
        else:  # claims entries the ledger does not have, and says every txn is committed
            wrong = snapshots.BufferSnapshot(
                TOPIC,
                Position(loaded.covers.ledger_id + 5, 0),
                snapshots.pack_ended([snapshots.EndedTxn(ABORTED, True, loaded.covers, 0)]),
                [],
            )
        snapshots.write(path, wrong)
    with caplog.at_level(logging.WARNING):
        partition, factory = await open_partition(tmp_path)
    assert partition.replayed_entries == 25  # everything: the snapshot was not used
    assert_outcomes(partition)
    assert any(str(path) in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    await factory.close()


async def test_outcomes_trimmed_since_the_snapshot_are_forgotten_but_fenced(tmp_path: Path) -> None:
    partition, factory = await open_partition(tmp_path, per_ledger=4)
    await write_history(partition, filler=10)
    await partition.close()  # the snapshot still lists COMMITTED and ABORTED
    cursor = await partition.ledger.open_cursor("sub")  # type: ignore[attr-defined]
    await cursor.mark_delete(partition.ledger.last_confirmed_entry())
    await partition.ledger.trim()  # their markers' ledgers are gone, the snapshot is older
    await factory.close()
    partition, factory = await open_partition(tmp_path, per_ledger=4)
    assert ABORTED not in partition.buffer.ended_ids()  # forgotten with its ledger
    assert partition.late_fence.holds(ABORTED)  # its deadline has not passed: still refused
    assert partition.buffer.ended_count == 0
    await factory.close()


def test_snapshot_round_trip_and_shape_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.snapshot"
    rows = [
        snapshots.EndedTxn(COMMITTED, True, Position(3, 2), 9),
        snapshots.EndedTxn(TxnID(2**64 - 1, 2**63), False, Position(2**40, 5), 2**62),  # a block's id
    ]
    opened = [(OPEN, Position(3, 1)), (LATE, None)]  # LATE's first message not durable yet
    snap = snapshots.BufferSnapshot(TOPIC, Position(3, 7), snapshots.pack_ended(rows), opened, [], 12)
    snapshots.write(path, snap)
    loaded = snapshots.read(path, TOPIC)
    assert loaded == snap and list(snapshots.unpack_ended(loaded.ended)) == rows
    assert snapshots.read(tmp_path / "missing", TOPIC) is None
    good = snapshots.encode_body(snap)
    row = bytearray(snapshots.pack_ended(rows[:1]))
    negative = bytearray(row)
    negative[40] = 0x80  # the deadline's sign byte
    flag = bytearray(row)
    flag[16] = 2
    for ended, problem in [
        (["!!!!"], r"ended\[0\] is not base64"),
        ([base64.b64encode(bytes(row[:-1])).decode()], r"ended\[0\]: 40 bytes are not whole 41-byte rows"),
        ([base64.b64encode(bytes(flag)).decode()], "committed flag is neither 0 nor 1"),
        (["", base64.b64encode(bytes(negative)).decode()], r"ended\[1\]: .*negative"),
        ([[1, 1, 1, 3]], r"ended\[0\] must be a string"),
    ]:
        statefile.write(path, snapshots.KIND, snapshots.VERSION, {**good, "ended": ended})
        with pytest.raises(snapshots.SnapshotError, match=r"s\.snapshot.*" + problem):
            snapshots.read(path, TOPIC)


def test_version_2_snapshots_with_json_rows_are_still_read(tmp_path: Path) -> None:
    path = tmp_path / "s.snapshot"
    body = {
        "topic": TOPIC,
        "covers": [3, 7],
        "ended": [[1, 1, 1, 3, 2, 9], [1, 2, 0, 3, 4, 0]],
        "open": [[1, 3]],
        "writers": [],
    }
    statefile.write(path, snapshots.KIND, 2, body)
    loaded = snapshots.read(path, TOPIC)
    assert loaded is not None and loaded.open == [(OPEN, UNKNOWN_FIRST)]  # keeps every ledger
    assert list(snapshots.unpack_ended(loaded.ended)) == [
        snapshots.EndedTxn(COMMITTED, True, Position(3, 2), 9),
        snapshots.EndedTxn(ABORTED, False, Position(3, 4), 0),
    ]
    statefile.write(path, snapshots.KIND, 2, {**body, "ended": [[1, 1, 1, 3]]})
    with pytest.raises(snapshots.SnapshotError, match=r"s\.snapshot.*ended\[0\] must have 6 fields"):
        snapshots.read(path, TOPIC)


WRITER = """
import sys
from pathlib import Path
from txnkeeper.txnid import TxnID
from txnkeeper.ledger.position import Position
from txnkeeper.topic import snapshot as s
path = Path(sys.argv[1])
for n in range(1, 10**9):
    ended = [s.EndedTxn(TxnID(1, i), i % 2 == 0, Position(3, i), 0) for i in range(n % 500)]
    s.write(path, s.BufferSnapshot(sys.argv[2], Position(3, n), s.pack_ended(ended), [(TxnID(2, n), None)]))
    print(n, flush=True)
"""


def test_a_process_killed_while_writing_snapshots_leaves_a_whole_one(tmp_path: Path) -> None:
    """SIGKILL at an arbitrary point of a stream of snapshot writes: the file is always one whole
    snapshot (the previous or the next), never a mix or a torn one."""
    path = snapshots.snapshot_path(tmp_path, TOPIC)
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), TOPIC], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    last = 0
    for line in process.stdout:  # wait until it has replaced the file a number of times
        last = int(line)
        if last >= 30:
            break
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    loaded = snapshots.read(path, TOPIC)
    assert loaded is not None
    n = loaded.covers.entry_id
    assert n >= last  # at least the last write it reported finished
    assert loaded.open == [(TxnID(2, n), None)]  # and all of that one write
    assert len(list(snapshots.unpack_ended(loaded.ended))) == n % 500


async def test_the_snapshot_interval_grows_with_the_outcomes_kept(tmp_path: Path) -> None:
    """A snapshot copies every outcome: with many kept, one is taken every outcomes / 4 entries, not
    every ``snapshot_every``, so snapshots cost a bounded share of the writes."""
    partition, factory = await open_partition(tmp_path, every=10, per_ledger=10_000)
    path = snapshots.snapshot_path(tmp_path / "snapshots", TOPIC)
    for i in range(200):  # 200 outcomes (aborted ones are kept), then a snapshot covering them
        txn = TxnID(7, i)
        await partition.publish(b"m", "", txn)
        await partition.end_txn(txn, commit=False)
    assert await partition.write_snapshot()

    def identity() -> tuple[int, int]:  # a new snapshot is a new file renamed into place
        stat = path.stat()
        return stat.st_ino, stat.st_mtime_ns

    written = identity()
    for i in range(40):  # 40 entries: past `every`, under 200 / 4
        await partition.publish(f"p{i}".encode(), "", None)
    await asyncio.sleep(0)
    assert partition._snapshot_task is None or partition._snapshot_task.done()
    assert identity() == written, "a snapshot was taken before outcomes / 4 entries"
    for i in range(20):  # 60 entries since: past 200 / 4
        await partition.publish(f"q{i}".encode(), "", None)
    deadline = time.monotonic() + 30
    while identity() == written:
        assert time.monotonic() < deadline, "no snapshot after outcomes / 4 entries"
        await asyncio.sleep(0.01)
    await partition.close()
    await factory.close()
