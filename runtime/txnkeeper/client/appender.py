"""One writer id's numbered block appends to one topic, exactly once across reconnects (PDP-44).

Why it exists: single-key transactions (``SingleKeyWriter``) and ``Producer.send_atomic`` need the
same thing from a store: a block of events applied whole and at most once, even when the connection
or the store goes away between sending the block and its answer. PDP-44's answer, kept here once: the
writer id's events are numbered contiguously; a block carries its numbers; after any doubt (connection
lost, request timed out, store recovering) the appender opens a new session (``SetupAppend``), learns
the store's last event number for the id, and ``appendstate.reconcile`` decides per unanswered block:
applied (the store then answers it from its writer state, with the message ids the lost answer carried)
or not (sent again with the same numbers). Expired or inconsistent writer state fails the blocks with
``WriterStateLostError``; nothing is ever re-applied on a guess.

One block of a writer id is on the wire at a time (the next is numbered at once and sent when the
previous is answered): the store remembers the first message id of a writer's last block only, so this
is what lets every commit, also one decided by a reconnect, return its message ids. Parallelism comes
from several writers (one per routing key, or per worker).

A block refused ``NOT_SERVED_HERE`` (the topic moved to another store pod, contracts §12) was not
applied: the appender resynchronises at the pod that serves the topic now (``SetupAppend`` follows the
redirect), which holds the writer id's moved state, and decides the block there as after a reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
import zlib
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from txnkeeper.client.appendstate import BlockNumbers, reconcile
from txnkeeper.client.errors import ClientClosedError, UnsupportedFeatureError, writer_error
from txnkeeper.client.message import MessageId
from txnkeeper.client.placement import is_placement
from txnkeeper.errors import (
    BadRequestError,
    ConnectionClosedError,
    RequestTimeoutError,
    ServiceError,
    UnavailableError,
)
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection

if TYPE_CHECKING:
    from txnkeeper.client.placement import StoreRouter
    from txnkeeper.protocol.pool import ConnectionPool

log = logging.getLogger(__name__)

DEFAULT_MAX_TXN_BYTES = 16 * 1024 * 1024  # event bytes of one block (a single-key transaction)
# Encoded bytes per AppendBlock chunk: well below a frame's 5 MiB limit with the command's own fields.
CHUNK_BYTES = 4 * 1024 * 1024
MAX_EVENT_BYTES = CHUNK_BYTES - 4  # an event travels whole in one chunk, after its length
RESYNC_BACKOFF = (0.05, 1.0)  # seconds: first retry, cap
# Failures after which a block's outcome is unknown but the store may still hold the writer's state:
# resynchronise and decide, instead of failing the block.
_DOUBTFUL = (ConnectionClosedError, RequestTimeoutError, UnavailableError)
_LENGTH = struct.Struct(">I")
# Refusals after which the writer cannot go on (its numbering or its session is gone); any other
# refusal of a block fails that commit only.
_WRITER_ENDING = frozenset(
    (api.WRITER_FENCED, api.WRITER_STATE_LOST, api.EVENT_NUMBER_GAP, api.UNSUPPORTED_FEATURE)
)


def encode_events(events: list[bytes]) -> list[bytes]:
    """A block's events as AppendBlock chunks: ``[length u32 big-endian][payload]`` each, an event
    never split, a chunk at most ``CHUNK_BYTES`` (contracts §6, single-key appends)."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for event in events:
        encoded = _LENGTH.pack(len(event)) + event
        if current and size + len(encoded) > CHUNK_BYTES:
            chunks.append(b"".join(current))
            current, size = [], 0
        current.append(encoded)
        size += len(encoded)
    chunks.append(b"".join(current))
    return chunks


@dataclass(eq=False)
class _Block:
    numbers: BlockNumbers
    chunks: list[bytes]
    size: int
    crc: int
    result: asyncio.Future[list[MessageId]]
    chunk_failure: ServiceError | None = None  # why the store refused a chunk of the last send


