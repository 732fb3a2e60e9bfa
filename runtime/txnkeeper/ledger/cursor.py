"""A durable cursor: what one consumer of a managed ledger has deleted.

State = a mark-delete position (everything at or before it is deleted), individually deleted entries
after it (ranges per ledger) and, for batched entries, the ack set of batch indexes still present.
The mark-delete position advances by itself over contiguous deleted entries, across ledger boundaries
(Pulsar's behaviour), which is what lets individually-deleting stores have their ledgers trimmed.

Every mutation is durable before it returns: the whole state is rewritten atomically (temp file, fsync,
rename, fsync dir) as a checksummed state file (``txnkeeper.statefile``, kind ``cursor``). Concurrent
mutations share one write (the later callers wait for the write that includes their change), the same
group-commit idea as appends. On open, a cursor file is also checked against the ledger it belongs to:
a position the ledger does not hold (a mark-delete past the last confirmed entry would silently delete
entries written later, such as an open transaction's records) is refused, never adopted.
"""

from __future__ import annotations

import asyncio
import logging
import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError

from .ackset import full_mask, mask_to_words, mask_without, validate_batch_size, words_to_mask
from .errors import CorruptMetadataError, LedgerClosedError, LedgerWriteError
from .fileio import FileIO
from .position import Position
from .rangeset import EntryRangeSet

CURSOR_KIND = "cursor"
CURSOR_FILE_VERSION = 1  # of the body below
_LEGACY_VERSION = 1  # the previous release's plain-JSON cursor file said "version": 1
_BODY_KEYS = {"name", "markDelete", "individuallyDeleted", "batchDeletedIndexes"}
# Next to a cursor's file: the operator's written consent that a cursor whose file is missing starts
# again at the earliest entry (ManagedLedger.reopen_cursor). Not "<file>.json.<suffix>": an encoded
# name may take 240 bytes, and the whole must stay within the usual 255-byte file name limit.
RESET_ACCEPTANCE_SUFFIX = ".accept-reset"
_POSITION = re.compile(r"(0|[1-9][0-9]*):(-1|0|[1-9][0-9]*)")
log = logging.getLogger(__name__)


class LedgerLayout(Protocol):
    """What a cursor needs to know about its managed ledger."""

    name: str

    def ledger_ids(self) -> list[int]: ...  # live ledgers, ascending

    def confirmed_entries(self, ledger_id: int) -> int: ...  # durable entries (0 if unknown)


def next_position(layout: LedgerLayout, after: Position) -> Position | None:
    """The first durable entry after ``after``, skipping empty and trimmed ledgers."""
    if after.entry_id + 1 < layout.confirmed_entries(after.ledger_id):
        return Position(after.ledger_id, after.entry_id + 1)
    ids = layout.ledger_ids()
    for ledger_id in ids[bisect_right(ids, after.ledger_id) :]:
        if layout.confirmed_entries(ledger_id) > 0:
            return Position(ledger_id, 0)
    return None


