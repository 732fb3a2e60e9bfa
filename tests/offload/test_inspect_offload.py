"""``txnkeeper inspect-offload``: decodes real segment objects; damage is reported, not hidden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper.cli import main
from txnkeeper.ledger.offload import FileSystemBlobStore, OffloadConfig, SegmentWriter, data_key, index_key

CONFIG = OffloadConfig(fileSystemURI="/unused", managedLedgerOffloadMaxBlockSizeInBytes=256)


async def segment(tmp_path: Path) -> tuple[Path, Path]:
    writer = SegmentWriter(FileSystemBlobStore(tmp_path), CONFIG)
    for i in range(20):
        await writer.add_entry(4, i, bytes([i]) * 30)
    await writer.add_entry(9, 0, b"last")
    seg = await writer.finish()
    return tmp_path / data_key(seg.uuid), tmp_path / index_key(seg.uuid)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["inspect-offload", *args])
    out, err = capsys.readouterr()
    return code, out, err


async def test_index_and_data_objects_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, idx = await segment(tmp_path)
    code, out, _ = run(capsys, str(idx))
    assert code == 0
    report = json.loads(out)
    assert report["kind"] == "index"
    assert [led["ledger_id"] for led in report["ledgers"]] == [4, 9]
    assert report["ledgers"][0]["entries"] == 20

    code, out, _ = run(capsys, str(data), "--index", str(idx), "--show-data")
    assert code == 0
    report = json.loads(out)
    assert report["kind"] == "data" and report["problem"] is None
    assert sum(b["entry_count"] for b in report["blocks"]) == 21
    assert all(b["crc_check"] == "ok" for b in report["blocks"])
    assert report["blocks"][-1]["entries"] == [{"entry_id": 0, "length": 4, "hex": b"last".hex()}]


async def test_damage_is_reported_with_a_failing_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, idx = await segment(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[256 + 128 + 20] ^= 0xFF  # entry data of part 2: only the CRC can tell
    data.write_bytes(bytes(raw))
    code, out, _ = run(capsys, str(data), "--index", str(idx))
    assert code == 1
    checks = [b["crc_check"] for b in json.loads(out)["blocks"]]
    assert checks[1].startswith("MISMATCH") and checks[0] == "ok"

    raw[256 + 4] ^= 0xFF  # part 2's header length: the walk stops there, naming the offset
    data.write_bytes(bytes(raw))
    code, out, _ = run(capsys, str(data))
    assert code == 1
    assert json.loads(out)["problem"].startswith("at object offset 260: block header length")


async def test_files_that_are_not_offload_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"hello world")
    code, _, err = run(capsys, str(junk))
    assert code == 2
    assert "magic 0x68656C6C is neither a PIP-76 data block" in err
    code, _, err = run(capsys, str(tmp_path / "missing"))
    assert code == 2 and "cannot read" in err
