"""The coordinator's begin + register (NewTxn naming partitions/subscriptions), as pure logic."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_runtime_units import make_coordinator

from txnkeeper.errors import BadRequestError
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as meta_pb


async def test_begin_logs_its_adds_right_behind_new_and_commit_reaches_them(tmp_path: Path) -> None:
    coordinator, log, sink = make_coordinator(tmp_path, [1_000])
    coordinator.recover([])
    txn = await coordinator.new_txn(5_000, ["t1"], [("t0", "sub")], "s:1")
    op = meta_pb.TransactionMetadataEntry
    assert [r.metadata_op for r in log.records] == [op.NEW, op.ADD_PARTITION, op.ADD_SUBSCRIPTION]
    assert all(r.txnid_least_bits == txn.least for r in log.records)
    assert list(log.records[1].partitions) == ["t1"]
    # Registered for real: adding them again writes nothing, and the commit is delivered to both.
    await coordinator.add_partitions(txn, ["t1"], "s:1")
    assert len(log.records) == 3
    await coordinator.end_txn(txn, commit=True)
    assert sorted(sink.ends) == [("t0/sub", txn, True), ("t1", txn, True)]
    await coordinator.close()


async def test_a_failed_begin_adopts_nothing_and_bad_names_are_refused(tmp_path: Path) -> None:
    coordinator, log, _sink = make_coordinator(tmp_path, [1_000])
    coordinator.recover([])
    log.fail = True
    with pytest.raises(OSError, match="disk gone"):
        await coordinator.new_txn(5_000, ["t1"], [], "s:1")
    assert coordinator.ongoing_count == 0
    log.fail = False
    with pytest.raises(BadRequestError, match="non-empty names"):
        coordinator.new_txn(5_000, ["t1"], [("t1", "")], "s:1")
    with pytest.raises(BadRequestError, match="needs store_address"):
        coordinator.new_txn(5_000, ["t1"], [], "")
    assert log.records == []
    await coordinator.close()
