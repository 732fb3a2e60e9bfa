"""The buffered writer on the real, fsync'd managed ledger: what callers are told matches what is on
disk, order holds under concurrency and toggling, and a failed ledger write fails its whole batch."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from txnkeeper.bufferedwriter import TXN_LOG_CODEC, BatchedWriteConfig, BufferedWriter, WritePosition
from txnkeeper.ledger import LedgerWriteError, ManagedLedgerFactory, Position

from .conftest import FailingIO
from .helpers import new_txn


async def read_all(factory: ManagedLedgerFactory, name: str) -> list[tuple[Position, bytes]]:
    ledger = await factory.open(name)
    entries = await ledger.read_entries(Position(ledger.ledger_ids()[0], 0), 100_000)
    return [(e.position, e.data) for e in entries]


async def test_positions_match_disk_under_concurrency_and_toggling(factory: ManagedLedgerFactory) -> None:
    ledger = await factory.open("writer-order")
    writer = BufferedWriter(ledger, TXN_LOG_CODEC, BatchedWriteConfig(enabled=True, max_records=16))
    rnd = random.Random(7)
    order: list[int] = []
    seq = iter(range(10**9))

    async def client() -> list[tuple[int, WritePosition]]:
        got: list[tuple[int, WritePosition]] = []
        for _ in range(40):
            n = next(seq)
            order.append(n)
            got.append((n, await writer.write(new_txn(0, n, owner="x" * rnd.choice([0, 50, 3000])))))
        return got

    async def toggle() -> None:
        for i in range(20):
            await writer.configure(
                BatchedWriteConfig(enabled=i % 2 == 1, max_records=rnd.randint(2, 32), max_size_bytes=2048)
            )
            await asyncio.sleep(0.001)

    results = await asyncio.gather(*(client() for _ in range(20)), toggle())
    await writer.close()
    entries = await read_all(factory, "writer-order")
    decoded = {pos: TXN_LOG_CODEC.decode_entry(data) for pos, data in entries}
    on_disk = [r.txnid_least_bits for _, data in entries for r in TXN_LOG_CODEC.decode_entry(data).records]
    assert on_disk == order, "records on disk are not in the order they were written"
    for result in results[:-1]:
        assert result is not None
        for n, wp in result:
            entry = decoded[Position(wp.ledger_id, wp.entry_id)]
            assert entry.batch_size == wp.batch_size
            assert entry.records[wp.batch_index].txnid_least_bits == n
    kinds = {d.batched for d in decoded.values()}
    assert kinds == {True, False}


async def test_ledger_write_failure_fails_the_whole_batch_and_keeps_what_was_acknowledged(
    data_dir: Path,
) -> None:
    io = FailingIO()
    factory = ManagedLedgerFactory(data_dir, io=io, io_threads=2)
    try:
        ledger = await factory.open("writer-failure")
        writer = BufferedWriter(
            ledger,
            TXN_LOG_CODEC,
            BatchedWriteConfig(enabled=True, max_records=5, max_delay_millis=1000, flush_mode="delay"),
        )
        good = await asyncio.gather(*(writer.write(new_txn(0, n)) for n in range(5)))
        io.failing = True
        failed = await asyncio.gather(
            *(writer.write(new_txn(0, n)) for n in range(5, 10)), return_exceptions=True
        )
        io.failing = False
        assert all(isinstance(f, LedgerWriteError) for f in failed)
        assert len({id(f) for f in failed}) == 1, "every record of the batch fails with the same error"
        after = await asyncio.gather(*(writer.write(new_txn(0, n)) for n in range(10, 15)))
        await writer.close()
        entries = await read_all(factory, "writer-failure")
        on_disk = [r.txnid_least_bits for _, d in entries for r in TXN_LOG_CODEC.decode_entry(d).records]
        assert on_disk == [*range(5), *range(10, 15)]
        assert [p.batch_index for p in good] == list(range(5))
        assert after[0].ledger_id > good[0].ledger_id, "the ledger moves to a new ledger after a failed write"
    finally:
        await factory.close()
