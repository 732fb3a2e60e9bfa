"""The sparse offset index a closed ledger keeps in memory instead of one offset per entry.

A ledger being written needs the file offset of every confirmed entry (appends, the offloader's
planning). A closed ledger is only read, and a topic can keep closed ledgers for as long as its
retention (or a future subscription) needs them: at 8 bytes an entry, a store's memory grew with the
data its topics retained (about 45 MB over the hour soak's 5.6 million retained entries). A closed
ledger keeps an anchor (entry id, file offset) at most every ``ANCHOR_ENTRIES`` entries and every
``ANCHOR_BYTES`` of file; a read starts at the anchor at or before its first entry and walks record
headers forward, so it reads at most one anchor interval more than it returns. Anchors cost
16 bytes each: 0.25 bytes an entry for small entries, and never more than 16 bytes per
``ANCHOR_BYTES`` of file for large ones.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

ANCHOR_ENTRIES = 64
ANCHOR_BYTES = 64 * 1024


class SparseIndex:
    """Anchors of a closed ledger: ascending entry ids and the file offsets their records start at."""

    __slots__ = ("entry_ids", "file_bytes", "offsets")

    def __init__(self, entry_ids: array[int], offsets: array[int], file_bytes: int) -> None:
        self.entry_ids = entry_ids
        self.offsets = offsets
        self.file_bytes = file_bytes

    @classmethod
    def from_offsets(cls, offsets: array[int], file_bytes: int) -> SparseIndex:
        """Anchors for a dense index (every record's start offset) of a file ``file_bytes`` long."""
        entry_ids: array[int] = array("q")
        anchors: array[int] = array("q")
        last_entry = -ANCHOR_ENTRIES
        last_offset = -ANCHOR_BYTES
        for entry_id, offset in enumerate(offsets):
            if entry_id - last_entry >= ANCHOR_ENTRIES or offset - last_offset >= ANCHOR_BYTES:
                entry_ids.append(entry_id)
                anchors.append(offset)
                last_entry, last_offset = entry_id, offset
        return cls(entry_ids, anchors, file_bytes)

    def at_or_before(self, entry_id: int) -> tuple[int, int]:
        """The anchor (entry id, offset) a walk to ``entry_id`` starts from."""
        i = bisect_right(self.entry_ids, entry_id) - 1
        return self.entry_ids[i], self.offsets[i]

    def end_at_or_after(self, entry_id: int) -> int:
        """The file offset of the first anchor at or after ``entry_id`` (the file's end if none):
        a read of entries before ``entry_id`` never needs bytes past it."""
        i = bisect_left(self.entry_ids, entry_id)
        return self.offsets[i] if i < len(self.offsets) else self.file_bytes

    def memory_bytes(self) -> int:
        return (len(self.entry_ids) + len(self.offsets)) * self.offsets.itemsize
