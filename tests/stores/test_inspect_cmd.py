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
from txnkeeper.ledger.metadata import ManagedLedgerMetadata
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


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes and every entry's mtime under ``root`` (directories too: new names show)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def test_inspect_never_changes_the_inspected_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 11.3: a crashed pod's volume (last ledger still open, a torn tail after it) is exactly
    # what opening a ledger would repair: meta.json rewritten, the tail cut, LOCK and a ledger created.
    batch, plain, _ = write_entries(tmp_path)
    log_dir = tmp_path / "__transaction_log_2"
    meta = ManagedLedgerMetadata.decode((log_dir / "meta.json").read_bytes(), log_dir / "meta.json")
    meta.ledgers[-1].closed = False
    (log_dir / "meta.json").write_bytes(meta.encode())
    ledger_file = log_dir / "ledgers" / f"{plain.ledger_id:020d}.ledger"
    with ledger_file.open("ab") as f:
        f.write(b"\x01\x02\x03")  # an incomplete record header: what a killed append leaves
    (log_dir / "LOCK").unlink(missing_ok=True)
    before = snapshot(tmp_path)
    for position in (batch[0], plain):
        code, report, err = run_cli(
            capsys,
            "--data-dir",
            str(tmp_path),
            "--log",
            "__transaction_log_2",
            "--position",
            f"{position.ledger_id}:{position.entry_id}",
        )
        assert code == 0 and report is not None, err
        assert "incomplete record header" in report["tornTails"][0], "reported, not cut"
    assert snapshot(tmp_path) == before, "no byte, mtime or name changed"


def test_inspect_refuses_a_corrupt_stored_entry_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, plain, _ = write_entries(tmp_path)
    ledger_file = tmp_path / "__transaction_log_2" / "ledgers" / f"{plain.ledger_id:020d}.ledger"
    raw = bytearray(ledger_file.read_bytes())
    raw[-1] ^= 0xFF  # the last record's data, complete: corruption, never a torn tail
    ledger_file.write_bytes(bytes(raw))
    code, _, err = run_cli(
        capsys,
        "--data-dir",
        str(tmp_path),
        "--log",
        "__transaction_log_2",
        "--position",
        f"{plain.ledger_id}:{plain.entry_id}",
    )
    assert code == 1 and "Traceback" not in err
    assert f"corrupt entry {plain.entry_id} in ledger {plain.ledger_id}" in err and str(ledger_file) in err


BAD_RECORDS = {
    # Issue 11.7: protobuf hands invalid UTF-8 in a proto2 string field over as bytes (json crashed).
    "invalid UTF-8": ("txnlog", "3201ff", "string field partitions[0] is not valid UTF-8 (bytes ff)"),
    "missing required": (
        "txnlog",
        "3a00",
        "lacks required field(s) subscriptions[0].topic, subscriptions[0].subscription",
    ),
    "missing required (pending ack)": ("pendingack", "2a00", "lacks required field(s)"),
    "truncated varint": ("txnlog", "08ff", "not a valid TransactionMetadataEntry"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS), ids=list(BAD_RECORDS))
def test_undecodable_records_are_reported_not_crashed_on(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kind, entry, message = BAD_RECORDS[case]
    code = main(["inspect", "--kind", kind, "--hex", entry])
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    assert "record 0: " in captured.err and message in captured.err
    report = json.loads(captured.out)
    assert report["records"] == [{"index": 0, "error": report["records"][0]["error"]}]


def test_one_bad_record_in_a_batch_is_reported_in_its_place(capsys: pytest.CaptureFixture[str]) -> None:
    good = new_txn(0, 9).SerializeToString()
    bad = bytes.fromhex("3201ff")
    entry = BATCH_HEADER + b"".join(bytes([0x0A, len(r)]) + r for r in (good, bad, good))
    code = main(["inspect", "--kind", "txnlog", "--hex", entry.hex()])
    captured = capsys.readouterr()
    assert code == 1
    report = json.loads(captured.out)
    assert report["batchSize"] == 3
    assert [r.get("txnId") for r in report["records"]] == ["(0,9)", None, "(0,9)"]
    assert "not valid UTF-8" in report["records"][1]["error"]
    assert "record 1: string field partitions[0]" in captured.err


def test_bad_batch_framing_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--kind", "txnlog", "--hex", (BATCH_HEADER + b"\x0a\xff").hex())
    assert code == 1 and "truncated or overlong varint (length of record 0)" in err


def test_inspect_reads_a_directory_a_live_process_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No lock is taken (taking it would create LOCK and refuse a live pod's volume); reads are O_RDONLY.
    _, plain, _ = write_entries(tmp_path)

    async def inspect_while_open() -> tuple[int, dict[str, Any] | None, str]:
        factory = ManagedLedgerFactory(tmp_path, io_threads=1)
        try:
            await factory.open("__transaction_log_2")  # holds the directory lock
            return run_cli(
                capsys,
                "--data-dir",
                str(tmp_path),
                "--log",
                "__transaction_log_2",
                "--position",
                f"{plain.ledger_id}:{plain.entry_id}",
            )
        finally:
            await factory.close()

    code, report, err = asyncio.run(inspect_while_open())
    assert code == 0 and report is not None, err
    assert report["batched"] is False and report["records"][0]["txnId"] == "(2,2)"