class CursorState:
    """The pure part: positions and sets, no I/O (unit-testable on its own)."""

    def __init__(self, mark_delete: Position) -> None:
        self.mark_delete = mark_delete
        self.individual: dict[int, EntryRangeSet] = {}
        self.ack_masks: dict[Position, int] = {}

    def is_deleted(self, position: Position) -> bool:
        if position <= self.mark_delete:
            return True
        ranges = self.individual.get(position.ledger_id)
        return ranges is not None and position.entry_id in ranges

    def delete_entry(self, position: Position) -> None:
        self.ack_masks.pop(position, None)
        self.individual.setdefault(position.ledger_id, EntryRangeSet()).add(position.entry_id)

    def keep_indexes(self, position: Position, mask: int, batch_size: int) -> bool:
        """AND ``mask`` (set bit = batch index kept) into the entry's remaining indexes; the entry
        is deleted once none is left. True if it was deleted now."""
        remaining = self.ack_masks.get(position, full_mask(batch_size)) & mask
        if remaining:
            self.ack_masks[position] = remaining
            return False
        self.delete_entry(position)
        return True

    def ack_set(self, position: Position) -> list[int] | None:
        """Remaining batch indexes as Pulsar ack-set words: None if none was deleted, [] if the
        whole entry is."""
        if self.is_deleted(position):
            return []
        mask = self.ack_masks.get(position)
        return None if mask is None else mask_to_words(mask)

    def set_mark_delete(self, position: Position) -> None:
        self.mark_delete = position
        self._prune()

    def advance(self, layout: LedgerLayout) -> bool:
        """Move the mark-delete position over contiguous deleted entries; True if it moved."""
        moved = False
        while True:
            nxt = next_position(layout, self.mark_delete)
            if nxt is None:
                break
            ranges = self.individual.get(nxt.ledger_id)
            end = ranges.range_end(nxt.entry_id) if ranges is not None else None
            if end is None:
                break
            self.mark_delete = Position(nxt.ledger_id, end)
            moved = True
        if moved:
            self._prune()
        return moved

    def _prune(self) -> None:
        md = self.mark_delete
        for ledger_id in [lid for lid in self.individual if lid <= md.ledger_id]:
            ranges = self.individual[ledger_id]
            if ledger_id < md.ledger_id:
                del self.individual[ledger_id]
                continue
            ranges.remove_through(md.entry_id)
            if not ranges:
                del self.individual[ledger_id]
        for position in [p for p in self.ack_masks if p <= md]:
            del self.ack_masks[position]

    def encode(self, name: str) -> bytes:
        body: dict[str, Any] = {
            "name": name,
            "markDelete": str(self.mark_delete),
            "individuallyDeleted": [
                [lid, first, last]
                for lid in sorted(self.individual)
                for first, last in self.individual[lid].ranges()
            ],
            "batchDeletedIndexes": [
                {"position": str(p), "ackSet": mask_to_words(mask)}
                for p, mask in sorted(self.ack_masks.items())
            ],
        }
        return statefile.encode(CURSOR_KIND, CURSOR_FILE_VERSION, body)

    @classmethod
    def decode(cls, raw: bytes, path: Path, expected_name: str | None = None) -> tuple[str, CursorState]:
        """Check and parse a cursor file (CorruptMetadataError naming ``path`` for anything wrong)."""
        try:
            doc = statefile.decode(
                raw, path, CURSOR_KIND, frozenset({CURSOR_FILE_VERSION}), legacy=_legacy_body
            )
            name, state = _from_body(doc.body)
        except StateShapeError as exc:
            raise CorruptMetadataError(path, f"not a valid cursor file: {exc}") from exc
        except StateFileError as exc:
            raise CorruptMetadataError(path, exc.problem, exc.remedy) from exc
        if expected_name is not None and name != expected_name:
            raise CorruptMetadataError(path, f"file belongs to cursor {name!r}, not {expected_name!r}")
        return name, state

    @classmethod
    def load(cls, path: Path, expected_name: str, ledger_entries: dict[int, int]) -> CursorState:
        """Read a cursor file and check it against the ledger (live ledger id -> confirmed entries)."""
        _, state = cls.decode(_read(path), path, expected_name)
        state.check_within(path, ledger_entries)
        return state

    @classmethod
    def stored_name(cls, path: Path) -> str:
        """The cursor name a checked cursor file holds (for a file named in the bounded form)."""
        name, _ = cls.decode(_read(path), path)
        return name

    def check_within(self, path: Path, ledger_entries: dict[int, int]) -> None:
        """Refuse a state naming an entry the ledger does not hold (live ledger id -> entry count).

        Any position in a ledger before the first live one is fine: that ledger was trimmed because
        every cursor had passed it, and a crash between the trim's metadata write and this cursor's
        next write leaves such stale positions (harmless: they only mark trimmed entries deleted).
        A position in any other ledger must be one the ledger holds.
        """
        live = sorted(ledger_entries)
        trimmed_below = live[0] if live else 0

        def refuse(what: str, position: str, why: str) -> CorruptMetadataError:
            last = max((Position(lid, n - 1) for lid, n in ledger_entries.items() if n > 0), default=None)
            return CorruptMetadataError(
                path,
                f"{what} {position} {why} (live ledgers {live}, last confirmed entry "
                f"{last if last is not None else 'none'}); the cursor is not used, since adopting it "
                "would treat entries it never deleted as deleted",
                "restore the cursor file from a backup taken with this ledger, or restore the ledger "
                "files the cursor was written against",
            )

        md = self.mark_delete
        if md.ledger_id in ledger_entries:
            if md.entry_id >= ledger_entries[md.ledger_id]:
                raise refuse("markDelete", str(md), "is past the last entry of its ledger")
        elif not live or md.ledger_id > live[0]:
            raise refuse("markDelete", str(md), "is in a ledger this managed ledger does not have")
        for lid in sorted(self.individual):
            if lid < trimmed_below:
                continue
            for first, last in self.individual[lid].ranges():
                if lid not in ledger_entries or first < 0 or last >= ledger_entries[lid]:
                    span = f"{lid}:{first}..{lid}:{last}"
                    raise refuse("individually deleted range", span, "does not exist")
        for position, mask in sorted(self.ack_masks.items()):
            if position.ledger_id < trimmed_below:
                continue
            if position.ledger_id not in ledger_entries or not (
                0 <= position.entry_id < ledger_entries[position.ledger_id]
            ):
                raise refuse("batch ack set at", str(position), "names an entry that does not exist")
            if mask == 0:
                raise refuse("batch ack set at", str(position), "is empty (an entry with no index left)")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CorruptMetadataError(path, f"it cannot be read ({exc.strerror or exc})") from exc


