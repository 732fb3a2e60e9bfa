"""Per-topic writer state for single-routing-key blocks (Pravega PDP-44) and idempotent producers.

Why: a writer that lost a DataAppended (or a producer that lost a receipt) retransmits; the store must
answer from what it remembers instead of writing twice, refuse a gap, and say so explicitly when it has
forgotten the writer rather than re-apply silently. Both use one table: writer id (or producer name) ->
the last durable event (sequence) number and the first MessageId of its last block (send).

Named producers are fenced like writers: each SetupAppend of a name opens a session with a new epoch
and a Produce carries its session's epoch, so the newest producer of a name is the only one writing.
A session holds no writer slot: ``maxWritersPerTopic`` counts writers that wrote (a writer takes its
slot at its first write), so sessions that never write cannot lock other writers out; the edge drops
such a session with its connection (``end_session``).

Pure state, no I/O: the partition feeds it what it queues, what became durable and what it replays.
Two views are kept: ``durable`` (what a snapshot and a reconnecting writer may see) and the *queued*
last number (durable plus blocks in flight), which orders pipelined blocks and catches a retransmission
of a block still being written.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from txnkeeper.contract import store_settings
from txnkeeper.errors import BadRequestError, ServiceError
from txnkeeper.ledger.position import Position
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.topic.snapshot import WriterRow

NO_EVENT = -1  # last number of a writer the store knows nothing about
# The largest event number or sequence id: they travel as int64 (AppendSetup.last_event_number, the
# markers' numbers; Pulsar's sequence ids are int64 too), so a larger one could be stored but never
# answered. Refused before anything is written; state beyond it left by an older release is ignored.
MAX_EVENT_NUMBER = 2**63 - 1
# TxnID.most of the store-local transaction each block is written under: no coordinator has this id.
BLOCK_TXN_MOST = 2**64 - 1

DEFAULT_MAX_BLOCK_BYTES = store_settings.SRK_DEFAULT_MAX_BLOCK_BYTES
DEFAULT_MAX_WRITERS_PER_TOPIC = store_settings.SRK_DEFAULT_MAX_WRITERS_PER_TOPIC
DEFAULT_WRITER_INACTIVITY_MINUTES = store_settings.SRK_DEFAULT_WRITER_INACTIVITY_MINUTES


class WriterFencedError(ServiceError):
    code = api.WRITER_FENCED


class WriterStateLostError(ServiceError):
    code = api.WRITER_STATE_LOST


class EventNumberGapError(ServiceError):
    code = api.EVENT_NUMBER_GAP


class BlockTooLargeError(ServiceError):
    code = api.BLOCK_TOO_LARGE


class TooManyWritersError(ServiceError):
    code = api.TOO_MANY_WRITERS


class UnsupportedFeatureError(ServiceError):
    code = api.UNSUPPORTED_FEATURE


class BadBlockError(ServiceError):
    code = api.BAD_BLOCK


@dataclass(frozen=True, slots=True)
class SingleKeySettings:
    """The store's single-routing-key transaction settings (config ``singleKeyTransactions``)."""

    enabled: bool = False
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    writer_inactivity_minutes: int = DEFAULT_WRITER_INACTIVITY_MINUTES
    max_writers_per_topic: int = DEFAULT_MAX_WRITERS_PER_TOPIC

    def table(self, topic: str) -> WriterTable:
        return WriterTable(
            topic,
            max_writers=self.max_writers_per_topic,
            inactivity_ms=self.writer_inactivity_minutes * 60_000,
        )


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Writer:
    """What the store durably knows of one writer."""

    last: int  # last event (sequence) number written
    last_first: int  # first event number of its last block (== last for a producer's send)
    first_message_id: Position | None  # MessageId of the last block's first event, if known
    last_active_ms: int


