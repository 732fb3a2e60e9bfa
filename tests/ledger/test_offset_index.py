"""Closed ledgers keep a sparse offset index: reads and spans stay exact, memory stays small, and a
damaged header on the walk from an anchor is refused, never read past."""

from __future__ import annotations

import os
import random
from array import array
from itertools import pairwise
from pathlib import Path

import pytest

from txnkeeper.ledger import CorruptEntryError, ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.entry_format import RECORD_HEADER_SIZE
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offset_index import ANCHOR_BYTES, ANCHOR_ENTRIES, SparseIndex


def _payload(rng: random.Random, n: int) -> bytes:
    # Mostly small entries, now and then one past the anchor byte interval.
    size = rng.choice([1, 30, 200, 900]) if n % 97 else ANCHOR_BYTES + rng.randrange(5000)
    return bytes([n % 251]) * size


def test_anchors_every_64_entries_or_64_kib() -> None:
    sizes = [100] * 200 + [40_000] * 6 + [100] * 10
    offsets: array[int] = array("q")
    at = 16
    for size in sizes:
        offsets.append(at)
        at += RECORD_HEADER_SIZE + size
    sparse = SparseIndex.from_offsets(offsets, at)
    ids = list(sparse.entry_ids)
    assert ids[0] == 0
    assert all(0 < b - a <= ANCHOR_ENTRIES for a, b in pairwise(ids))
    for a, b in pairwise(ids):
        assert b - a == ANCHOR_ENTRIES or offsets[b] - offsets[a] >= ANCHOR_BYTES
        assert offsets[b - 1] - offsets[a] < ANCHOR_BYTES  # no interval spans 64 KiB before its last
    assert sparse.at_or_before(70) == (64, offsets[64])
    assert sparse.end_at_or_after(len(sizes)) == at


async def _fill(ml: ManagedLedger, rng: random.Random, count: int) -> dict[tuple[int, int], bytes]:
    written: dict[tuple[int, int], bytes] = {}
    for n in range(count):
        data = _payload(rng, n)
        position = await ml.add_entry(data)
        written[position.ledger_id, position.entry_id] = data
    return written


async def _check_reads(ml: ManagedLedger, written: dict[tuple[int, int], bytes], rng: random.Random) -> None:
    by_ledger: dict[int, int] = {}
    for ledger_id, entry_id in written:
        by_ledger[ledger_id] = max(by_ledger.get(ledger_id, -1), entry_id + 1)
    for ledger_id, entries in by_ledger.items():
        for first in sorted({0, 1, 63, 64, 65, entries - 1, *rng.sample(range(entries), 8)}):
            if not 0 <= first < entries:
                continue
            count = min(entries - first, rng.choice([1, 2, 64, 130]))
            got = await ml.read_local(ledger_id, first, count)
            assert got == [written[ledger_id, first + i] for i in range(count)], (ledger_id, first, count)


async def test_closed_ledgers_are_read_exactly_from_a_sparse_index(factory: ManagedLedgerFactory) -> None:
    rng = random.Random(7)
    config = ManagedLedgerConfig(max_entries_per_ledger=700)
    ml = await factory.open("log", config)
    written = await _fill(ml, rng, 1500)
    closed = ml.ledger_ids()[:-1]
    assert len(closed) == 2
    for ledger_id in closed:
        ledger = ml._files[ledger_id]
        assert ledger.offsets is None, "a closed ledger kept its dense index"
        assert ledger.index_bytes() < 700 * 8 / 4
    assert ml._cur.offsets is not None  # the ledger being written keeps every offset
    await _check_reads(ml, written, rng)

    # The spans a sealed ledger walks to are those its dense index, loaded again, gives.
    ledger_id = closed[0]
    ledger = ml._files[ledger_id]
    walked = [ledger.span(first, count) for first, count in [(0, 1), (5, 60), (64, 1), (100, 600), (699, 1)]]
    await ml.load_index(ledger_id)
    assert ledger.offsets is not None
    dense = [ledger.span(first, count) for first, count in [(0, 1), (5, 60), (64, 1), (100, 600), (699, 1)]]
    assert walked == dense
    assert ml.local_payload_bytes(ledger_id, 0, 700) == sum(len(written[ledger_id, i]) for i in range(700))
    ml.release_index(ledger_id)
    assert ledger.offsets is None

    # Reopened, every closed ledger (the one open at close included) is sealed from its scan.
    await ml.close()
    ml = await factory.open("log", config)
    for ledger_id in ml.ledger_ids()[:-1]:
        assert ml._files[ledger_id].offsets is None
    await _check_reads(ml, written, rng)
    await ml.close()


async def test_a_damaged_header_on_the_walk_is_refused(factory: ManagedLedgerFactory, tmp_path: Path) -> None:
    ml = await factory.open("log", ManagedLedgerConfig(max_entries_per_ledger=200))
    for n in range(250):
        await ml.add_entry(b"entry-%03d" % n)
    ledger_id = ml.ledger_ids()[0]
    ledger = ml._files[ledger_id]
    assert ledger.offsets is None
    await ml.load_index(ledger_id)
    assert ledger.offsets is not None
    offset_of_10 = ledger.offsets[10]
    ml.release_index(ledger_id)
    # Entry 10's header sits between anchor 0 and entry 20: a read of 20 must walk through it.
    fd = os.open(ledger.path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff\xff", offset_of_10 + 4)
    finally:
        os.close(fd)
    with pytest.raises(CorruptEntryError) as failure:
        await ml.read_local(ledger_id, 20, 1)
    message = str(failure.value)
    assert str(ledger.path) in message and str(offset_of_10) in message
    assert await ml.read_local(ledger_id, 64, 2) == [b"entry-064", b"entry-065"]  # from its own anchor
    await ml.close()