class BlockAppender:
    """Appends blocks for ``writer_id`` to ``topic`` on ``store_address``; ``append`` returns a future
    of the block's message ids, resolved in block order once the store applied it."""

    def __init__(
        self,
        connections: ConnectionPool,
        topic: str,
        router: StoreRouter,
        writer_id: str,
        *,
        key: str,
        resync_timeout: float,
    ) -> None:
        if not writer_id:
            raise ValueError("a writer id must not be empty")
        self._connections = connections
        self.topic = topic
        self._router = router
        self.writer_id = writer_id
        self.key = key
        self._resync_timeout = resync_timeout
        # The last event number the store confirmed to this writer (numbers start at 0; -1: none).
        self.acknowledged_through = -1
        self._next_event = 0
        self._queue: deque[_Block] = deque()  # numbered, unanswered; only the head is on the wire
        self._head_sent = False
        self._conn: RpcConnection | None = None
        self._session = 0
        self._resyncing: asyncio.Task[None] | None = None
        # When the oldest unresolved doubt began: a store that keeps accepting the writer back but
        # never answers must not keep it retrying for ever.
        self._doubt_since: float | None = None
        self._failure: BaseException | None = None  # set once the writer can append no more
        self.resyncs = 0  # sessions opened after the first (tests count them)
        # This writer instance's token: its reconnects resume the id, which the store refuses once
        # another instance took the id over since (that one's blocks may carry this one's numbers).
        self._instance = uuid.uuid4().hex

    @property
    def store_address(self) -> str:
        """The store pod the writer's topic is served by now (redirects move it)."""
        return self._router.address(self.topic)

    @property
    def in_flight(self) -> int:
        """Blocks numbered and not answered yet."""
        return len(self._queue)

    @property
    def failure(self) -> BaseException | None:
        """Why the writer can append no more (fenced, state lost, closed), or None."""
        return self._failure

    @property
    def on_the_wire(self) -> bool:
        """Whether a block was sent and its answer has not arrived."""
        return self._head_sent and bool(self._queue)

    async def open(self) -> None:
        """Start the first session: the store says where this writer id's numbering stands."""
        try:
            conn, store_last = await self._setup(resume=False)
        except ConnectionClosedError:
            # A release that does not know SetupAppend cannot parse it and drops the connection; one
            # more try tells that apart from a connection that was merely lost.
            try:
                conn, store_last = await self._setup(resume=False)
            except ConnectionClosedError as exc:
                if "cannot connect" in str(exc):
                    raise
                raise UnsupportedFeatureError(
                    f"the store at {self.store_address} closed the connection twice in answer to "
                    f"SetupAppend ({exc}): a release without single-routing-key appends (upgrade it, or "
                    "use a full transaction), or a failing store (see its log)"
                ) from exc
        self.acknowledged_through = store_last
        self._next_event = store_last + 1
        self._use(conn)

    def append(self, events: list[bytes]) -> asyncio.Future[list[MessageId]]:
        """Number ``events`` as the writer's next block and send it (at the call when nothing is ahead
        of it); the future resolves to their contiguous message ids once the store applied them."""
        if self._failure is not None:
            raise self._failure
        if not events:
            raise ValueError("a block needs at least one event")
        chunks = encode_events(events)
        crc = 0
        for chunk in chunks:
            crc = zlib.crc32(chunk, crc)
        numbers = BlockNumbers(self._next_event, len(events))
        self._next_event += len(events)
        result: asyncio.Future[list[MessageId]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Block(numbers, chunks, sum(len(c) for c in chunks), crc, result))
        if len(self._queue) == 1:
            self._send_head()
        return result

    # --- sending -----------------------------------------------------------------------------------
    def _use(self, conn: RpcConnection) -> None:
        self._conn = conn
        self._session += 1
        conn.closed.add_done_callback(lambda _: self._lost(conn))

    def _send_head(self) -> None:
        conn = self._conn
        if self._resyncing is not None or not self._queue:
            return
        if conn is None or not conn.is_open:
            self._start_resync()
            return
        block = self._queue[0]
        self._head_sent = True
        # The chunks as AppendBlock frames, then the AppendBlockEnd that commits them (contracts §10).
        # A chunk is answered only when refused; the refusal (fenced, too large, over the budget) is
        # the real reason the end then fails, and it arrives before the end's answer (frames are
        # handled in order), so it is kept for that. An accepted chunk's request expires with the
        # connection's sweep after the timeout.
        block.chunk_failure = None
        for chunk in block.chunks:
            piece = api.Command()
            piece.append_block.writer_id = self.writer_id
            piece.append_block.data = chunk
            conn.request(piece, self._resync_timeout).add_done_callback(partial(_chunk_answered, block))
        end = api.Command()
        body = end.append_block_end
        body.writer_id = self.writer_id
        body.key = self.key
        body.first_event_number = block.numbers.first_event_number
        body.event_count = block.numbers.event_count
        body.total_bytes = block.size
        body.crc = block.crc
        session = self._session
        response = conn.request(end, self._resync_timeout)
        response.add_done_callback(lambda answered: self._answered(session, block, answered))

    def _answered(self, session: int, block: _Block, response: asyncio.Future[api.Command]) -> None:
        failure = asyncio.CancelledError() if response.cancelled() else response.exception()
        if session != self._session or not self._queue or self._queue[0] is not block:
            return  # an answer from an older session: the resync decided this block
        if failure is None:
            self._applied(block, response.result())
            return
        if isinstance(failure, _DOUBTFUL) or is_placement(failure):
            log.info(
                "writer %s of %s: block %s..%s unanswered (%s); resynchronising",
                self.writer_id,
                self.topic,
                block.numbers.first_event_number,
                block.numbers.last_event_number,
                failure,
            )
            self._start_resync()
            return
        if block.chunk_failure is not None:
            failure = block.chunk_failure
        failure = writer_error(failure, f"writer {self.writer_id} of {self.topic}")
        if isinstance(failure, ServiceError) and failure.code not in _WRITER_ENDING:
            self._refused(block, failure)
            return
        self._fail(failure)

    def _refused(self, block: _Block, failure: BaseException, *, applied: bool = False) -> None:
        """The head block's commit fails with ``failure``. Refused by the store without being applied
        (too large, bad CRC, a limit): the blocks behind it, not sent yet, take its event numbers."""
        self._queue.popleft()
        self._head_sent = False
        count = block.numbers.event_count
        if applied:
            self.acknowledged_through = block.numbers.last_event_number
        else:
            for later in self._queue:
                first = later.numbers.first_event_number - count
                later.numbers = BlockNumbers(first, later.numbers.event_count)
            self._next_event -= count
        if not block.result.done():
            block.result.set_exception(failure)
            block.result.exception()
        self._send_head()

    def _applied(self, block: _Block, response: api.Command) -> None:
        answer = response.data_appended
        if (
            response.WhichOneof("body") != "data_appended"
            or answer.event_number != block.numbers.last_event_number
        ):
            self._fail(
                ServiceError(
                    f"writer {self.writer_id}: the store answered block {block.numbers.first_event_number}.."
                    f"{block.numbers.last_event_number} with {response.WhichOneof('body')} "
                    f"(event {answer.event_number}); the writer stops (a protocol mismatch)"
                )
            )
            return
        self._doubt_since = None
        if not answer.HasField("first_message_id"):
            # Not expected (only the head block is ever re-sent, and the store remembers the first id
            # of a writer's last block): say so rather than invent ids. (_refused takes the block off
            # the queue, and only it: the blocks behind it are answered in turn.)
            self._refused(
                block,
                ServiceError(
                    f"writer {self.writer_id}: block {block.numbers.first_event_number}.."
                    f"{block.numbers.last_event_number} is applied, but the store no longer knows its "
                    "message ids"
                ),
                applied=True,
            )
            return
        self._queue.popleft()
        self._head_sent = False
        self.acknowledged_through = block.numbers.last_event_number
        first = answer.first_message_id
        # Contiguous by the store's rule (contracts §10): a block's entries never straddle a rollover.
        ids = [MessageId(first.ledger_id, first.entry_id + i) for i in range(block.numbers.event_count)]
        if not block.result.done():
            block.result.set_result(ids)
        self._send_head()

    # --- resynchronising ---------------------------------------------------------------------------
    def _lost(self, conn: RpcConnection) -> None:
        if conn is self._conn:
            self._conn = None
            if self._head_sent and self._queue and self._failure is None:
                self._start_resync()

    def _start_resync(self) -> None:
        if self._resyncing is None and self._failure is None:
            self._conn = None
            self._session += 1  # answers of the old session no longer count
            self._resyncing = asyncio.get_running_loop().create_task(self._resync())

    async def _resync(self) -> None:
        now = time.monotonic()
        if self._doubt_since is None:
            self._doubt_since = now
        deadline = self._doubt_since + self._resync_timeout
        delay = RESYNC_BACKOFF[0]
        try:
            while True:
                try:
                    if time.monotonic() > deadline:
                        raise RequestTimeoutError("no answer to the writer's blocks in time")
                    conn, store_last = await self._setup(resume=True)
                    break
                except _DOUBTFUL as exc:
                    if time.monotonic() + delay > deadline:
                        raise RequestTimeoutError(
                            f"writer {self.writer_id} of {self.topic}: the store at {self.store_address} "
                            f"did not take the writer back within {self._resync_timeout}s ({exc}); the "
                            "outcome of its unanswered block is unknown: read the topic, then continue "
                            "with a new writer"
                        ) from exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RESYNC_BACKOFF[1])
            self.resyncs += 1
            # The outcome decides nothing to do here beyond refusing the impossible: an applied head
            # is sent again and answered from the store's writer state with its message ids; one not
            # applied is sent again and applied now.
            numbers = [b.numbers for b in self._queue]
            reconcile(self.writer_id, self.acknowledged_through, numbers, store_last, sent=1)
        except ServiceError as exc:
            self._resyncing = None
            self._fail(writer_error(exc, f"writer {self.writer_id} of {self.topic}"))
            return
        finally:
            if self._resyncing is asyncio.current_task():
                self._resyncing = None
        self._use(conn)
        self._send_head()

    async def _setup(self, *, resume: bool) -> tuple[RpcConnection, int]:
        """SetupAppend of the writer id as this instance: the first one takes the id over (fencing
        every other instance), a reconnect (``resume``) is refused WRITER_FENCED once another instance
        took it since. Sent to the pod that serves the topic (following redirects)."""

        async def setup(address: str) -> tuple[RpcConnection, int]:
            return await self._setup_at(address, resume=resume)

        return await self._router.at_owner(self.topic, setup, f"writer {self.writer_id} of {self.topic}")

    async def _setup_at(self, address: str, *, resume: bool) -> tuple[RpcConnection, int]:
        conn = await self._connections.get(address)
        command = api.Command()
        command.setup_append.topic = self.topic
        command.setup_append.writer_id = self.writer_id
        command.setup_append.producer_session = self._instance
        command.setup_append.resume = resume
        try:
            response = await conn.request(command, self._resync_timeout)
        except BadRequestError as exc:
            if "is not a request a server accepts" in str(exc):
                raise UnsupportedFeatureError(
                    f"the store at {self.store_address} does not serve single-routing-key appends "
                    f"({exc}): upgrade it, or use a full transaction"
                ) from exc
            raise
        except _DOUBTFUL:
            raise
        except ServiceError as exc:
            converted = writer_error(exc, f"writer {self.writer_id} of {self.topic}")
            if converted is exc:
                raise
            raise converted from exc
        return conn, response.append_setup.last_event_number

    async def drained(self) -> None:
        """Wait until every appended block was answered (applied or failed)."""
        if self._queue:
            await asyncio.wait([self._queue[-1].result])

    def _fail(self, failure: BaseException) -> None:
        """The writer can append no more: fail every unanswered block with ``failure``."""
        if self._failure is None:
            self._failure = failure
        blocks, self._queue = self._queue, deque()
        for block in blocks:
            if not block.result.done():
                block.result.set_exception(failure)
                block.result.exception()

    async def close(self) -> None:
        if self._failure is None:
            self._failure = ClientClosedError(f"writer {self.writer_id} of {self.topic} is closed")
        if self._resyncing is not None:
            self._resyncing.cancel()
        self._fail(self._failure)


def _chunk_answered(block: _Block, response: asyncio.Future[api.Command]) -> None:
    failure = None if response.cancelled() else response.exception()
    if isinstance(failure, ServiceError) and not isinstance(failure, _DOUBTFUL):
        block.chunk_failure = block.chunk_failure or failure