def _legacy_body(raw: bytes) -> dict[str, Any]:
    """The previous release's cursor file: exactly {"version": 1} plus today's body fields."""
    return statefile.versioned_legacy_body(raw, "cursor", _BODY_KEYS, _LEGACY_VERSION, _from_body)


def _position(value: Any, what: str) -> Position:
    text = statefile.string(value, what)
    match = _POSITION.fullmatch(text)
    if match is None:
        raise StateShapeError(f"{what} {text!r} is not a position 'ledgerId:entryId'")
    return Position(int(match.group(1)), int(match.group(2)))


def _from_body(body: Any) -> tuple[str, CursorState]:
    doc = statefile.obj(body, "cursor", _BODY_KEYS)
    name = statefile.string(doc["name"], "name")
    state = CursorState(_position(doc["markDelete"], "markDelete"))
    for n, item in enumerate(statefile.array(doc["individuallyDeleted"], "individuallyDeleted")):
        what = f"individuallyDeleted[{n}]"
        triple = statefile.array(item, what)
        if len(triple) != 3:
            raise StateShapeError(f"{what} must be [ledgerId, firstEntry, lastEntry]")
        lid, first, last = (statefile.integer(v, what, 0) for v in triple)
        if last < first:
            raise StateShapeError(f"{what} is an empty range ({first} > {last})")
        state.individual.setdefault(lid, EntryRangeSet()).add_range(first, last)
    for n, item in enumerate(statefile.array(doc["batchDeletedIndexes"], "batchDeletedIndexes")):
        what = f"batchDeletedIndexes[{n}]"
        entry = statefile.obj(item, what, {"position", "ackSet"})
        words = [statefile.integer(w, f"{what}.ackSet") for w in statefile.array(entry["ackSet"], what)]
        try:
            mask = words_to_mask(words, 64 * len(words))
        except ValueError as exc:
            raise StateShapeError(f"{what}: {exc}") from exc
        state.ack_masks[_position(entry["position"], f"{what}.position")] = mask
    return name, state


