"""The protocol server: accepts connections and routes each command to a service handler.

A handler answers synchronously (returns a response command, or None for no response) or
asynchronously: it returns a future (completed by callbacks, no task) or a coroutine (run as a task).
An asynchronous result that is not a command is answered with Success, so handlers need no wrapper
coroutine just to turn "done" into a response. Every response goes back through the connection's
coalesced writes with the request id of its request.

The server enforces ``ConnectionLimits`` (protocol/limits.py): at most so many connections (and so
many per peer address, and so many that have not completed a request yet), so many bytes of incomplete
frames across all of them, so long for a started frame to complete, for a new connection to complete
its first request and for an idle connection without state to stay open; and it holds pushes back from
peers that do not read them (``Session.ready_for_push``), per connection and across all of them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, Generic, Protocol, cast

from txnkeeper import memtrim
from txnkeeper.errors import BadRequestError, NotServedHereError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.connection import SERVER_FLUSH_EVERY, CommandT, Decoder, WireConnection
from txnkeeper.protocol.frames import FrameDecoder, FrameError, encode_error, encode_frame
from txnkeeper.protocol.limits import (
    BAD_FRAME,
    HANDSHAKE_EVICTED,
    HANDSHAKE_TIMEOUT,
    IDLE,
    PENDING_BUDGET,
    PUSH_FLOOR,
    SLOW_FRAME,
    TOO_MANY_CONNECTIONS,
    TOO_MANY_FROM_ADDRESS,
    UNSENT_BUDGET,
    WRITE_HIGH_WATER,
    WRITE_TIMEOUT,
    ConnectionLimits,
    ServerStats,
)
from txnkeeper.protocol.tls_accept import TlsSource, tls_factory

log = logging.getLogger(__name__)
_CLOSE_GRACE_S = 5.0
# After a connection that held a backlog is gone, the C heap's free pages are handed back to the
# operating system (memtrim) this long after, and at most every _TRIM_EVERY_S: one trim covers a burst.
_TRIM_DELAY_S = 1.0
_TRIM_EVERY_S = 5.0
# Why a connection's socket is not read (bits of BaseServerConnection._read_holds): its peer left too
# much of what it was sent unread, it has too many requests unanswered, or all connections' requests
# together hold the process-wide budget. Reading resumes once no reason is left.
_WRITE_PAUSED = 1
_OWN_REQUESTS = 2
_ALL_REQUESTS = 4
_REQUEST_HOLDS = _OWN_REQUESTS | _ALL_REQUESTS

Response = api.Command | None
HandlerResult = Response | Awaitable[object]


class Session(Protocol):
    """What a handler sees of the connection it serves (to push messages, to learn it closed)."""

    session_id: int

    def push(self, command: api.Command) -> None: ...

    def ready_for_push(self) -> bool:
        """True while a push would not pile up unread: the connection is open, its peer has read all
        but a little of what it was sent, and the process-wide budget allows. When it said False,
        the handler's ``session_writable`` is called once it would say True again."""
        ...

    @property
    def is_open(self) -> bool: ...


class SessionHandler(Protocol):
    """What the connection machinery tells a service edge about its sessions, whichever wire they
    speak (a session is that wire's ``Session``, hence ``Any`` here)."""

    def session_closed(self, session: Any) -> None: ...

    def session_holds_state(self, session: Any) -> bool:
        """True while closing the session would lose something (a subscribed consumer): then it is
        not closed for being idle."""
        ...

    def session_writable(self, session: Any) -> None:
        """The session's peer read enough (or the process-wide budget freed) that pushes refused by
        ``ready_for_push`` may resume."""
        ...


class CommandHandler(SessionHandler, Protocol):
    """A service edge of txnkeeper's own protocol: answers one command; told when a session ends so
    it can release its state."""

    def handle(self, session: Session, body_name: str, command: api.Command) -> HandlerResult: ...


def _success() -> api.Command:
    # a fresh command each time: the request id is stamped into it
    command = api.Command()
    command.success.SetInParent()
    return command


def error_response(exc: BaseException) -> api.Command:
    command = api.Command()
    fill_error(command.error, exc)
    return command


