"""Sorted, merged, inclusive ranges of entry ids within one ledger (individually deleted entries).

Kept as ranges because a store acknowledges out of order: one long-lived record can hold the
mark-delete position back while thousands after it are deleted.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator


class EntryRangeSet:
    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._starts)

    def __len__(self) -> int:
        """Number of ranges."""
        return len(self._starts)

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def count(self) -> int:
        return sum(e - s + 1 for s, e in self.ranges())

    def range_end(self, entry_id: int) -> int | None:
        """The last id of the range holding ``entry_id``, or None if it is not in the set."""
        i = bisect_right(self._starts, entry_id) - 1
        if i >= 0 and self._ends[i] >= entry_id:
            return self._ends[i]
        return None

    def __contains__(self, entry_id: int) -> bool:
        return self.range_end(entry_id) is not None

    def add_range(self, first: int, last: int) -> None:
        """Add [first, last], merging with touching or overlapping ranges."""
        if last < first:
            return
        starts, ends = self._starts, self._ends
        lo = bisect_right(ends, first - 2)  # first range that ends at or after first-1
        hi = bisect_right(starts, last + 1)  # ranges [lo, hi) touch or overlap
        if lo < hi:
            first = min(first, starts[lo])
            last = max(last, ends[hi - 1])
        starts[lo:hi] = [first]
        ends[lo:hi] = [last]

    def add(self, entry_id: int) -> None:
        self.add_range(entry_id, entry_id)

    def remove_through(self, entry_id: int) -> None:
        """Forget every id <= entry_id (they are behind the mark-delete position now)."""
        starts, ends = self._starts, self._ends
        cut = bisect_right(ends, entry_id)
        del starts[:cut]
        del ends[:cut]
        if starts and starts[0] <= entry_id:
            starts[0] = entry_id + 1
