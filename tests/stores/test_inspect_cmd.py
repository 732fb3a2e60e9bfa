"""``txnkeeper inspect`` decodes stored entries and raw bytes of both logs into JSON, with clear errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.bufferedwriter import BATCH_HEADER, BatchedWriteConfig, WritePosition
from txnkeeper.cli import main
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.txnlog import TransactionLogStore, TxnID

from .helpers import ack, add_subscription, new_txn, update


def write_entries(data_dir: Path) -> tuple[list[WritePosition], WritePosition, WritePosition]:
    async def go() -> tuple[list[WritePosition], WritePosition, WritePosition]:
        factory = ManagedLedgerFactory(data_dir, io_threads=1)
        store = await TransactionLogStore.open(
            factory, 2, BatchedWriteConfig(enabled=True, max_records=3, flush_mode="delay")
        )
        batch = list(
            await asyncio.gather(
                store.append(new_txn(2, 1, owner="alice")),
                store.append(add_subscription(2, 1, "persistent://t/ns/a", "sub")),
                store.append(update(2, 3, tm.OPEN, tm.ABORTING)),
            )
        )
        await store.delete_txn(TxnID(2, 3))
        await store.configure(BatchedWriteConfig(enabled=False))
        plain = await store.append(new_txn(2, 2))
        await store.close()
        acks = await PendingAckStore.open(factory, "persistent://t/ns/a", "sub")
        ack_pos = await acks.append(ack(1, 10, 20, most=2))
        await acks.close()
        await factory.close()
        return batch, plain, ack_pos

    return asyncio.run(go())


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["inspect", *args])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def test_stored_batched_and_plain_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch, plain, ack_pos = write_entries(tmp_path)
    pos = f"{batch[0].ledger_id}:{batch[0].entry_id}"
    code, report, _ = run_cli(
        capsys, "--data-dir", str(tmp_path), "--log", "__transaction_log_2", "--position", pos
    )
    assert code == 0 and report is not None
    assert report["batched"] is True and report["batchVersion"] == 1 and report["batchSize"] == 3
    records = report["records"]
    assert isinstance(records, list)
    assert [r["metadata_op"] for r in records] == ["NEW", "ADD_SUBSCRIPTION", "UPDATE"]
    assert report["cursors"] == {
        "transaction.subscription": {"entryDeleted": False, "deletedBatchIndexes": [2]}
    }, "index 2 (txn (2,3), deleted) shows as deleted"
    assert records[0]["owner"] == "alice" and records[0]["txnId"] == "(2,1)" and records[0]["index"] == 0
    assert records[1]["subscriptions"] == [{"topic": "persistent://t/ns/a", "subscription": "sub"}]
    assert records[2]["new_status"] == "ABORTING" and records[2]["txnId"] == "(2,3)"
    assert records[0]["start_time"] == 1_700_000_000_001, "64-bit numbers stay JSON numbers"

    code, report, _ = run_cli(
        capsys,
        "--data-dir",
        str(tmp_path),
        "--log",
        "__transaction_log_2",
        "--position",
        f"{plain.ledger_id}:{plain.entry_id}",
    )
    assert report is not None
    assert report == {
        "kind": "txnlog",
        "log": "__transaction_log_2",
        "position": f"{plain.ledger_id}:{plain.entry_id}",
        "sizeBytes": len(new_txn(2, 2).SerializeToString()),
        "batched": False,
        "batchVersion": None,
        "batchSize": 0,
        "records": [report["records"][0]],
        "cursors": {"transaction.subscription": {"entryDeleted": False, "deletedBatchIndexes": []}},
    }

    log = "persistent://t/ns/a-sub__transaction_pending_ack"
    code, report, _ = run_cli(
        capsys,
        "--data-dir",
        str(tmp_path),
        "--log",
        log,
        "--position",
        f"{ack_pos.ledger_id}:{ack_pos.entry_id}",
    )
    assert code == 0 and report is not None and report["kind"] == "pendingack"
    (rec,) = report["records"]
    assert rec["pending_ack_op"] == "ACK" and rec["ack_type"] == "Individual" and rec["txnId"] == "(2,1)"
    assert rec["pending_ack_metadata"] == [{"ledgerId": 10, "entryId": 20}]


def test_raw_bytes_from_hex_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = (
        BATCH_HEADER
        + tm.BatchedTransactionMetadataEntry(transaction_logs=[new_txn(0, 9)]).SerializeToString()
    )
    code, report, _ = run_cli(capsys, "--kind", "txnlog", "--hex", entry.hex(" "))
    assert code == 0 and report is not None and report["batchSize"] == 1
    path = tmp_path / "entry.bin"
    path.write_bytes(new_txn(0, 9).SerializeToString())
    code, report, _ = run_cli(capsys, "--kind", "txnlog", "--file", str(path))
    assert code == 0 and report is not None and report["batched"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hex", "0a00"], "say which records the entry holds: --kind"),
        (["--kind", "txnlog", "--hex", "zz"], "not valid hexadecimal"),
        (["--kind", "txnlog", "--hex", "0e010003"], "version 3"),
        (["--kind", "pendingack", "--hex", "ffff"], "not a valid PendingAckMetadataEntry"),
        (["--kind", "txnlog", "--position", "1:0"], "needs --data-dir and --log"),
        (["--kind", "txnlog", "--file", "/nonexistent/entry"], "cannot read --file"),
    ],
)
def test_bad_input_is_a_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, *args)
    assert code == 1
    assert message in err


def test_missing_log_and_position_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_entries(tmp_path)
    code, _, err = run_cli(
        capsys, "--data-dir", str(tmp_path), "--log", "__transaction_log_9", "--position", "0:0"
    )
    assert code == 1 and "no managed ledger '__transaction_log_9'" in err and "__transaction_log_2" in err
    code, _, err = run_cli(
        capsys, "--data-dir", str(tmp_path), "--log", "__transaction_log_2", "--position", "0:99"
    )
    assert code == 1 and "no entry at 0:99" in err
    code, _, err = run_cli(
        capsys, "--data-dir", str(tmp_path), "--log", "__transaction_log_2", "--position", "x"
    )
    assert code == 1 and "ledgerId:entryId" in err
