"""What one server process lets its connections hold, and the counters that show those limits at work.

Why: every byte a peer sends before its frame is complete sits in the server's memory, and every
connection costs a socket and buffers. Without bounds, 80 connections each sending most of a 5 MiB
frame grow a pod by 400 MB, and connections that send nothing (or half a frame) stay forever. Each
refusal is an error frame with code RESOURCE_LIMIT (or FRAME_TOO_LARGE) and a logged close naming the
limit, and is counted by reason.

The other direction too: a peer that sends requests but does not read the answers (or the messages
pushed to its consumers) would make the server buffer every answer. When a connection's unsent bytes
pass the transport's high-water mark the server stops reading that connection's requests until the
peer reads (the peer's own sends then block in its kernel buffers); a connection whose unsent bytes
still pass ``max_unsent_bytes`` (pushes keep coming) or that stays unread for ``write_timeout_s`` is
aborted, counted like the other limits. What it had acknowledged is durable; what it had not is
unknown to it, as after any lost connection.

Messages pushed to consumers are the one output a peer does not ask for request by request, so they
are held back before they pile up: a connection whose unsent bytes reach the high-water mark gets no
pushes until its peer reads (its subscriptions dispatch to other consumers or wait), and once the
unsent bytes of all connections together reach ``max_total_unsent_bytes`` only connections holding
less than ``PUSH_FLOOR`` are pushed to (so consumers that read keep receiving while lazy ones hold the
budget). Without this, consumers that subscribe with 100,000 permits and never read grew a store pod
by their topics' size each (issue 25).

Connections that have not completed a request yet (*handshaking*: an idle socket, or one trickling its
first frame) cost the same slot as a working client. They have their own, smaller cap (the oldest is
closed to admit a new one, so a flood of idle sockets cannot keep a client that sends its first
request at once from getting in), a short ``handshake_timeout_s``, and every peer address may hold at
most ``max_connections_per_address`` connections of any kind.

Requests a peer pipelines faster than they are answered (sends waiting for their write, above all)
each hold their frame in memory until answered. A connection with ``max_requests_in_flight``
unanswered requests is not read until half of them are answered, and once the requests in flight of
all connections together hold ``max_total_request_bytes``, a connection that adds one is not read until
they hold half of it (Pulsar's ``maxPendingPublishRequestsPerConnection`` and
``maxMessagePublishBufferSizeInMB``): the peer's further sends wait in its kernel buffers and its own
client's queue, and nothing it sent is refused. Without this, one ``pulsar-perf produce`` with an
unbounded rate had 50,000 sends in a store pod's memory and a median receipt latency of 14 s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from txnkeeper.protocol.frames import DEFAULT_MAX_FRAME_SIZE

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_FRAME_TIMEOUT_S = 30.0
DEFAULT_MAX_UNSENT_BYTES = 32 * 1024 * 1024
DEFAULT_WRITE_TIMEOUT_S = 120.0
DEFAULT_MAX_TOTAL_UNSENT_BYTES = 64 * 1024 * 1024
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_HANDSHAKING_CONNECTIONS = 64
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 256
DEFAULT_MAX_REQUESTS_IN_FLIGHT = 1000
DEFAULT_MAX_TOTAL_REQUEST_BYTES = 64 * 1024 * 1024
# A connection holding less than this unsent is pushed to even while the process-wide budget is spent
# (asyncio's own default high-water mark): a consumer that reads is never starved by lazy ones.
PUSH_FLOOR = 64 * 1024
# Above this many unsent bytes a connection's requests are no longer read (asyncio's default is 64 KiB).
WRITE_HIGH_WATER = 1024 * 1024

# close/refusal reasons (the metrics' label values)
TOO_MANY_CONNECTIONS = "max_connections"
PENDING_BUDGET = "max_pending_bytes"
IDLE = "idle_timeout"
SLOW_FRAME = "frame_timeout"
BAD_FRAME = "bad_frame"
UNSENT_BUDGET = "max_unsent_bytes"
WRITE_TIMEOUT = "write_timeout"
TOO_MANY_FROM_ADDRESS = "max_connections_per_address"
HANDSHAKE_TIMEOUT = "handshake_timeout"
HANDSHAKE_EVICTED = "handshake_evicted"


class InvalidLimitsError(ValueError):
    """A limit is out of range (the message names it)."""


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-process limits of the client protocol server.

    ``max_pending_bytes``: bytes of incomplete frames buffered across all connections; the connection
    whose data would exceed it is closed. ``idle_timeout_s``: a connection that sent nothing for this
    long, awaits no answer and holds no server-side state (no subscribed consumer) is closed.
    ``frame_timeout_s``: a frame whose first bytes arrived must be complete within this.
    ``max_unsent_bytes``: answers and pushed messages one connection may have waiting for its peer to
    read them; more aborts the connection. ``write_timeout_s``: a connection whose peer has not read
    enough to take its unsent bytes below the high-water mark for this long is aborted.
    ``max_total_unsent_bytes``: unsent bytes of all connections together past which pushes go only to
    connections holding less than ``PUSH_FLOOR``. ``handshake_timeout_s``: a connection must complete
    its first request within this. ``max_handshaking_connections``: connections that have not completed
    a request yet; the oldest is closed to admit a new one. ``max_connections_per_address``: connections
    of one peer address (handshaking or not); more are refused. ``max_requests_in_flight``: requests
    of one connection not yet answered past which it is not read until half are answered.
    ``max_total_request_bytes``: bytes of the requests in flight of all connections together past
    which a connection adding one is not read until they are half of it.
    """

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    frame_timeout_s: float = DEFAULT_FRAME_TIMEOUT_S
    max_unsent_bytes: int = DEFAULT_MAX_UNSENT_BYTES
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    max_total_unsent_bytes: int = DEFAULT_MAX_TOTAL_UNSENT_BYTES
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_handshaking_connections: int = DEFAULT_MAX_HANDSHAKING_CONNECTIONS
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT
    max_total_request_bytes: int = DEFAULT_MAX_TOTAL_REQUEST_BYTES

    def __post_init__(self) -> None:
        for name in (
            "max_frame_size",
            "max_connections",
            "max_pending_bytes",
            "max_unsent_bytes",
            "max_total_unsent_bytes",
            "max_handshaking_connections",
            "max_connections_per_address",
            "max_requests_in_flight",
            "max_total_request_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidLimitsError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("idle_timeout_s", "frame_timeout_s", "write_timeout_s", "handshake_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise InvalidLimitsError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.max_pending_bytes < self.max_frame_size:
            raise InvalidLimitsError(
                f"max_pending_bytes ({self.max_pending_bytes}) must be at least max_frame_size"
                f" ({self.max_frame_size}), or no frame of the maximum size could ever arrive"
            )
        if self.max_unsent_bytes < self.max_frame_size + WRITE_HIGH_WATER:
            raise InvalidLimitsError(
                f"max_unsent_bytes ({self.max_unsent_bytes}) must be at least max_frame_size plus"
                f" {WRITE_HIGH_WATER} ({self.max_frame_size + WRITE_HIGH_WATER}), or one answer of the"
                " maximum size could close a connection that reads normally"
            )
        if self.max_total_unsent_bytes < self.max_frame_size + WRITE_HIGH_WATER:
            raise InvalidLimitsError(
                f"max_total_unsent_bytes ({self.max_total_unsent_bytes}) must be at least max_frame_size"
                f" plus {WRITE_HIGH_WATER} ({self.max_frame_size + WRITE_HIGH_WATER}), as max_unsent_bytes"
            )
        if self.max_total_request_bytes < self.max_frame_size:
            raise InvalidLimitsError(
                f"max_total_request_bytes ({self.max_total_request_bytes}) must be at least max_frame_size"
                f" ({self.max_frame_size}), or a request of the maximum size would stop every connection"
            )


@dataclass
class ServerStats:
    """Live figures of one protocol server (read by the pod's /metrics collector)."""

    open_connections: int = 0
    pending_bytes: int = 0
    write_paused: int = 0  # connections whose requests are not read until their peer reads answers
    unsent_bytes: int = 0  # answers and pushes not yet read by peers, all connections together
    push_paused: int = 0  # connections whose consumers get no pushes until their peer reads
    handshaking: int = 0  # connections that have not completed a request yet
    request_bytes: int = 0  # bytes of requests read but not answered yet, all connections together
    request_held: int = 0  # connections not read until their (or all connections') requests are answered
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # reason -> connections refused at accept
    closed: Counter[str] = field(default_factory=Counter)  # reason -> connections closed by a limit