class ManagedCursor:
    """A named, persisted cursor of one managed ledger (see docs/contracts.md section 1)."""

    def __init__(
        self,
        name: str,
        path: Path,
        *,
        state: CursorState,
        layout: LedgerLayout,
        io: FileIO,
        executor: Executor,
    ) -> None:
        self.name = name
        self._path = path
        self._state = state
        self._layout = layout
        self._io = io
        self._executor = executor
        self._lock = asyncio.Lock()
        self._changes = 0  # bumped on every mutation
        self._persisted = 0  # the change count the file on disk reflects
        self._closed = False

    # --- queries ---------------------------------------------------------------------------------

    def mark_delete_position(self) -> Position | None:
        """Everything at or before it is deleted; entry id -1 means "nothing of that ledger yet"."""
        return self._state.mark_delete

    def is_deleted(self, position: Position) -> bool:
        return self._state.is_deleted(position)

    def holds(self, position: Position) -> bool:
        """Whether ``position`` is a durable entry of a live ledger (one this cursor could delete)."""
        return 0 <= position.entry_id < self._layout.confirmed_entries(position.ledger_id)

    def is_batch_index_deleted(self, position: Position, batch_index: int) -> bool:
        if self._state.is_deleted(position):
            return True
        mask = self._state.ack_masks.get(position)
        return mask is not None and not (mask >> batch_index) & 1

    def ack_set(self, position: Position) -> list[int] | None:
        """Remaining (still present) batch indexes as Pulsar ack-set words.

        None: no batch index of this entry was deleted; []: the whole entry is deleted.
        """
        return self._state.ack_set(position)

    def first_undeleted_position(self) -> Position | None:
        """The oldest durable entry this cursor still needs (None: it has deleted everything)."""
        return next_position(self._layout, self._state.mark_delete)

    def stats(self) -> dict[str, Any]:
        state = self._state
        ranges = [
            f"({lid}:{first - 1}..{lid}:{last}]"
            for lid in sorted(state.individual)
            for first, last in state.individual[lid].ranges()
        ]
        read = self.first_undeleted_position()
        return {
            "markDeletePosition": str(state.mark_delete),
            "readPosition": str(read) if read is not None else None,
            "individuallyDeletedMessages": "[" + ",".join(ranges) + "]",
            "totalNonContiguousDeletedMessagesRange": len(ranges),
            "batchDeletedIndexes": [
                {"position": str(p), "ackSet": mask_to_words(m)} for p, m in sorted(state.ack_masks.items())
            ],
            "state": "Closed" if self._closed else "Open",
            "properties": {},
        }

    # --- mutations ------------------------------------------------------------------------------

    async def mark_delete(self, position: Position) -> None:
        """Delete everything at or before ``position`` (moving backwards is a no-op)."""
        self._check_open()
        if position <= self._state.mark_delete:
            await self._persist(changed=False)
            return
        self._check_exists(position, allow_before_first=True)
        self._state.set_mark_delete(position)
        self._state.advance(self._layout)
        await self._persist()

    async def reset(self, position: Position) -> None:
        """Pulsar's resetCursor (a consumer's seek): everything at or before ``position`` deleted,
        everything after it not (individual deletes and batch-index acks after it are forgotten),
        durable before it returns. ``position`` may lie before a ledger's first entry (entry -1)."""
        self._check_open()
        self._check_exists(position, allow_before_first=True)
        self._state = CursorState(position)
        await self._persist()

    async def delete(self, positions: Iterable[Position]) -> None:
        """Delete individual entries (already deleted ones are ignored)."""
        self._check_open()
        todo = [p for p in positions if not self._state.is_deleted(p)]
        for position in todo:  # validate everything before changing anything
            self._check_exists(position)
        if not todo:
            await self._persist(changed=False)
            return
        for position in todo:
            self._state.delete_entry(position)
        self._state.advance(self._layout)
        await self._persist()

    async def delete_batch_indexes(self, position: Position, batch_size: int, indexes: Iterable[int]) -> None:
        """Delete batch indexes of one batched entry (the entry goes once none is left)."""
        validate_batch_size(batch_size)
        await self._apply(position, mask_without(batch_size, indexes), batch_size)

    async def apply_ack_set(self, position: Position, ack_set: Sequence[int], batch_size: int) -> None:
        """AND a Pulsar ack set (set bit = keep) into the entry's remaining batch indexes."""
        validate_batch_size(batch_size)
        await self._apply(position, words_to_mask(ack_set, batch_size), batch_size)

    async def delete_round(
        self, positions: Iterable[Position], batch_indexes: Iterable[tuple[Position, int, Iterable[int]]]
    ) -> None:
        """``delete(positions)`` plus ``delete_batch_indexes`` of each (position, batch size, indexes),
        validated first and made durable by one state write (a store's delete round touches many
        batched entries; a persist per entry doubled the cursor's fsyncs at low load)."""
        self._check_open()
        todo = [p for p in positions if not self._state.is_deleted(p)]
        masks: list[tuple[Position, int, int]] = []
        for position, batch_size, indexes in batch_indexes:
            validate_batch_size(batch_size)
            if not self._state.is_deleted(position):
                masks.append((position, mask_without(batch_size, indexes), batch_size))
        for position in [*todo, *(m[0] for m in masks)]:  # validate everything before changing anything
            self._check_exists(position)
        if not todo and not masks:
            await self._persist(changed=False)
            return
        for position in todo:
            self._state.delete_entry(position)
        for position, mask, batch_size in masks:
            if not self._state.is_deleted(position):  # (else also listed among the whole-entry deletes)
                self._state.keep_indexes(position, mask, batch_size)
        self._state.advance(self._layout)
        await self._persist()

    async def _apply(self, position: Position, mask: int, batch_size: int) -> None:
        self._check_open()
        if self._state.is_deleted(position):
            await self._persist(changed=False)
            return
        self._check_exists(position)
        if self._state.keep_indexes(position, mask, batch_size):
            self._state.advance(self._layout)
        await self._persist()

    # --- persistence ------------------------------------------------------------------------------

    async def _persist(self, *, changed: bool = True) -> None:
        """Make the state durable; ``changed=False`` only retries a write that failed earlier."""
        if changed:
            self._changes += 1
        wanted = self._changes
        if self._persisted >= wanted:
            return
        async with self._lock:
            if self._persisted >= wanted:
                return  # a write that started after our change already covered it
            covered = self._changes
            data = self._state.encode(self.name)
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, self._io.write_file_atomically, self._path, data)
            except OSError as exc:
                raise LedgerWriteError(
                    f"could not persist cursor {self.name!r} of managed ledger {self._layout.name!r} "
                    f"to {self._path}: {exc}; the change is kept in memory and written with the next "
                    "cursor update (retrying the same call does that); free disk space or check the volume"
                ) from exc
            self._persisted = covered

    def persist_blocking(self) -> None:
        """Write the current state (used once, at creation, from the opening thread)."""
        self._io.write_file_atomically(self._path, self._state.encode(self.name))

    async def close(self) -> None:
        """Refuse new changes and wait until every accepted one is on disk (or its write failed)."""
        self._closed = True
        # Behind every change waiting for the write lock: when a write already covered them all,
        # _persist below returns at once, and their callers would still be waiting after close.
        async with self._lock:
            pass
        try:
            await self._persist(changed=False)
        except LedgerWriteError as exc:
            log.warning("%s", exc)

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosedError(
                f"cursor {self.name!r} of managed ledger {self._layout.name!r} is closed; reopen the ledger"
            )

    def _check_exists(self, position: Position, *, allow_before_first: bool = False) -> None:
        if not isinstance(position, Position):
            raise TypeError(f"expected a Position, got {type(position).__name__}: {position!r}")
        if position.ledger_id in self._layout.ledger_ids():
            confirmed = self._layout.confirmed_entries(position.ledger_id)
            low = -1 if allow_before_first else 0
            if low <= position.entry_id < confirmed:
                return
        raise ValueError(
            f"position {position} does not exist in managed ledger {self._layout.name!r} "
            f"(live ledgers {self._layout.ledger_ids()}); only durable positions can be deleted"
        )
