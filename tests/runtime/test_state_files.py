"""The state-file format itself, and the coordinator's and store pod's state files that use it.

Sequence reservations, the route table and the subscription registry are real files written through
the real code paths; each refusal must name the file and say what is wrong.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from runtime_pods import ServePod

from txnkeeper import statefile
from txnkeeper.contract.admin import AdminClient
from txnkeeper.coordinator.routes import RouteTable
from txnkeeper.coordinator.sequence import SequenceAllocator
from txnkeeper.fleet.group import COORDINATOR, MemberGroup
from txnkeeper.statefile import StateFileError
from txnkeeper.topic.registry import load_registry, save_registry
from txnkeeper_operator.engine import DowngradeProgress, Progress
from txnkeeper_operator.engine.persist import progress_to_status

MASKS = (0x01, 0x10, 0x40, 0x80)
V1 = frozenset({1})


def refused(path: Path, load: Callable[[], object], match: str) -> str:
    with pytest.raises(StateFileError, match=match) as info:
        load()
    message = str(info.value)
    assert str(path) in message, message
    return message


# --- the format ---------------------------------------------------------------------------------------


def test_round_trip_and_header(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "x.state"
    statefile.write(path, "demo", 3, {"a": [1, "é"], "b": None})
    raw = path.read_bytes()
    header, body = raw.split(b"\n", 1)
    assert header.split(b" ")[:4] == [b"txnkeeper-state", b"demo", b"3", str(len(body)).encode()]
    doc = statefile.read(path, "demo", frozenset({3}))
    assert doc is not None and doc.body == {"a": [1, "é"], "b": None} and not doc.legacy
    assert statefile.read(tmp_path / "absent", "demo", V1) is None
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "does not start with the 'txnkeeper-state' header of a demo file"),
        (b"txnkeeper-state demo 1 2", "header line is not terminated"),
        (b"txnkeeper-state demo 1 2\n{}", "does not have 5 fields"),
        (b"txnkeeper-state demo 01 3 00000000\n{}\n", "is malformed"),
        (b"txnkeeper-state demo 1 3 0000000G\n{}\n", "is malformed"),
        (b"txnkeeper-state other 1 3 00000000\n{}\n", "it is a 'other' state file, not a 'demo' one"),
        (b"txnkeeper-state demo 9 3 00000000\n{}\n", "version 9 is not one this release reads"),
        (b"txnkeeper-state demo 1 4 00000000\n{}\n", "promises 4 body bytes, the file has 3"),
        (b"txnkeeper-state demo 1 3 00000000\n{}\n", "checksum mismatch"),
    ],
)
def test_every_damaged_header_is_refused_naming_the_file(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "x.state"
    path.write_bytes(raw)
    refused(path, lambda: statefile.read(path, "demo", V1), match)


def test_upper_case_checksum_digits_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    good = statefile.encode("demo", 1, {"n": 1})
    header, body = good.split(b"\n", 1)
    crc = header.rsplit(b" ", 1)[1]
    if crc.upper() == crc:  # no letter in this checksum: use a body whose checksum has one
        good = statefile.encode("demo", 1, {"n": 2})
        header, body = good.split(b"\n", 1)
        crc = header.rsplit(b" ", 1)[1]
    assert crc.upper() != crc
    path.write_bytes(header.rsplit(b" ", 1)[0] + b" " + crc.upper() + b"\n" + body)
    refused(path, lambda: statefile.read(path, "demo", V1), "is malformed")


def test_checksummed_body_that_is_not_json_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    body = b"{nope\n"
    crc = statefile._checksum("demo", 1, body)
    path.write_bytes(f"txnkeeper-state demo 1 {len(body)} {crc:08x}\n".encode() + body)
    refused(path, lambda: statefile.read(path, "demo", V1), "its body is not JSON")


def test_an_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    path.mkdir()  # reading a directory fails with an OSError other than "not found"
    refused(path, lambda: statefile.read(path, "demo", V1), "it cannot be read")


def test_a_failed_write_leaves_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "x.state"
    statefile.write(path, "demo", 1, {"n": 1})

    class FullDisk(statefile.FileOps):
        def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
            raise OSError(28, "No space left on device (injected)")

        def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
            raise OSError(28, "No space left on device (injected)")

    with pytest.raises(OSError, match="No space left"):
        statefile.write(path, "demo", 1, {"n": 2}, FullDisk())
    doc = statefile.read(path, "demo", V1)
    assert doc is not None and doc.body == {"n": 1}


# --- the sequence file ------------------------------------------------------------------------------


async def test_sequence_reservations_survive_a_restart_and_are_checksummed(tmp_path: Path) -> None:
    path = tmp_path / "coordinator" / "0.sequence"
    sequence = SequenceAllocator(path, block=5)
    sequence.load()
    assert [await sequence.next() for _ in range(7)] == list(range(1, 8))
    assert path.read_bytes().startswith(b"txnkeeper-state txn-sequence 1 ")
    again = SequenceAllocator(path, block=5)
    again.load(floor=7)
    assert await again.next() == 11  # above the ceiling reserved (10), never reused


def test_sequence_reservation_below_an_id_in_the_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0.sequence"
    statefile.write(path, "txn-sequence", 1, {"reservedThrough": 100})
    ok = SequenceAllocator(path)
    ok.load(floor=100)
    assert ok.last == 100
    message = refused(
        path, lambda: SequenceAllocator(path).load(floor=101), "reserves transaction ids only up to 100"
    )
    assert "holds id 101" in message and "restore the file" in message


def test_missing_sequence_file_starts_above_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sequence = SequenceAllocator(tmp_path / "0.sequence")
    sequence.load(floor=42)
    assert sequence.last == 42
    assert f"sequence file {tmp_path / '0.sequence'} is missing" in caplog.text


async def test_previous_release_sequence_file_is_read_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "0.sequence"
    path.write_text("20000")  # exactly what the previous release wrote
    sequence = SequenceAllocator(path, block=10)
    sequence.load(floor=19_999)
    assert path.read_text() == "20000"  # reading alone does not rewrite
    assert await sequence.next() == 20_001
    assert path.read_bytes().startswith(b"txnkeeper-state txn-sequence 1 ")
    again = SequenceAllocator(path)
    again.load()
    assert again.last == 20_010


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"20000\n", "a bare decimal number, not b'20000\\\\n'"),
        (b" 20000", "a bare decimal number"),
        (b"0x10", "a bare decimal number"),
        (b"\xff\xfe", "a bare decimal number"),
    ],
)
def test_sequence_file_of_any_other_shape_is_refused(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "0.sequence"
    path.write_bytes(raw)
    refused(path, lambda: SequenceAllocator(path).load(), match)


def test_sequence_body_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0.sequence"
    for body, match in [
        ({"reservedThrough": "5"}, "reservedThrough must be an integer"),
        ({"reservedThrough": True}, "reservedThrough must be an integer"),
        ({"reservedThrough": -1}, "reservedThrough must be >= 0"),
        ({}, r"missing field\(s\) \['reservedThrough'\]"),
    ]:
        statefile.write(path, "txn-sequence", 1, body)
        refused(path, lambda: SequenceAllocator(path).load(), match)


# --- the route table ---------------------------------------------------------------------------------


async def test_route_table_round_trip_and_previous_release_file(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text(json.dumps({"t1": "store-0:6650"}, sort_keys=True))  # the previous release's shape
    routes = RouteTable(path)
    routes.load()
    assert routes.get("t1") == "store-0:6650"
    await routes.learn(["t2"], "store-1:6650")
    assert path.read_bytes().startswith(b"txnkeeper-state coordinator-routes 1 ")
    again = RouteTable(path)
    again.load()
    assert (again.get("t1"), again.get("t2")) == ("store-0:6650", "store-1:6650")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"t": "a"', "not JSON"),
        (b'{"t": "\xff"}', "not UTF-8: byte 0xff at offset 7"),
        (b'["t"]', "route table must be a JSON object"),
        (b'{"t": 5}', "address of topic 't' must be a string"),
    ],
)
def test_damaged_route_table_is_refused_naming_the_file(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "routes.json"
    path.write_bytes(raw)
    refused(path, RouteTable(path).load, match)


# --- the subscription registry ---------------------------------------------------------------------


def test_registry_round_trip_and_previous_release_file(tmp_path: Path) -> None:
    path = tmp_path / "subscriptions.json"
    assert load_registry(path) == {}
    path.write_text(json.dumps({"t": ["s1", "s2"]}, sort_keys=True))  # the previous release's shape
    assert load_registry(path) == {"t": ["s1", "s2"]}
    save_registry(path, {"t": ["s1", "s2", "s3"]})
    assert path.read_bytes().startswith(b"txnkeeper-state subscription-registry 1 ")
    assert load_registry(path) == {"t": ["s1", "s2", "s3"]}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\xc3\x28", "not UTF-8"),
        (b"[]", "registry must be a JSON object"),
        (b'{"t": "s1"}', "subscriptions of topic 't' must be a JSON array"),
        (b'{"t": [1]}', "subscriptions of topic 't' must be a string"),
    ],
)
def test_damaged_registry_is_refused_naming_the_file(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "subscriptions.json"
    path.write_bytes(raw)
    refused(path, lambda: load_registry(path), match)


# --- every flipped bit of every kind: refused, never a different value ----------------------------------


async def _sequence_file(path: Path) -> Callable[[], object]:
    sequence = SequenceAllocator(path, block=1234)
    sequence.load()
    await sequence.next()

    def load() -> object:
        again = SequenceAllocator(path)
        again.load()
        return again.last

    return load


async def _routes_file(path: Path) -> Callable[[], object]:
    await RouteTable(path).learn(["persistent://t/ns/a", "b"], "store-0.store:6650")

    def load() -> object:
        table = RouteTable(path)
        table.load()
        return table._routes

    return load


async def _registry_file(path: Path) -> Callable[[], object]:
    save_registry(path, {"persistent://t/ns/a": ["s1", "s2"], "b": []})
    return lambda: load_registry(path)


@pytest.mark.parametrize("make", [_sequence_file, _routes_file, _registry_file])
async def test_every_flipped_bit_is_refused(
    tmp_path: Path, make: Callable[[Path], Awaitable[Callable[[], object]]]
) -> None:
    path = tmp_path / "state"
    load = await make(path)
    good = path.read_bytes()
    original = load()
    for offset in range(len(good)):
        for mask in MASKS:
            damaged = bytearray(good)
            damaged[offset] ^= mask
            path.write_bytes(bytes(damaged))
            try:
                value = load()
            except StateFileError as exc:
                assert str(path) in str(exc)
                continue
            assert value == original, f"flip 0x{mask:02x} at {offset} gave a different accepted value"
            pytest.fail(f"flip 0x{mask:02x} at offset {offset} was accepted")


# --- a real pod refuses to start on a damaged state file, saying which -------------------------------


@pytest.mark.parametrize(
    ("role", "relative", "problem"),
    [
        ("coordinator", "coordinator/routes.json", "checksum mismatch"),
        ("store", "store/subscriptions.json", "checksum mismatch"),
        ("coordinator", "coordinator/0.sequence", "checksum mismatch"),
    ],
)
def test_pod_with_a_damaged_state_file_exits_naming_it(
    tmp_path: Path, role: str, relative: str, problem: str
) -> None:
    pod = ServePod(tmp_path, "pod-0", role)
    path = pod.data_dir / relative
    path.parent.mkdir(parents=True)
    kind = {"routes.json": "coordinator-routes", "subscriptions.json": "subscription-registry"}
    body: dict[str, object] = {"reservedThrough": 10}
    if path.name in kind:
        body = {"routes": {"t": "s:1"}} if path.name == "routes.json" else {"topics": {}}
    good = statefile.encode(kind.get(path.name, "txn-sequence"), 1, body)
    path.write_bytes(good[:-3] + bytes([good[-3] ^ 0x01]) + good[-2:])
    with pytest.raises(RuntimeError, match="exited with 1") as info:
        pod.start()
    log = str(info.value)
    assert f"state file {path} is unusable: {problem}" in log, log
    assert "Traceback" not in log


# --- the local fleet's downgrade progress ----------------------------------------------------------------


async def test_fleet_progress_is_checksummed_and_previous_release_file_read(tmp_path: Path) -> None:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    progress = Progress(DowngradeProgress(started, "2.0.0", {"tc-0": {"__transaction_log_0": 7}}))
    async with aiohttp.ClientSession() as session:
        group = MemberGroup(
            "tc",
            COORDINATOR,
            tmp_path,
            tmp_path / "token",
            AdminClient(session, timeout_seconds=10, token=""),
            1,
        )
        assert group.load_progress() == Progress()
        group.save_progress(Progress())  # no downgrade: a null body
        assert group.load_progress() == Progress()
        group.save_progress(progress)
        raw = group.state_file.read_bytes()
        assert raw.startswith(b"txnkeeper-state fleet-downgrade-progress 1 ")
        assert group.load_progress() == progress
        group.state_file.write_text(json.dumps(progress_to_status(progress)))  # previous release
        assert group.load_progress() == progress
        group.state_file.write_bytes(raw[:-2] + bytes([raw[-2] ^ 0x01]) + raw[-1:])
        refused(group.state_file, group.load_progress, "checksum mismatch")
        group.state_file.write_text('{"startedAt": "2026-01-02T03:04:05Z", "rolledOver": [{}]}')
        refused(group.state_file, group.load_progress, "not valid downgrade progress")


@pytest.mark.parametrize(
    "body",
    [
        {"b": list(range(10_000)), "a": [[i, "é"] for i in range(9_000)], "c": {"z": 1.5, "y": None}},
        list(range(statefile._SLICE * 2 + 1)),
        {"names": [], "n": 0, "s": 'ü\n"', "t": True},
        {2: "int keys go through json.dumps whole", 1: [1]},
        [],
        "text",
        ["x" * 20_000, 1, "y" * 17_000, "z", *range(statefile._SLICE + 5), "w" * 16_384, [["v" * 30_000]]],
        {"ended": ["a" * 20_000, "b" * 20_000], "open": [], "nested": {"k": ["c" * 40_000]}},
    ],
)
def test_state_file_bodies_are_encoded_in_slices_exactly_as_one_json_dumps(body: object) -> None:
    """Large state files (a transaction log snapshot) are encoded in slices so a worker thread gives
    up the GIL between them; the bytes, and so every checksum, stay those of one json.dumps."""
    whole = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    pieces: list[bytes] = []
    statefile._json_pieces(body, pieces)
    assert b"".join(pieces) == whole
    data = statefile.encode("test-kind", 1, body)
    assert data.endswith(whole + b"\n")
    decoded = statefile.decode(data, Path("test.state"), "test-kind", frozenset({1}))
    assert decoded.body == json.loads(whole)
    pieces = statefile.encode_pieces("test-kind", 1, body)
    assert b"".join(pieces) == data


def test_a_snapshots_base64_chunks_are_written_as_pieces_never_joined(tmp_path: Path) -> None:
    """A transaction buffer snapshot's ended rows are base64 chunks of ~224 KB: each is a piece of
    its own (plus its quotes), so writing one never holds a second copy of the whole body."""
    chunks = [base64.b64encode(bytes([i]) * 168_000).decode() for i in range(20)]
    body = {"topic": "t", "ended": chunks, "open": [[1, 2, -1, -1]] * 10}
    pieces = statefile.encode_pieces("test-kind", 1, body)
    assert max(len(piece) for piece in pieces) <= len(chunks[0]) + 3
    statefile.write(tmp_path / "s.state", "test-kind", 1, body)
    assert (tmp_path / "s.state").read_bytes() == statefile.encode("test-kind", 1, body)
    document = statefile.read(tmp_path / "s.state", "test-kind", frozenset({1}))
    assert document is not None and document.body == body