def fill_error(error: api.Error, exc: BaseException) -> None:
    """Describe ``exc`` in ``error`` as the peer should see it (unexpected errors are logged here)."""
    if isinstance(exc, ServiceError):
        error.code = exc.code  # type: ignore[assignment]
        error.message = str(exc)
        if isinstance(exc, NotServedHereError):
            error.owner_address = exc.owner_address
            error.placement_epoch = exc.placement_epoch
        return
    log.exception("request failed unexpectedly", exc_info=exc)
    error.code = api.UNKNOWN_ERROR
    error.message = f"{type(exc).__name__}: {exc}"


class ConnectionBook:
    """What one server's connections share: the open ones, those still handshaking (oldest first),
    the count per peer address, the counters, and the limits they are held to."""

    __slots__ = (
        "_last_trim",
        "_trim_at",
        "budget_held",
        "handshaking",
        "limits",
        "open",
        "per_address",
        "stats",
    )

    def __init__(self, limits: ConnectionLimits, stats: ServerStats) -> None:
        self.limits = limits
        self.stats = stats
        self.open: set[BaseServerConnection[Any]] = set()
        self.handshaking: OrderedDict[BaseServerConnection[Any], float] = OrderedDict()  # -> accepted at
        self.per_address: Counter[str] = Counter()
        # Connections not read because all connections' requests held the process-wide budget.
        self.budget_held: set[BaseServerConnection[Any]] = set()
        self._trim_at: float | None = None
        self._last_trim = float("-inf")

    def resume_pushes(self) -> None:
        """The process-wide budget has room again: every connection whose pushes were held may go on."""
        for conn in list(self.open):
            conn.resume_pushes_if_room()

    def release_budget(self) -> None:
        """The requests in flight fell to half the process-wide budget: read every connection held
        for it again."""
        held, self.budget_held = self.budget_held, set()
        for conn in held:
            conn.release_budget_hold()

    def trim_memory_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the C heap's free pages back to the OS shortly (a connection holding a backlog went):
        once for a burst of such connections, at most every _TRIM_EVERY_S."""
        if self._trim_at is not None or not memtrim.available():
            return
        self._trim_at = max(loop.time() + _TRIM_DELAY_S, self._last_trim + _TRIM_EVERY_S)
        loop.call_at(self._trim_at, self._trim, loop)

    def _trim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._trim_at = None
        self._last_trim = loop.time()
        # In a worker thread: after a large cut it takes ~0.2 s (madvise of every free page), and the
        # call releases the GIL, so the loop goes on meanwhile.
        loop.run_in_executor(None, memtrim.trim).add_done_callback(_trim_done)


def _trim_done(future: asyncio.Future[bool]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("returning free memory to the OS failed: %s", future.exception())


class BaseServerConnection(WireConnection[CommandT], Generic[CommandT]):
    """One accepted connection of either wire, held to the server's ``ConnectionLimits``: what the
    wire's connection class adds is how it answers its commands and says why it refuses."""

    _next_id = 0

    def __init__(self, book: ConnectionBook, decoder: Decoder[CommandT], sessions: SessionHandler) -> None:
        super().__init__(decoder, SERVER_FLUSH_EVERY)
        BaseServerConnection._next_id += 1
        self.session_id = BaseServerConnection._next_id
        self._book = book
        self.sessions = sessions
        self._limits = book.limits
        self._stats = book.stats
        self._counted = 0  # this connection's bytes in stats.pending_bytes
        # This connection's bytes in stats.unsent_bytes: pushes queued, plus what its transport had
        # not sent when last looked at (after each write, on resume_writing, at each sweep).
        self._unsent = 0
        # Since when a push was refused (ready_for_push) without the handler being told of room since.
        self.push_held_since: float | None = None
        self._backlogged = False  # it once had more unsent than the high-water mark
        self.peer_host = "?"
        self.last_received = asyncio.get_running_loop().time()
        self.frame_started: float | None = None  # when the buffered partial frame began arriving
        self.in_flight = 0  # requests still being answered: a peer waiting for one is not idle
        self._read_holds = 0  # why its socket is not read: _WRITE_PAUSED | _OWN_REQUESTS | _ALL_REQUESTS
        # Commands read in the same chunk as the one that took the request budget: handled once it
        # has room again (at most one read's worth, so the budget is exact and the memory bounded).
        self._held_commands: deque[CommandT] = deque()
        # Since when the peer has left more than WRITE_HIGH_WATER unsent: its requests are not read.
        self.write_paused_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=PUSH_FLOOR)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer_host = str(peer[0])
        super().connection_made(transport)

    def on_open(self) -> None:
        book, stats, limits = self._book, self._stats, self._limits
        if len(book.open) >= limits.max_connections:
            stats.refused[TOO_MANY_CONNECTIONS] += 1
            log.warning(
                "refusing connection from %s: %d connections open (max_connections %d)",
                self.peer,
                len(book.open),
                limits.max_connections,
            )
            self.refuse(
                api.RESOURCE_LIMIT,
                f"server has {len(book.open)} connections open, its limit (max connections);"
                " retry later or use fewer connections",
            )
            return
        host = self.peer_host
        from_host = book.per_address[host]
        if from_host >= limits.max_connections_per_address:
            stats.refused[TOO_MANY_FROM_ADDRESS] += 1
            log.warning(
                "refusing connection from %s: %d connections open from %s (max_connections_per_address %d)",
                self.peer,
                from_host,
                host,
                limits.max_connections_per_address,
            )
            self.refuse(
                api.RESOURCE_LIMIT,
                f"server has {from_host} connections open from {host}, its limit for one peer address"
                f" (max connections per address {limits.max_connections_per_address}); retry later or"
                " use fewer connections",
            )
            return
        stats.accepted += 1
        book.open.add(self)
        book.per_address[host] = from_host + 1
        stats.open_connections = len(book.open)
        handshaking = book.handshaking
        handshaking[self] = self._loop.time()
        if len(handshaking) > limits.max_handshaking_connections:
            oldest = next(iter(handshaking))
            oldest.close_for(
                HANDSHAKE_EVICTED,
                api.RESOURCE_LIMIT,
                f"closed to admit a newer connection: {limits.max_handshaking_connections} connections"
                " had not completed a request (max handshaking connections); send a request right"
                " after connecting",
            )
        stats.handshaking = len(handshaking)

    def _handshake_done(self) -> None:
        handshaking = self._book.handshaking
        if handshaking.pop(self, None) is not None:
            self._stats.handshaking = len(handshaking)

    def refuse(self, code: int, message: str) -> None:
        """Tell the peer why in an error frame (request id 0), then close."""
        self.send_error_frame(code, message)
        self.close()

    def close_for(self, reason: str, code: int, message: str) -> None:
        if not self.is_open:
            return
        self._stats.closed[reason] += 1
        log.warning("closing connection from %s: %s", self.peer, message)
        self._handshake_done()
        self.refuse(code, message)
        self._uncount()
        # A peer that reads nothing would keep the socket (and its unsent bytes) forever: the error
        # frame gets a grace period, then the connection is cut.
        asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, self.abort)

    def abort_for(self, reason: str, message: str) -> None:
        """Cut a connection whose peer does not read: an error frame would never reach it."""
        if self._transport is None:
            return
        self._stats.closed[reason] += 1
        log.warning("aborting connection from %s: %s", self.peer, message)
        self._handshake_done()
        self._uncount()
        self.abort()

    # --- the peer not reading what it is sent -----------------------------------------------------
    # The transport's marks are the push floor (64 KiB, resumed at a quarter of it): its
    # pause_writing/resume_writing say when pushes held back may go on. Requests stop being read
    # only past WRITE_HIGH_WATER, judged after each write.
    def pause_writing(self) -> None:
        pass  # below WRITE_HIGH_WATER only pushes wait, and they ask ready_for_push

    def resume_writing(self) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        if self.write_paused_since is not None:
            self.write_paused_since = None
            self._stats.write_paused -= 1
            self._release_reading(_WRITE_PAUSED)
        self.recount_unsent()
        self.resume_pushes_if_room()

    def _pause_requests(self, transport: asyncio.Transport) -> None:
        """Stop reading the peer's requests until it reads what it was sent (its sends back up)."""
        self.write_paused_since = self._loop.time()
        self._backlogged = True
        self._stats.write_paused += 1
        self._hold_reading(_WRITE_PAUSED)

    # --- requests pipelined faster than they are answered (limits.py) -----------------------------
    def request_began(self, size: int) -> None:
        """Count a request read and not answered yet, holding ``size`` bytes until it is: past the
        connection's or the process's budget the socket is not read until enough are answered."""
        self.in_flight += 1
        stats, limits = self._stats, self._limits
        stats.request_bytes += size
        if self.in_flight >= limits.max_requests_in_flight:
            self._hold_reading(_OWN_REQUESTS)
        if stats.request_bytes >= limits.max_total_request_bytes and self.is_open:
            self._hold_reading(_ALL_REQUESTS)
            self._book.budget_held.add(self)

    def request_ended(self, size: int) -> None:
        """A request counted by ``request_began`` was answered (or its connection is gone)."""
        self.in_flight -= 1
        stats, limits = self._stats, self._limits
        stats.request_bytes -= size
        if self._read_holds & _OWN_REQUESTS and self.in_flight <= limits.max_requests_in_flight // 2:
            self._release_reading(_OWN_REQUESTS)
        if self._book.budget_held and stats.request_bytes <= limits.max_total_request_bytes // 2:
            self._book.release_budget()

    def answer_later(
        self, future: asyncio.Future[Any], size: int, answer: Callable[[asyncio.Future[Any]], None]
    ) -> None:
        """Answer a request of ``size`` bytes once ``future`` settles (``answer`` sends the reply),
        counting it against the request budgets meanwhile."""
        self.request_began(size)
        future.add_done_callback(partial(self._settled, size, answer))

    def _settled(
        self, size: int, answer: Callable[[asyncio.Future[Any]], None], future: asyncio.Future[Any]
    ) -> None:
        try:
            answer(future)
        finally:
            self.request_ended(size)  # after the answer: held commands' answers must not overtake it

    def release_budget_hold(self) -> None:
        self._release_reading(_ALL_REQUESTS)

    @property
    def requests_held(self) -> bool:
        """Not read because requests wait for answers: its peer waits on the server, not slow."""
        return bool(self._read_holds & _REQUEST_HOLDS)

    def _hold_reading(self, reason: int) -> None:
        holds = self._read_holds
        transport = self._transport
        if holds & reason or transport is None:
            return
        if not holds:
            transport.pause_reading()
        if reason & _REQUEST_HOLDS and not holds & _REQUEST_HOLDS:
            self._stats.request_held += 1
        self._read_holds = holds | reason

    def _release_reading(self, reason: int) -> None:
        holds = self._read_holds
        if not holds & reason:
            return
        self._read_holds = holds = holds & ~reason
        if reason & _REQUEST_HOLDS and not holds & _REQUEST_HOLDS:
            self._stats.request_held -= 1
            if self._held_commands and not self._closing:
                held, self._held_commands = self._held_commands, deque()
                self._dispatch(held)
                holds = self._read_holds
        transport = self._transport
        if holds or transport is None or self._closing:
            return
        transport.resume_reading()
        if self._decoder.buffered:
            # the frame's remaining bytes were not read because of the hold, not the peer
            self.frame_started = self._loop.time()

    def _flush(self) -> None:
        super()._flush()
        transport = self._transport
        if transport is None or self._closing:
            return
        unsent = transport.get_write_buffer_size()
        self._set_unsent(unsent)
        if unsent > self._limits.max_unsent_bytes:
            self.abort_for(
                UNSENT_BUDGET,
                f"its peer left {unsent} bytes of answers and messages unread, over the limit of"
                f" {self._limits.max_unsent_bytes} (max unsent bytes); the client must read what it"
                " is sent",
            )
            return
        if unsent > WRITE_HIGH_WATER and self.write_paused_since is None:
            self._pause_requests(transport)
        elif self.push_held_since is not None:
            self.resume_pushes_if_room()  # what was queued went out at once

    def recount_unsent(self) -> None:
        """Count what is really unsent now (the transport drains without telling below its marks)."""
        transport = self._transport
        if transport is None:
            return
        self._set_unsent(transport.get_write_buffer_size() + sum(map(len, self._outgoing)))

    def _set_unsent(self, unsent: int) -> None:
        delta = unsent - self._unsent
        if delta:
            self._unsent = unsent
            self._add_unsent(delta)

    def _add_unsent(self, delta: int) -> None:
        stats = self._stats
        before = stats.unsent_bytes
        stats.unsent_bytes = after = before + delta
        if delta < 0 and before >= self._limits.max_total_unsent_bytes > after:
            self._book.resume_pushes()

    def _push_room(self) -> bool:
        own = self._unsent
        return (
            self.write_paused_since is None
            and own < WRITE_HIGH_WATER
            and (own < PUSH_FLOOR or self._stats.unsent_bytes < self._limits.max_total_unsent_bytes)
            and self.is_open
        )

    def ready_for_push(self) -> bool:
        if self._push_room():
            return True
        if self.push_held_since is None and self.is_open:
            self.push_held_since = self._loop.time()
            self._stats.push_paused += 1
        return False

    def resume_pushes_if_room(self) -> None:
        """Tell the handler pushes may go on, if one was refused and there is room now."""
        if self.push_held_since is None or not self._push_room():
            return
        self._release_push_hold()
        try:
            self.sessions.session_writable(self)
        except Exception:
            log.exception("resuming pushes failed")

    def _release_push_hold(self) -> None:
        if self.push_held_since is not None:
            self.push_held_since = None
            self._stats.push_paused -= 1

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        decoder = self._decoder
        before = decoder.buffered
        now = self._loop.time()
        self.last_received = now
        try:
            commands = decoder.feed(data)
        except FrameError as exc:
            self.close_for(BAD_FRAME, exc.code, str(exc))
            return
        after = decoder.buffered
        if after != self._counted:
            stats = self._stats
            stats.pending_bytes += after - self._counted
            self._counted = after
            if after and stats.pending_bytes > self._limits.max_pending_bytes:
                self.close_for(
                    PENDING_BUDGET,
                    api.RESOURCE_LIMIT,
                    f"incomplete frames across this server's connections would hold"
                    f" {stats.pending_bytes} bytes, over its limit of {self._limits.max_pending_bytes}"
                    " (max pending bytes); retry later",
                )
                return
        if not after:
            self.frame_started = None
        elif not before or commands:
            self.frame_started = now
        if commands:
            self._handshake_done()
        if self._held_commands:
            self._held_commands.extend(commands)
        else:
            self._dispatch(commands)

    def _dispatch(self, commands: Iterable[CommandT]) -> None:
        """Handle commands in order until one takes the connection's or the process's request budget;
        the rest wait in ``_held_commands`` for room."""
        remaining = iter(commands)
        for command in remaining:
            self.on_command(command)
            if self._read_holds & _REQUEST_HOLDS:
                self._held_commands.extend(remaining)
                return

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def _uncount(self) -> None:
        self._decoder.reset()
        self._stats.pending_bytes -= self._counted
        self._counted = 0

    def push_frame(self, frame: bytes) -> None:
        """Queue a frame the peer did not ask for (a message for its consumer), counted as unsent."""
        if self._transport is None:
            return
        # Counted before it is written, so that a burst of pushes in one turn sees itself.
        size = len(frame)
        self._unsent += size
        self._add_unsent(size)
        self.send_frame(frame)

    def hand_over(self, successor: BaseServerConnection[Any], data: bytes) -> None:
        """Give this accepted connection's socket, and its place among the server's connections, to
        ``successor`` (the connection of the wire its first bytes showed), then feed it ``data``."""
        transport = self._transport
        if transport is None:
            return
        book = self._book
        book.open.discard(self)
        book.open.add(successor)
        since = book.handshaking.pop(self, None)
        if since is not None:
            book.handshaking[successor] = since
        successor.adopt(transport, self)
        self._transport = None
        self._closing = True
        transport.set_protocol(successor)
        successor.data_received(data)

    def adopt(self, transport: asyncio.Transport, previous: BaseServerConnection[Any]) -> None:
        """Take over ``previous``'s socket (``hand_over``): already accepted and counted."""
        self._transport = transport
        self.peer, self.peer_host = previous.peer, previous.peer_host
        self.last_received = previous.last_received

    def on_lost(self, exc: Exception | None) -> None:
        self._uncount()
        self._handshake_done()
        self._release_push_hold()
        if self.write_paused_since is not None:
            self.write_paused_since = None
            self._stats.write_paused -= 1
        if self._read_holds & _REQUEST_HOLDS:
            self._stats.request_held -= 1
        self._read_holds = 0
        self._held_commands.clear()
        book = self._book
        book.budget_held.discard(self)
        if self not in book.open:
            return  # refused at accept: the handler never saw it
        book.open.discard(self)
        self._stats.open_connections = len(book.open)
        left = book.per_address[self.peer_host] - 1
        if left > 0:
            book.per_address[self.peer_host] = left
        else:
            del book.per_address[self.peer_host]
        # Its unsent bytes are gone with the transport: room for the others' pushes.
        self._set_unsent(0)
        try:
            self.sessions.session_closed(self)
        except Exception:
            log.exception("session cleanup failed")
        if self._backlogged:
            book.trim_memory_soon(self._loop)


