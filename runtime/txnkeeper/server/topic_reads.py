"""What a bulk reader of a topic (the Spark data source) asks a store pod: read state and entry ranges.

Why: a consumer sees a topic through its subscription's dispatch, one message at a time. A bulk
reader (``spark.read.format("txnkeeper")``) reads whole ledgers in parallel instead, the offloaded
ones straight from the tier, so it needs what dispatch decides from: the transaction buffer's aborted
set and max read position (nothing at or after the first message of an open transaction is readable,
as for a consumer), taken in one step with the ledger layout (which ledgers are live, how many entries
each holds, which ones only the tier holds, and the Offloaded segments). Entries of ledgers the pod
still holds are served in bounded ranges (the admin API caps entries and payload bytes per request),
exactly as stored (the reader decodes them), never past the durable end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txnkeeper.admin.views import TopicRefusal
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.ledger.errors import LedgerError
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offload import OffloadError
from txnkeeper.ledger.position import Position
from txnkeeper.server.offload_topics import require_held_topic
from txnkeeper.topic.service import TopicService

# Entries read at a time from a ledger only the tier holds (its entries' sizes are not known before):
# what one request holds beyond its byte bound is at most this many entries.
TIER_STEP = 64
MAX_STEP = 1_024


class TopicReads:
    """Implements admin.views.TopicReadView for one store pod."""

    def __init__(
        self, factory: ManagedLedgerFactory, topics: TopicService, exists: Callable[[str], bool]
    ) -> None:
        self._factory = factory
        self._topics = topics
        self._exists = exists

    async def _open(self, topic: str) -> ManagedLedger:
        require_held_topic(topic, self._factory, self._exists)
        try:
            await self._topics.partition(topic)  # recovers the transaction buffer
        except (LedgerError, OffloadError, OSError) as exc:
            raise TopicRefusal(503, f"topic {topic!r} cannot be opened: {exc}") from exc
        ledger = self._factory.opened(topic)
        if ledger is None:  # closed meanwhile (the pod is stopping)
            raise TopicRefusal(503, f"topic {topic!r} is closing on this pod; ask again")
        return ledger

    async def read_state(self, topic: str) -> dict[str, Any]:
        """The layout, the aborted set and the max read position, all from one event-loop step."""
        ledger = await self._open(topic)
        partition = await self._topics.partition(topic)
        # No await from here on: the buffer and the layout are one consistent picture.
        buffer = partition.buffer
        first_open = buffer.first_open_position()
        last = ledger.last_confirmed_entry()
        if first_open is not None:
            max_read: Position | None = Position(first_open.ledger_id, first_open.entry_id - 1)
        else:
            max_read = last
        meta = ledger.offload_metadata()
        ledgers = []
        for ledger_id in ledger.ledger_ids():
            info = meta.find(ledger_id)
            ledgers.append(
                {
                    "ledgerId": ledger_id,
                    "entries": ledger.confirmed_entries(ledger_id),
                    "tierOnly": bool(info is not None and info.offloaded),
                }
            )
        return {
            "topic": topic,
            "maxReadPosition": str(max_read) if max_read is not None else None,
            "lastConfirmedEntry": str(last) if last is not None else None,
            "abortedTxns": [[t.most, t.least] for t in buffer.aborted_ids()],
            "openTxns": [[t.most, t.least] for t in buffer.open_ids()],
            "ledgers": ledgers,
            "segments": [s.to_json() for s in meta.segments if s.status == "Offloaded"],
        }

    async def read_entries(
        self, topic: str, start: Position, max_entries: int, max_bytes: int
    ) -> tuple[int, list[bytes]]:
        """Entries of ledger ``start.ledger_id`` from ``start.entry_id`` on: at most ``max_entries``,
        and no more payload than ``max_bytes`` (but at least one entry); returns (durable entries of
        that ledger, entries)."""
        ledger = await self._open(topic)
        ledger_id, first = start
        if ledger_id not in ledger.ledger_ids():
            live = ledger.ledger_ids()
            raise TopicRefusal(
                404,
                f"ledger {ledger_id} of topic {topic!r} is not live here (live ledgers: {live[:20]}): it "
                "was trimmed or never existed; read the topic's state again",
            )
        durable = ledger.confirmed_entries(ledger_id)
        if first >= durable:
            return durable, []
        count = min(max_entries, durable - first)
        # Entries are read a step at a time and the answer cut at the byte bound, so what is read
        # beyond it is at most one step: a step of a local ledger holds about ``max_bytes`` at its
        # average entry size (no I/O to know it; a sealed ledger's offset index is sparse), a tier-only
        # ledger's sizes are not known before reading.
        step = TIER_STEP
        local = ledger.local_bytes(ledger_id)
        if local > 0:
            average = max(1, local // max(1, durable))
            step = max(1, min(MAX_STEP, max_bytes // average))
        out: list[bytes] = []
        size = 0
        entry = first
        while entry < first + count and (not out or size < max_bytes):
            try:
                entries = await ledger.read_entries(
                    Position(ledger_id, entry), min(step, first + count - entry)
                )
            except (LedgerError, OffloadError, OSError) as exc:
                raise TopicRefusal(
                    503, f"reading entries {ledger_id}:{entry}.. of topic {topic!r} failed: {exc}"
                ) from exc
            for item in entries:
                if item.position.ledger_id != ledger_id or (out and size + len(item.data) > max_bytes):
                    return durable, out
                out.append(item.data)
                size += len(item.data)
            if not entries:
                break
            entry += len(entries)
        return durable, out
