"""The client protocol server's connection limits as both CRs name them (``spec.connectionLimits``) and as
a pod reads them (``TXNKEEPER_*`` environment, the defaults of ``txnkeeper serve``'s flags).

Why here: the CRD (its types, floors and the defaults it documents come from this table), the operator
(which renders the CR into the pods' environment and reports what a pod would refuse) and the runtime
(``protocol/limits.py``'s ``ConnectionLimits``, whose defaults and floors these are; a test holds them
equal) must agree. Coordinator and store pods both serve the client protocol, so both CRs have it.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1024 * 1024
# protocol.frames.DEFAULT_MAX_FRAME_SIZE and protocol.limits.WRITE_HIGH_WATER: a connection's buffers
# must hold one frame of the maximum size (and an answer of it above the high-water mark).
MAX_FRAME_SIZE = 5 * MIB
WRITE_HIGH_WATER = MIB
# Timeouts are seconds, fractions allowed. The runtime takes anything above 0; the CR keeps them between
# a millisecond and a week (a timer a week away is as good as none, and a far larger one overflows).
MIN_TIMEOUT_SECONDS = 0.001
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class ConnectionLimit:
    """One limit: the pod's environment variable, int or float, the floor, the CR's ceiling (None:
    none), the runtime's default and what it bounds."""

    env: str
    kind: type
    minimum: float
    maximum: float | None
    default: float
    description: str

    @property
    def default_text(self) -> str:
        return number_text(self.default)


def number_text(value: float) -> str:
    """A limit as written in a message or a variable: whole numbers without a fraction."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _count(env: str, default: int, description: str, minimum: int = 1) -> ConnectionLimit:
    return ConnectionLimit(f"TXNKEEPER_{env}", int, minimum, None, default, description)


def _seconds(env: str, default: float, description: str) -> ConnectionLimit:
    return ConnectionLimit(
        f"TXNKEEPER_{env}", float, MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS, default, description
    )


# CR field -> the limit (serve's flag is the env name without TXNKEEPER_, lower case, dashes).
CONNECTION_LIMITS: dict[str, ConnectionLimit] = {
    "maxConnections": _count(
        "MAX_CONNECTIONS",
        1024,
        "Client protocol connections open at once; more are refused with an error frame.",
    ),
    "maxConnectionsPerAddress": _count(
        "MAX_CONNECTIONS_PER_ADDRESS",
        256,
        "Connections one peer address may hold open (Pulsar's brokerMaxConnectionsPerIp); more are refused.",
    ),
    "maxHandshakingConnections": _count(
        "MAX_HANDSHAKING_CONNECTIONS",
        64,
        "Connections that have not completed a request yet; the oldest is closed to admit a new one, so "
        "idle sockets cannot lock clients out.",
    ),
    "handshakeTimeoutSeconds": _seconds(
        "HANDSHAKE_TIMEOUT", 10.0, "Seconds a new connection has to complete its first request."
    ),
    "idleTimeoutSeconds": _seconds(
        "IDLE_TIMEOUT",
        600.0,
        "Seconds a connection without consumers and awaiting no answer may send nothing before it is closed.",
    ),
    "frameTimeoutSeconds": _seconds(
        "FRAME_TIMEOUT", 30.0, "Seconds a started frame has to arrive completely."
    ),
    "writeTimeoutSeconds": _seconds(
        "WRITE_TIMEOUT", 120.0, "Seconds a connection may leave its answers unread before it is aborted."
    ),
    "maxPendingBytes": _count(
        "MAX_PENDING_BYTES",
        64 * MIB,
        "Bytes of incomplete frames buffered across all connections; the connection that would exceed it "
        "is closed. At least one frame of the maximum size (5 MiB).",
        minimum=MAX_FRAME_SIZE,
    ),
    "maxUnsentBytes": _count(
        "MAX_UNSENT_BYTES",
        32 * MIB,
        "Bytes of answers and pushed messages one connection may leave unread; more aborts it. At least a "
        "maximum frame plus 1 MiB.",
        minimum=MAX_FRAME_SIZE + WRITE_HIGH_WATER,
    ),
    "maxTotalUnsentBytes": _count(
        "MAX_TOTAL_UNSENT_BYTES",
        64 * MIB,
        "Bytes all connections together may leave unread; past it messages are pushed only to connections "
        "holding under 64 KiB unread (the process-wide push budget). At least a maximum frame plus 1 MiB.",
        minimum=MAX_FRAME_SIZE + WRITE_HIGH_WATER,
    ),
    "maxRequestsInFlight": _count(
        "MAX_REQUESTS_IN_FLIGHT",
        1000,
        "Requests one connection may have unanswered (a Pulsar producer's sends until their receipts); past "
        "it the connection is not read until half of them are answered (Pulsar's "
        "maxPendingPublishRequestsPerConnection).",
    ),
    "maxTotalRequestBytes": _count(
        "MAX_TOTAL_REQUEST_BYTES",
        64 * MIB,
        "Bytes the unanswered requests of all connections together may hold; past it a connection adding "
        "one is not read until they hold half of it. At least one frame of the maximum size (5 MiB).",
        minimum=MAX_FRAME_SIZE,
    ),
}


def _problem(section: str, table: Mapping[str, ConnectionLimit], field: str, value: object) -> str | None:
    limit = table[field]
    what = f"spec.{section}.{field}"
    ceiling = "" if limit.maximum is None else f"..{number_text(limit.maximum)}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{what} must be a number, got {value!r:.60}"
    if limit.kind is int and (isinstance(value, float) and not value.is_integer()):
        return f"{what} must be an integer, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{what} must be a finite number, got {value!r}"
    if value < limit.minimum or (limit.maximum is not None and value > limit.maximum):
        return f"{what} must be in {number_text(limit.minimum)}{ceiling}, got {value!r}"
    return None


def section_problems(section: str, table: Mapping[str, ConnectionLimit], spec: object) -> list[str]:
    """What a pod would refuse in a CR's ``spec.<section>``, a section of numbers rendered as the
    pods' environment by ``table`` (empty: nothing), naming the field."""
    if not isinstance(spec, Mapping):
        return [f"spec.{section} must be an object, got {type(spec).__name__}"]
    problems = []
    for field, value in spec.items():
        if field not in table:
            problems.append(f"spec.{section}.{field} is not a field; the fields are {', '.join(table)}")
        elif value is not None and (problem := _problem(section, table, field, value)) is not None:
            problems.append(problem)
    return problems


def section_env(table: Mapping[str, ConnectionLimit], spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """(environment variable, value) for each field of ``table`` the CR sets, in the table's order
    (checked first with ``section_problems``)."""
    out = []
    for field, limit in table.items():
        value = spec.get(field)
        if value is None:
            continue
        assert isinstance(value, int | float)
        out.append((limit.env, number_text(value)))
    return out


def connection_limit_problems(spec: object) -> list[str]:
    """What a pod would refuse in a CR's ``spec.connectionLimits`` (empty: nothing), naming the field."""
    return section_problems("connectionLimits", CONNECTION_LIMITS, spec)


def connection_env(spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """(environment variable, value) for each limit the CR sets (checked first with
    ``connection_limit_problems``)."""
    return section_env(CONNECTION_LIMITS, spec)
