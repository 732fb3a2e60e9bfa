"""The tail cache: recently written entries kept in memory, so subscriptions that keep up read the
tail from there and not from disk, bounded for the whole process.

Why one budget for the process and not one per topic: a bound per topic (it was 20,000 entries or
32 MiB) multiplies with the number of topics, which any client chooses; 100 topics written to at
32 MiB each took 3.2 GB. Here every partition's cache draws on one ``TailCacheBudget``, and when the
process total passes it the oldest entries go first, whichever topic wrote them (Pulsar's broker
does the same with ``managedLedgerCacheSizeMB``: one entry cache for all its topics). A recent
entry is the one a consumer that keeps up reads next, so oldest-first keeps what is read.

An entry costs its payload plus ``ENTRY_OVERHEAD`` (the position key, the dict slot, the budget's
record of it), so a flood of tiny entries is bounded by the same number of bytes. A read that misses
the cache reads the ledger: the cache only saves disk reads, it never decides what a read returns.
"""

from __future__ import annotations

from collections import deque

from txnkeeper.ledger.position import Position

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# Measured with sys.getsizeof on CPython 3.11: a Position (56) and its entry id (28), the bytes
# object's header (33), a dict slot (52 with its share of the table) and the budget's record of the
# entry (a tuple, 56, and its deque slot, 8): 233.
ENTRY_OVERHEAD = 240
_COMPACT_AT = 4096  # closed caches' records in the order before it is rebuilt without them


class TailCacheBudget:
    """Every tail cache of a process together holds at most ``max_bytes``; the oldest entries go first."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"the tail cache budget must be 0 (no cache) or more bytes, not {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0  # payloads and overhead of the entries cached now
        self.entries = 0
        self.evicted = 0  # entries dropped to stay within the budget, since start
        self._order: deque[tuple[TailCache, Position]] = deque()  # every cached entry, oldest first
        self._closed_records = 0  # records of caches closed since, still in the order

    def cache(self) -> TailCache:
        """A new, empty cache drawing on this budget (one per partition)."""
        return TailCache(self)

    def _added(self, cache: TailCache, position: Position, cost: int) -> None:
        self._order.append((cache, position))
        self.bytes += cost
        self.entries += 1
        self._evict()

    def _evict(self) -> None:
        order = self._order
        while self.bytes > self.max_bytes and order:
            cache, position = order.popleft()
            if cache.closed:
                self._closed_records -= 1
                continue
            data = cache._entries.pop(position)
            cost = len(data) + ENTRY_OVERHEAD
            cache.bytes -= cost
            self.bytes -= cost
            self.entries -= 1
            self.evicted += 1

    def _closing(self, cache: TailCache) -> None:
        self.bytes -= cache.bytes
        self.entries -= len(cache._entries)
        self._closed_records += len(cache._entries)
        if self._closed_records >= _COMPACT_AT and self._closed_records * 2 >= len(self._order):
            self._order = deque(record for record in self._order if not record[0].closed)
            self._closed_records = 0


class TailCache:
    """One partition's recently written entries, by position (its budget evicts them)."""

    def __init__(self, budget: TailCacheBudget) -> None:
        self._budget = budget
        self._entries: dict[Position, bytes] = {}
        self.bytes = 0
        self.closed = False

    def __contains__(self, position: object) -> bool:
        return position in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, position: Position) -> bytes | None:
        return self._entries.get(position)

    def remember(self, position: Position, data: bytes) -> None:
        """Cache ``data``, durable at ``position`` (older entries of any cache may go to make room)."""
        if self.closed or position in self._entries:
            return  # an entry is written once; a second notice of it changes nothing
        cost = len(data) + ENTRY_OVERHEAD
        if cost > self._budget.max_bytes:
            return  # it would evict everything and still not fit
        self._entries[position] = data
        self.bytes += cost
        self._budget._added(self, position, cost)

    def close(self) -> None:
        """Drop every entry and give their bytes back to the budget (the partition is closing)."""
        if self.closed:
            return
        self.closed = True
        self._budget._closing(self)
        self._entries.clear()
        self.bytes = 0
