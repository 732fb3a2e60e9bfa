"""ManagedCursor.delete_round: a store's whole delete round (whole entries and batch indexes of many
batched entries) applied as the separate calls would, and made durable by one state write."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from txnkeeper.ledger import FileIO, ManagedLedgerFactory, Position


class CountingIO(FileIO):
    """The real file layer, counting atomic state-file writes (cursor persists among them)."""

    def __init__(self) -> None:
        self.state_writes = 0

    def write_file_atomically(self, path: Path, data: bytes | Sequence[bytes]) -> None:
        self.state_writes += 1
        super().write_file_atomically(path, data)


async def test_a_round_of_many_entries_is_one_state_write_with_the_same_outcome(tmp_path: Path) -> None:
    io = CountingIO()
    factory = ManagedLedgerFactory(tmp_path, io=io)
    try:
        ml = await factory.open("log")
        ps = [await ml.add_entry(b"%d" % i) for i in range(6)]
        cursor = await ml.open_cursor("sub")
        before = io.state_writes
        # ps[0]: plain; ps[1]: every index of a 2-record batch; ps[2]: one of 3; ps[4]: plain.
        await cursor.delete_round([ps[0], ps[4]], [(ps[1], 2, [0, 1]), (ps[2], 3, [1])])
        assert io.state_writes - before == 1
        assert cursor.mark_delete_position() == ps[1]  # ps[0], ps[1] gone: contiguous
        assert cursor.is_batch_index_deleted(ps[2], 1) and not cursor.is_batch_index_deleted(ps[2], 0)
        assert cursor.is_deleted(ps[4]) and not cursor.is_deleted(ps[3])
        # The rest of ps[2] in a later round deletes the entry and moves mark-delete over it.
        await cursor.delete_round([], [(ps[2], 3, [0, 2]), (ps[3], 1, [0])])
        assert cursor.mark_delete_position() == ps[4]
        # A refused round changes nothing: every position is checked before anything is applied.
        with pytest.raises(ValueError, match="does not exist"):
            await cursor.delete_round([ps[5]], [(Position(ps[0].ledger_id + 9, 0), 2, [0])])
        assert not cursor.is_deleted(ps[5])
        with pytest.raises(ValueError, match="outside the batch"):
            await cursor.delete_round([], [(ps[5], 2, [2])])
    finally:
        await factory.close()
