"""Transaction log snapshots (coordinator/snapshot.py) on the real managed ledger: a restart from a
snapshot plus the records after it rebuilds exactly what a full replay rebuilds, whatever happened
after the capture (more records, deletions, an interrupted deletion, trimmed ledgers, a crash), and a
file that cannot be used is ignored, naming it, for a full replay."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from txnkeeper import statefile
from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.bufferedwriter.writer import pack_position
from txnkeeper.coordinator import snapshot as snapshots
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.stores import StoreSnapshot
from txnkeeper.txnlog import TransactionLogStore, TxnID, TxnLogState, transaction_log_name

from .helpers import add_partition, add_subscription, new_txn, update

BATCH = BatchedWriteConfig(enabled=True, max_records=8, max_delay_millis=1)
HOLD = BatchedWriteConfig(enabled=True, max_records=512, max_delay_millis=60_000, flush_mode="delay")
LOG = transaction_log_name(0)


def view(states: dict[TxnID, TxnLogState]) -> dict[TxnID, tuple[Any, ...]]:
    return {
        t: (
            s.status,
            s.timeout_ms,
            s.start_time,
            s.last_modification_time,
            s.owner,
            s.partitions,
            s.subscriptions,
            s.positions,
            s.complete,
        )
        for t, s in states.items()
    }


async def begin(store: TransactionLogStore, seq: int) -> None:
    await asyncio.gather(
        store.append(new_txn(0, seq, owner=f"client-{seq}")),
        store.append(add_partition(0, seq, f"persistent://t/ns/p{seq % 3}")),
        store.append(add_subscription(0, seq, "persistent://t/ns/shared", f"sub{seq % 2}")),
    )


async def end(store: TransactionLogStore, seq: int, commit: bool) -> None:
    mid, final = (tm.COMMITTING, tm.COMMITTED) if commit else (tm.ABORTING, tm.ABORTED)
    await store.append(update(0, seq, tm.OPEN, mid))
    await store.append(update(0, seq, mid, final))


async def full_replay(factory: ManagedLedgerFactory) -> dict[TxnID, tuple[Any, ...]]:
    store = await TransactionLogStore.open(factory, 0, BATCH)
    try:
        return view(await store.replay())
    finally:
        await store.close()


async def from_snapshot(factory: ManagedLedgerFactory, path: Path) -> tuple[dict[TxnID, Any], int]:
    snapshot = snapshots.read(path, LOG)
    assert snapshot is not None, "the snapshot file must be usable here"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True, snapshot=snapshot)
    try:
        return view(await store.replay()), store.replayed_records
    finally:
        await store.close()


async def capture(store: TransactionLogStore, path: Path) -> None:
    await asyncio.to_thread(snapshots.write, path, store.name, store.capture_snapshot())


async def test_snapshot_plus_tail_equals_a_full_replay_after_more_records_and_deletions(
    factory: ManagedLedgerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    await asyncio.gather(*(begin(store, seq) for seq in range(1, 41)))
    await asyncio.gather(*(end(store, seq, seq % 2 == 0) for seq in range(1, 11)))
    await store.delete_txns([TxnID(0, seq) for seq in range(1, 6)])  # deleted before the capture
    await store.append(update(0, 11, tm.OPEN, tm.COMMITTING))  # a decision the snapshot holds
    await capture(store, path)
    # After the capture: new transactions, changes to captured ones, deletions of captured ones.
    await asyncio.gather(*(begin(store, seq) for seq in range(41, 51)))
    await store.append(add_partition(0, 12, "persistent://t/ns/late"))
    await end(store, 13, commit=True)
    await store.delete_txns([TxnID(0, seq) for seq in (6, 7, 13, 45)])
    await store.close(flush=False)  # a crash: no snapshot at close

    expected = await full_replay(factory)
    got, replayed = await from_snapshot(factory, path)
    assert got == expected
    assert expected[TxnID(0, 11)][0] == tm.COMMITTING
    assert "persistent://t/ns/late" in got[TxnID(0, 12)][5]
    assert TxnID(0, 13) not in got and TxnID(0, 3) not in got
    assert 0 < replayed < 40, "only the records after the snapshot are replayed"


async def test_records_not_yet_durable_are_not_in_the_snapshot(
    factory: ManagedLedgerFactory, tmp_path: Path
) -> None:
    """A decision whose record is still buffered when the snapshot is captured, then lost in a crash,
    must not come back from the snapshot (the coordinator told its client the end failed)."""
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    await begin(store, 1)
    await store.configure(HOLD)
    pending = store.append(update(0, 1, tm.OPEN, tm.COMMITTING))  # buffered for a minute
    await capture(store, path)
    await store.close(flush=False)
    with pytest.raises(Exception, match="closed"):
        await pending

    got, replayed = await from_snapshot(factory, path)
    assert got == await full_replay(factory)
    assert got[TxnID(0, 1)][0] == tm.OPEN
    assert replayed == 0


async def test_a_deletion_interrupted_after_the_capture_is_rebuilt_as_a_full_replay_would(
    factory: ManagedLedgerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    for seq in (1, 2, 3):
        await begin(store, seq)
    await end(store, 2, commit=True)
    await capture(store, path)
    # A crash in the middle of deleting txn 2: its NEW record (the first) went, the others stayed.
    first = store.txn_positions(TxnID(0, 2))[0]
    await store._log.delete_packed([pack_position(*first)])
    await store.close(flush=False)

    expected = await full_replay(factory)
    got, _ = await from_snapshot(factory, path)
    assert got == expected
    assert got[TxnID(0, 2)][8] is False, "the NEW record is gone: the transaction only needs deleting"
    assert first not in got[TxnID(0, 2)][7]


async def test_a_snapshot_older_than_trimmed_ledgers_is_still_right(
    factory: ManagedLedgerFactory, tmp_path: Path
) -> None:
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    for seq in range(1, 6):
        await begin(store, seq)
    await capture(store, path)
    old_ledgers = store.ledger_ids()
    for seq in range(1, 6):
        await end(store, seq, commit=True)
    await store.delete_txns([TxnID(0, seq) for seq in range(1, 6)])
    await store.rollover()
    await begin(store, 6)
    await store.trim()
    assert not set(old_ledgers) & set(store.ledger_ids()), "the snapshot's ledgers must be trimmed"
    await store.close()

    got, _ = await from_snapshot(factory, path)
    assert got == await full_replay(factory)
    assert list(got) == [TxnID(0, 6)]


async def test_capture_during_a_deletion_keeps_the_transaction_until_the_deletion_is_durable(
    factory: ManagedLedgerFactory, tmp_path: Path
) -> None:
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    await begin(store, 1)
    await end(store, 1, commit=False)
    deleting = asyncio.ensure_future(store.delete_txns([TxnID(0, 1)]))
    await asyncio.sleep(0)  # one loop turn: the deletion takes the records and starts the cursor write
    assert store._deleting and not deleting.done(), "the capture must happen while the deletion is in flight"
    during = store.capture_snapshot()
    await deleting
    after = store.capture_snapshot()
    await store.close()
    assert [t for t, _, _ in during.txns] == [TxnID(0, 1)]
    assert during.txns[0][1].status == tm.ABORTED
    assert len(during.txns[0][2]) == 5 and during.txns[0][1].packed == during.txns[0][2]
    assert after.txns == []


def write_raw(path: Path, body: Any, version: int = snapshots.SNAPSHOT_VERSION) -> None:
    statefile.write(path, snapshots.SNAPSHOT_KIND, version, body)


async def test_unusable_snapshot_files_are_ignored_naming_the_file(
    factory: ManagedLedgerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    await begin(store, 1)
    await capture(store, path)
    await store.close()
    good = path.read_bytes()
    body = statefile.decode(good, path, snapshots.SNAPSHOT_KIND, frozenset({1})).body

    damaged = bytearray(good)
    damaged[-10] ^= 0x01
    cases: list[tuple[str, bytes | None, str]] = [
        ("bit flip", bytes(damaged), "checksum mismatch"),
        ("truncated", good[:-7], "body bytes"),
        ("another log", None, "not of '__transaction_log_0'"),
        ("newer version", None, "version 9"),
        ("bad column", None, "column 'status'"),
    ]
    for what, raw, message in cases:
        if raw is not None:
            path.write_bytes(raw)
        elif what == "another log":
            write_raw(path, {**body, "log": transaction_log_name(7)})
        elif what == "newer version":
            write_raw(path, body, version=9)
        else:
            write_raw(path, {**body, "status": ["OPEN"]})
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert snapshots.read(path, LOG) is None, what
        assert str(path) in caplog.text and message in caplog.text, (what, caplog.text)
        assert "replayed in full" in caplog.text


async def test_a_snapshot_covering_more_than_the_log_is_ignored(
    factory: ManagedLedgerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "0.snapshot"
    store = await TransactionLogStore.open(factory, 0, BATCH, snapshots=True)
    await begin(store, 1)
    snapshot = store.capture_snapshot()
    await store.close()
    assert snapshot.covers is not None
    ahead: StoreSnapshot[TxnLogState] = StoreSnapshot((snapshot.covers[0], snapshot.covers[1] + 100), [])
    snapshots.write(path, LOG, ahead)
    with caplog.at_level(logging.WARNING):
        got, replayed = await from_snapshot(factory, path)
    assert str(path) in caplog.text and "replaying the log in full" in caplog.text
    assert got == await full_replay(factory) and TxnID(0, 1) in got
    assert replayed == 3