_SIZES = struct.Struct(">II")


def _wire_of(first: bytes, max_frame_size: int) -> str | None:
    """Which wire a connection's first bytes speak: "own", "other" (Pulsar's), or None while they
    cannot tell yet. A Pulsar connection starts with CONNECT, ``[uint32 total][uint32 command size]
    [BaseCommand]`` with the command size exactly the total less 4 (no payload), and a total far below
    16 MiB, so its fifth byte is 0; an own-protocol frame's fifth byte starts a protobuf field tag,
    which is never 0. What is neither is left to the own decoder, which says what is wrong with it
    (an empty or oversized frame, or bytes that do not parse)."""
    if len(first) < 4:
        return None
    (total,) = struct.unpack_from(">I", first)
    if total < 8 or total > max_frame_size:
        return "own"
    if len(first) < 5:
        return None
    if first[4] != 0:
        return "own"
    if len(first) < 8:
        return None
    total, command_size = _SIZES.unpack_from(first)
    return "other" if command_size == total - 4 else "own"


class ServerConnection(BaseServerConnection[api.Command]):
    """One accepted connection of txnkeeper's own protocol; a ``Session`` for the handler.

    With ``other_wire`` (Pulsar's protocol, protocol/pulsar_server.py) one port serves both: the
    connection reads its first bytes until they tell the wire (``_wire_of``: at most eight, which a
    real first frame of either wire always has; until then the handshake and frame timeouts apply as
    to any partial frame), then either goes on or hands itself over.
    """

    def __init__(
        self,
        book: ConnectionBook,
        handler: CommandHandler,
        other_wire: Callable[[ConnectionBook], BaseServerConnection[Any]] | None = None,
    ) -> None:
        super().__init__(book, FrameDecoder(book.limits.max_frame_size), handler)
        self._commands = handler
        self._other_wire = other_wire
        self._sniffed = b""

    def data_received(self, data: bytes) -> None:
        if self._other_wire is None:
            super().data_received(data)
            return
        sniffed = self._sniffed + data
        wire = _wire_of(sniffed, self._limits.max_frame_size)
        if wire is None:
            self._sniffed = sniffed
            self.last_received = self._loop.time()
            if self.frame_started is None:
                self.frame_started = self.last_received
            return
        other_wire, self._other_wire, self._sniffed = self._other_wire, None, b""
        if wire == "other":
            self.hand_over(other_wire(self._book), sniffed)
        else:
            super().data_received(sniffed)

    def send(self, command: api.Command) -> None:
        if self._transport is not None:
            self.send_frame(encode_frame(command))

    def send_error_frame(self, code: int, message: str) -> None:
        if self._transport is not None:
            self.send_frame(encode_error(code, message))

    def push(self, command: api.Command) -> None:
        self.push_frame(encode_frame(command))

    def on_command(self, command: api.Command) -> None:
        request_id = command.request_id
        body = command.WhichOneof("body")
        assert body is not None
        try:
            result = self._commands.handle(self, body, command)
        except Exception as exc:
            self._reply(request_id, error_response(exc))
            return
        if result is None:
            return
        if isinstance(result, api.Command):
            self._reply(request_id, result)
            return
        future = as_future(self._loop, result)
        self.answer_later(future, command.ByteSize(), partial(self._answer, request_id))

    def _answer(self, request_id: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self._reply(request_id, error_response(ServiceError("request cancelled (server closing)")))
            return
        exc = future.exception()
        if exc is not None:
            self._reply(request_id, error_response(exc))
            return
        response = future.result()
        self._reply(request_id, response if isinstance(response, api.Command) else _success())

    def _reply(self, request_id: int, response: api.Command) -> None:
        response.request_id = request_id
        self.send(response)


class ProtocolServer:
    """Listens on one address; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self,
        handler: CommandHandler,
        limits: ConnectionLimits | None = None,
        *,
        other_wire: Callable[[ConnectionBook], BaseServerConnection[Any]] | None = None,
        tls: TlsSource | None = None,
    ) -> None:
        """``other_wire`` makes the connection of a second wire served on the same port (Pulsar's:
        pulsar_server.pulsar_wire); ``ServerConnection`` says how a connection's wire is told.
        ``tls``: every connection is TLS first (both wires; protocol/tls_accept.py), with the
        certificate ``tls`` holds when it connects."""
        self._tls = tls
        self.limits = limits or ConnectionLimits()
        self.stats = ServerStats()
        self._book = ConnectionBook(self.limits, self.stats)
        self._connections = partial(ServerConnection, handler=handler, other_wire=other_wire)
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = partial(self._connections, self._book)
        if self._tls is not None:
            factory = tls_factory(factory, self._tls, "client", self.limits.handshake_timeout_s)
        self._server = await loop.create_server(factory, host, port, reuse_address=True)
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)

    @property
    def _sweep_interval(self) -> float:
        limits = self.limits
        shortest = min(
            limits.idle_timeout_s, limits.frame_timeout_s, limits.write_timeout_s, limits.handshake_timeout_s
        )
        return min(1.0, max(0.05, shortest / 4))

    def _sweep(self) -> None:
        """Close connections whose first request or started frame is overdue, and idle ones that hold
        nothing; recount what each has unsent (pushes held back may go on)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        limits = self.limits
        for conn, since in list(self._book.handshaking.items()):  # oldest first
            if now - since <= limits.handshake_timeout_s:
                break
            conn.close_for(
                HANDSHAKE_TIMEOUT,
                api.RESOURCE_LIMIT,
                f"connection completed no request within {now - since:.1f}s of connecting (handshake"
                f" timeout {limits.handshake_timeout_s:g}s); send a request right after connecting",
            )
        for conn in list(self._book.open):
            conn.recount_unsent()
            conn.resume_pushes_if_room()
            held = conn.push_held_since
            if held is not None and now - held > limits.write_timeout_s:
                # Held back since: it read too little of what was pushed to it to drain to 16 KiB.
                conn.abort_for(
                    WRITE_TIMEOUT,
                    f"its peer has not read the messages pushed to it for {now - held:.1f}s (write"
                    f" timeout {limits.write_timeout_s:g}s); a consumer must read what it is sent",
                )
                continue
            paused = conn.write_paused_since
            if paused is not None:  # its requests are not being read: neither slow nor idle
                if now - paused > limits.write_timeout_s:
                    conn.abort_for(
                        WRITE_TIMEOUT,
                        f"its peer has not read its answers for {now - paused:.1f}s (write timeout"
                        f" {limits.write_timeout_s:g}s); the client must read what it is sent",
                    )
                continue
            if conn.requests_held:  # not read while its requests wait for answers: not slow, not idle
                continue
            started = conn.frame_started
            if started is not None and now - started > limits.frame_timeout_s:
                conn.close_for(
                    SLOW_FRAME,
                    api.RESOURCE_LIMIT,
                    f"a frame started {now - started:.1f}s ago is still incomplete"
                    f" ({conn.buffered} bytes so far; frame timeout {limits.frame_timeout_s:g}s)",
                )
            elif (
                now - conn.last_received > limits.idle_timeout_s
                and not conn.in_flight
                and not self._holds_state(conn)
            ):
                conn.close_for(
                    IDLE,
                    api.RESOURCE_LIMIT,
                    f"connection sent nothing for {now - conn.last_received:.1f}s"
                    f" (idle timeout {limits.idle_timeout_s:g}s); reconnect when needed",
                )
        self._sweeper = loop.call_later(self._sweep_interval, self._sweep)

    def _holds_state(self, conn: BaseServerConnection[Any]) -> bool:
        try:
            return conn.sessions.session_holds_state(conn)
        except Exception:
            log.exception("session state check failed")
            return True

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
        for conn in list(self._book.open):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def as_future(loop: asyncio.AbstractEventLoop, result: Awaitable[Any]) -> asyncio.Future[Any]:
    """A handler's asynchronous answer as a future: a future as it is (no task per request), a
    coroutine run as a task, any other awaitable wrapped."""
    if isinstance(result, asyncio.Future):
        return result
    if inspect.iscoroutine(result):
        return loop.create_task(result)
    return asyncio.ensure_future(result, loop=loop)


def require(condition: bool, message: str) -> None:
    """Reject a request whose fields make no sense, with a message naming the field."""
    if not condition:
        raise BadRequestError(message)
