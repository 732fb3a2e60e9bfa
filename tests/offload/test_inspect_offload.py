"""``txnkeeper inspect-offload``: decodes real segment objects; damage is reported, not hidden."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from txnkeeper.cli import main
from txnkeeper.ledger.offload import (
    FileSystemBlobStore,
    OffloadConfig,
    OffloadCorruptionError,
    SegmentReader,
    SegmentWriter,
    data_key,
    index_key,
)
from txnkeeper.ledger.offload import index as index_format
from txnkeeper.ledger.offload.index import LedgerIndex, OffloadIndex

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
    idx.rename(tmp_path / "elsewhere")  # no index beside the data object: a walk by block headers
    code, out, _ = run(capsys, str(data))
    assert code == 1
    report = json.loads(out)
    assert report["problem"].startswith("at object offset 260: block header length")
    assert report["index"] is None and "pass --index" in report["unchecked"]


async def test_files_that_are_not_offload_objects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"hello world")
    code, _, err = run(capsys, str(junk))
    assert code == 2
    assert "magic 0x68656C6C is neither a PIP-76 data block" in err
    code, _, err = run(capsys, str(tmp_path / "missing"))
    assert code == 2 and "cannot read" in err


def _reindex(idx_path: Path, change: Callable[[OffloadIndex], OffloadIndex]) -> None:
    idx = index_format.decode(idx_path.read_bytes())
    new = change(idx)
    idx_path.write_bytes(index_format.encode(new.data_object_length, new.ledgers))


def _first_ledger(idx: OffloadIndex, change: Callable[[LedgerIndex], LedgerIndex]) -> OffloadIndex:
    return replace(idx, ledgers=(change(idx.ledgers[0]), *idx.ledgers[1:]))


def _later_second_block(led: LedgerIndex) -> LedgerIndex:
    second = led.entries[1]
    entries = (led.entries[0], replace(second, first_entry_id=second.first_entry_id + 1), *led.entries[2:])
    return replace(led, entries=entries)


def _no_crcs(led: LedgerIndex) -> LedgerIndex:
    return replace(led, info=replace(led.info, properties=()))


def _one_more_entry(led: LedgerIndex) -> LedgerIndex:
    assert led.info.entries is not None
    return replace(led, info=replace(led.info, entries=led.info.entries + 1))


def _cut(at: Callable[[int], int]) -> Callable[[Path, Path], None]:
    def damage(data: Path, _: Path) -> None:
        with open(data, "r+b") as f:
            f.truncate(at(data.stat().st_size))

    return damage


def _flip(offset: int) -> Callable[[Path, Path], None]:
    def damage(data: Path, _: Path) -> None:
        raw = bytearray(data.read_bytes())
        raw[offset] ^= 0x01
        data.write_bytes(bytes(raw))

    return damage


DAMAGE: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "cut on a block boundary": (_cut(lambda n: n // 512 * 256), "index says the data object is"),
    "cut inside a block": (_cut(lambda n: n - 100), "index says the data object is"),
    "grown": (lambda d, _: _append(d, 256), "index says the data object is"),
    "a bit of entry data": (_flip(256 + 128 + 20), "block CRC-32 is"),
    "the index names a later first entry": (
        lambda _, i: _reindex(i, lambda x: _first_ledger(x, _later_second_block)),
        "are missing",
    ),
    "the index records no CRC": (
        lambda _, i: _reindex(i, lambda x: _first_ledger(x, _no_crcs)),
        "the index records no CRC for this block",
    ),
    "the index promises an entry no block holds": (
        lambda _, i: _reindex(i, lambda x: _first_ledger(x, _one_more_entry)),
        "entries 20..20 are missing",
    ),
    "the index's length field": (lambda _, i: _flip_at(i, 7), "index says it is"),
}


def _append(path: Path, count: int) -> None:
    with open(path, "ab") as f:
        f.write(bytes(count))


def _flip_at(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_what_the_pods_reader_refuses_inspection_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """One set of checks: for each kind of damage the reader refuses the segment, and inspect-offload
    (data object with its index beside it, with --index, and the index object) exits 1 naming the
    same problem in the same words."""
    data, idx = await segment(tmp_path)
    harm, expected = DAMAGE[damage]
    harm(data, idx)
    store = FileSystemBlobStore(tmp_path)
    reader = SegmentReader(store, data.name)
    with pytest.raises(OffloadCorruptionError) as refused:
        await reader.read_entries(4, 0, 19)
        await reader.read_entries(9, 0, 0)
    assert expected in str(refused.value)
    for args in ((str(data),), (str(data), "--index", str(idx)), (str(idx),)):
        code, out, err = run(capsys, *args)
        assert code == 1, (args, out, err)
        report = json.loads(out)
        assert str(refused.value) in report["problems"], (args, report["problems"])


async def test_a_segment_without_crcs_passes_with_allow_missing_crc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, idx = await segment(tmp_path)
    _reindex(idx, lambda x: replace(x, ledgers=tuple(_no_crcs(led) for led in x.ledgers)))
    code, out, _ = run(capsys, str(data))
    assert code == 1 and "no CRC" in json.loads(out)["problem"]
    code, out, _ = run(capsys, str(data), "--allow-missing-crc")
    assert code == 0, out
    assert (
        len(
            await SegmentReader(FileSystemBlobStore(tmp_path), data.name, require_crc=False).read_entries(
                4, 0, 19
            )
        )
        == 20
    )