@dataclass(slots=True)
class InFlight:
    """A block (or idempotent send) queued to the ledger, not yet known durable."""

    writer_id: str
    first: int
    last: int
    done: asyncio.Future[Position]  # the block's marker (the send's entry)
    first_entry: asyncio.Future[Position]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A block at or below the writer's last number: answered without writing. With
    ``first_message_id`` it has the numbers of the writer's last block, whose events are there to
    compare with (``Partition`` answers it a duplicate only if they are the same)."""

    previous: int
    first_message_id: Position | None


@dataclass(frozen=True, slots=True)
class WaitFor:
    """A retransmission of a block still in flight: decide again once it settled."""

    future: asyncio.Future[Position]


class WriterTable:
    """The writers of one topic."""

    def __init__(
        self,
        topic: str,
        *,
        max_writers: int = DEFAULT_MAX_WRITERS_PER_TOPIC,
        inactivity_ms: int = DEFAULT_WRITER_INACTIVITY_MINUTES * 60_000,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        self.topic = topic
        self.max_writers = max_writers
        self.inactivity_ms = inactivity_ms
        self._clock = clock_ms
        self.durable: dict[str, Writer] = {}
        self._in_flight: dict[str, list[InFlight]] = {}
        self._epochs: dict[str, int] = {}  # writer -> its newest session's epoch (in memory only)
        # Epochs are unique in the table, not per writer: a session of a writer that expired and was
        # set up again by someone else must never match the new session's epoch.
        self._last_epoch = 0
        self._setup_ms: dict[str, int] = {}  # writer -> when its newest session began
        # producer name -> the producer instance (its session token) that holds the name now
        self._owners: dict[str, str] = {}
        # principal -> how many of its writers wrote (durable or first write in flight): what
        # maxWritersPerTopic limits. A session alone holds no slot (see ``end_session``).
        self._writers_of: Counter[str] = Counter()

    # --- sessions ---------------------------------------------------------------------------------
    def has_written(self, writer_id: str) -> bool:
        """Whether ``writer_id`` holds a writer slot: it has durable state or a write in flight."""
        return writer_id in self.durable or writer_id in self._in_flight

    def _admit_writer(self, writer_id: str) -> None:
        """Before a writer's first write: refuse it when its principal's writers fill the limit."""
        if self.has_written(writer_id):
            return
        principal = principal_of(writer_id)
        held = self._writers_of[principal]
        if held >= self.max_writers:
            whose = f" of principal {principal!r}" if principal else ""
            raise TooManyWritersError(
                f"topic {self.topic!r} already holds {held} writers and named producers{whose}, its"
                f" limit (maxWritersPerTopic {self.max_writers}); nothing of {shown(writer_id)} was"
                " written: reuse a writer id or producer name, or raise"
                " singleKeyTransactions.maxWritersPerTopic"
            )

    def _slot_changed(self, writer_id: str, held_before: bool) -> None:
        held = self.has_written(writer_id)
        if held != held_before:
            principal = principal_of(writer_id)
            self._writers_of[principal] += 1 if held else -1
            if not self._writers_of[principal]:
                del self._writers_of[principal]

    def end_session(self, writer_id: str, epoch: int) -> None:
        """The connection of session ``epoch`` closed (or set the id up again elsewhere). A session
        whose writer never wrote is forgotten with it: sessions hold no writer slot, and one that
        outlived its connection would only hold memory. A writer that wrote keeps its newest epoch,
        so the sessions it fenced stay fenced."""
        if self._epochs.get(writer_id) != epoch or self.has_written(writer_id):
            return
        del self._epochs[writer_id]
        self._setup_ms.pop(writer_id, None)
        self._owners.pop(writer_id, None)

    def sessions_without_writes(self) -> int:
        """Sessions whose writer never wrote (held in memory only, until their connection closes)."""
        return sum(1 for writer_id in self._epochs if not self.has_written(writer_id))

    def setup(self, writer_id: str, *, owner: str = "", resume: bool = False) -> tuple[int, int]:
        """A new session of ``writer_id``: its epoch (fencing every older session) and last number.

        ``owner`` is a named producer's instance token. The newest session of a name always wins, so
        a producer reconnecting after a cut is never locked out by its own dead connection; but a
        reconnect (``resume``) of an instance that another instance has taken the name from since is
        refused: the fenced producer would otherwise take the name back and re-send sequence ids the
        newer one already used, and the store would drop them as duplicates."""
        validate_writer_key(writer_id)
        holder = self._owners.get(writer_id)
        if resume and owner and holder is not None and holder != owner:
            raise WriterFencedError(
                f"producer or writer {shown(writer_id)} of topic {self.topic!r} was taken over by another"
                " producer or writer with the same name (id) since this one connected; this one is fenced"
                " for good: close it (run one producer per name, one writer per id)"
            )
        if owner:
            self._owners[writer_id] = owner
        else:
            self._owners.pop(writer_id, None)
        self._last_epoch += 1
        epoch = self._last_epoch
        self._epochs[writer_id] = epoch
        self._setup_ms[writer_id] = self._clock()
        writer = self.durable.get(writer_id)
        if writer is not None:
            writer.last_active_ms = self._clock()
        return epoch, writer.last if writer is not None else NO_EVENT

    def check_epoch(self, writer_id: str, epoch: int, *, producer: bool = False) -> None:
        current = self._epochs.get(writer_id)
        if current is None:
            raise WriterStateLostError(
                f"writer {shown(writer_id)} of topic {self.topic!r} has no session any more: it expired"
                " (inactive longer than writerInactivityMinutes), or a newer session that never wrote"
                " ended with its connection; send SetupAppend again and check last_event_number"
            )
        if current != epoch:
            if producer:
                raise WriterFencedError(
                    f"producer {shown(writer_id)} of topic {self.topic!r} was taken over by a newer"
                    " producer with the same name (another connection); this producer's sends are"
                    " refused from now on: close it (run one producer per name)"
                )
            raise WriterFencedError(
                f"writer {shown(writer_id)} of topic {self.topic!r} was taken over by a newer"
                " SetupAppend (another connection); this session's blocks are refused"
            )

    def is_current(self, writer_id: str, epoch: int) -> bool:
        """Whether session ``epoch`` is still ``writer_id``'s newest (not fenced, not forgotten)."""
        return self._epochs.get(writer_id) == epoch

    def has_session(self, writer_id: str) -> bool:
        """False once the writer's sessions expired (or it never had one)."""
        return writer_id in self._epochs

    def in_flight_of(self, writer_id: str) -> list[asyncio.Future[Position]]:
        """The writes of ``writer_id`` queued to the ledger and not yet settled."""
        return [flight.done for flight in self._in_flight.get(writer_id, [])]

    def settled_last(self, writer_id: str) -> int:
        """The last number durable for ``writer_id``, counting flights that completed but whose
        writer has not run ``settled`` yet (a new session must start after them)."""
        writer = self.durable.get(writer_id)
        last = writer.last if writer is not None else NO_EVENT
        for flight in self._in_flight.get(writer_id, []):
            if _succeeded(flight.done) and _succeeded(flight.first_entry):
                last = max(last, flight.last)
        return last

    # --- deciding and applying blocks --------------------------------------------------------------
    def queued_last(self, writer_id: str) -> int:
        flights = self._in_flight.get(writer_id)
        if flights:
            return flights[-1].last
        writer = self.durable.get(writer_id)
        return writer.last if writer is not None else NO_EVENT

    def decide(self, writer_id: str, first: int, last: int) -> Duplicate | WaitFor | None:
        """None: apply the block now. Raises for a gap, an overlap or a forgotten writer."""
        if first < 0 or last < first:
            raise BadRequestError(f"event numbers {first}..{last} of writer {shown(writer_id)} are not valid")
        if last > MAX_EVENT_NUMBER:
            raise BadRequestError(
                f"block {first}..{last} of writer {shown(writer_id)} ends beyond event number 2^63 - 1"
                f" ({MAX_EVENT_NUMBER}), the largest there is (event numbers are int64); nothing was written"
            )
        queued = self.queued_last(writer_id)
        if last <= queued:
            for flight in self._in_flight.get(writer_id, []):
                if flight.last >= last:
                    return WaitFor(flight.done)
            writer = self.durable[writer_id]
            writer.last_active_ms = self._clock()
            if writer.last_first == first and writer.last == last:
                # The numbers of its last block: a duplicate only if the events are the same too,
                # which the partition checks against the entries at first_message_id (numbers alone
                # cannot tell this session's retransmission from another session's block).
                return Duplicate(writer.last, writer.first_message_id)
            if last >= writer.last_first:
                # A single writer's blocks never overlap: a block reaching into the last block
                # without being it was numbered by another session of the id.
                raise WriterFencedError(
                    f"block {first}..{last} of {shown(writer_id)} on topic {self.topic!r} is not a block this"
                    f" id wrote: its last block is {writer.last_first}..{writer.last}, so another session"
                    " with the same writer id (or producer name) wrote these numbers since this one sent"
                    " them; nothing was written and this session is fenced (run one instance per id)"
                )
            return Duplicate(writer.last, None)
        if first == queued + 1:
            self._admit_writer(writer_id)
            return None
        if first <= queued:
            raise BadRequestError(
                f"block {first}..{last} of writer {shown(writer_id)} overlaps its last event number {queued}:"
                " a block must be retransmitted unchanged, or start at last_event_number + 1"
            )
        if queued == NO_EVENT:
            raise WriterStateLostError(
                f"topic {self.topic!r} holds no state for writer {shown(writer_id)} (expired or never"
                f" written), so its block starting at event {first} cannot be placed; do not re-apply"
                " blindly: check which events were delivered, then start a new writer id"
            )
        raise EventNumberGapError(
            f"block of writer {shown(writer_id)} starts at event {first} but its last event number on topic "
            f"{self.topic!r} is {queued}; the next block must start at {queued + 1}"
        )

    def decide_send(self, name: str, sequence_id: int) -> Duplicate | WaitFor | None:
        """Like ``decide`` for an idempotent producer's send: sequence ids may skip numbers."""
        if sequence_id > MAX_EVENT_NUMBER:
            raise BadRequestError(
                f"sequence id {sequence_id} of producer {shown(name)} is above 2^63 - 1 ({MAX_EVENT_NUMBER}),"
                " the largest a producer may use (sequence ids are int64, as in Pulsar); nothing was"
                " written"
            )
        queued = self.queued_last(name)
        if sequence_id > queued:
            self._admit_writer(name)
            return None
        return self.decide(name, sequence_id, sequence_id)

    def began(self, flight: InFlight) -> None:
        held = self.has_written(flight.writer_id)
        self._in_flight.setdefault(flight.writer_id, []).append(flight)
        self._slot_changed(flight.writer_id, held)

    def settled(self, flight: InFlight) -> None:
        """The flight's future completed: success makes it durable state, failure just drops it."""
        held = self.has_written(flight.writer_id)
        flights = self._in_flight.get(flight.writer_id, [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self._in_flight.pop(flight.writer_id, None)
        if _succeeded(flight.done) and _succeeded(flight.first_entry):
            self._observe(flight.writer_id, flight.first, flight.last, flight.first_entry.result())
        self._slot_changed(flight.writer_id, held)

    def observe(self, writer_id: str, first: int, last: int, first_message_id: Position | None) -> None:
        """A durable block (send) of ``writer_id`` found by replay."""
        held = self.has_written(writer_id)
        self._observe(writer_id, first, last, first_message_id)
        self._slot_changed(writer_id, held)

    def _observe(self, writer_id: str, first: int, last: int, first_message_id: Position | None) -> None:
        writer = self.durable.get(writer_id)
        now = self._clock()
        if writer is None:
            self.durable[writer_id] = Writer(last, first, first_message_id, now)
        elif last > writer.last:
            writer.last, writer.last_first, writer.first_message_id = last, first, first_message_id
            writer.last_active_ms = now

    # --- housekeeping, snapshots -------------------------------------------------------------------
    def expire(self) -> list[str]:
        """Forget writers inactive for longer than the limit (none with a block in flight)."""
        cutoff = self._clock() - self.inactivity_ms
        gone = [
            w
            for w, state in self.durable.items()
            if state.last_active_ms < cutoff and w not in self._in_flight
        ]
        # Sessions of writers that never wrote a block count against the limit too: expire them alike.
        gone += [
            w
            for w, began in self._setup_ms.items()
            if began < cutoff and w not in self.durable and w not in self._in_flight
        ]
        for writer_id in gone:
            held = self.has_written(writer_id)
            self.durable.pop(writer_id, None)
            self._slot_changed(writer_id, held)
            self._epochs.pop(writer_id, None)
            self._setup_ms.pop(writer_id, None)
            self._owners.pop(writer_id, None)
        return gone

    @property
    def in_flight(self) -> bool:
        return bool(self._in_flight)

    def snapshot_rows(self) -> list[WriterRow]:
        """Durable state plus flights already durable (their entries are covered by the ledger's last
        confirmed entry, which a snapshot taken now covers)."""
        merged = {
            w: Writer(s.last, s.last_first, s.first_message_id, s.last_active_ms)
            for w, s in self.durable.items()
        }
        for flights in self._in_flight.values():
            for f in flights:
                if _succeeded(f.done) and _succeeded(f.first_entry):
                    pos = f.first_entry.result()
                    current = merged.get(f.writer_id)
                    if current is None or f.last > current.last:
                        merged[f.writer_id] = Writer(f.last, f.first, pos, self._clock())
        return [
            (
                writer_id,
                s.last,
                s.last_first,
                -1 if s.first_message_id is None else s.first_message_id.ledger_id,
                -1 if s.first_message_id is None else s.first_message_id.entry_id,
                s.last_active_ms,
            )
            for writer_id, s in merged.items()
        ]

    def restore_row(
        self, writer_id: str, last: int, last_first: int, mid: Position | None, active: int
    ) -> bool:
        """Take a snapshot's row; False (row ignored) when its numbers are beyond MAX_EVENT_NUMBER."""
        if not in_range(last) or not in_range(last_first):
            return False
        held = self.has_written(writer_id)
        self.durable[writer_id] = Writer(last, last_first, mid, active)
        self._slot_changed(writer_id, held)
        return True

    def rows_for_admin(self) -> list[dict[str, object]]:
        return [
            {
                "writerId": id_of(writer_id),
                "principal": principal_of(writer_id),
                "lastEventNumber": s.last,
                "lastBlockFirstEventNumber": s.last_first,
                "lastBlockFirstMessageId": None
                if s.first_message_id is None
                else f"{s.first_message_id.ledger_id}:{s.first_message_id.entry_id}",
                "lastActiveMs": s.last_active_ms,
                "inFlightBlocks": len(self._in_flight.get(writer_id, [])),
                "sessionEpoch": self._epochs.get(writer_id, 0),
            }
            for writer_id, s in sorted(self.durable.items())
        ]


def in_range(number: int) -> bool:
    """Whether ``number`` can be a writer's event number or a producer's sequence id."""
    return NO_EVENT <= number <= MAX_EVENT_NUMBER


def _succeeded(future: asyncio.Future[Position]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


MAX_WRITER_ID = 256
# Between a principal and a writer id in the table's keys (and so in markers, producer records and
# snapshot rows). A writer id or principal never holds it: both refuse control characters.
PRINCIPAL_SEPARATOR = "\x1f"


def validate_writer_id(writer_id: str, what: str = "writer id") -> None:
    if not writer_id or len(writer_id) > MAX_WRITER_ID or any(ord(c) < 32 for c in writer_id):
        raise BadRequestError(
            f"{what} {writer_id[:300]!r} must be 1..{MAX_WRITER_ID} characters, none of them a control"
            " character"
        )


def writer_key(principal: str, writer_id: str) -> str:
    """The table's key of ``writer_id`` as ``principal`` (the client's authenticated credential) uses
    it: each principal has its own writer ids and producer names, so one credential can neither take
    over nor exhaust another's. Without client authentication (principal "") the key is the id."""
    return f"{principal}{PRINCIPAL_SEPARATOR}{writer_id}" if principal else writer_id


def principal_of(key: str) -> str:
    principal, separator, _ = key.partition(PRINCIPAL_SEPARATOR)
    return principal if separator else ""


def id_of(key: str) -> str:
    """The writer id (producer name) a client uses for ``key``."""
    return key.rpartition(PRINCIPAL_SEPARATOR)[2]


def shown(key: str) -> str:
    """``key`` as refusals and logs name it."""
    principal = principal_of(key)
    return f"{id_of(key)!r} of principal {principal!r}" if principal else repr(key)


def validate_writer_key(key: str) -> None:
    validate_writer_id(id_of(key))
    principal = principal_of(key)
    if principal:
        validate_writer_id(principal, "principal")
