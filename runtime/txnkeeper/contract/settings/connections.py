"""The client protocol server's connection limits and a store pod's memory budget, declared once: serve's
``--max-connections`` ... flags and their ``TXNKEEPER_*`` env (what the operator renders a CR's
``spec.connectionLimits`` / ``spec.memory`` into), the ``--config`` file's sections of the same names and
the CRs' fields (``contract.connections`` and ``contract.memory`` derive their tables from these).

Why: the CRD's table, serve's argparse types and ``ConnectionLimits``' checks each said the floors on
their own, and a pod took ``--idle-timeout 1e308`` that a CR refused. The limits between values (a
buffer must hold one frame of the maximum size) are ``protocol.limits.ConnectionLimits``'; the floors
here already make every combination of them hold, as the maximum frame size is not a setting.
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

MIB = 1024 * 1024
# protocol.frames.DEFAULT_MAX_FRAME_SIZE and protocol.limits.WRITE_HIGH_WATER: a connection's buffers
# must hold one frame of the maximum size (and an answer of it above the high-water mark).
MAX_FRAME_SIZE = 5 * MIB
WRITE_HIGH_WATER = MIB
# Timeouts are seconds, fractions allowed, between a millisecond and a week (a timer a week away is as
# good as none, and a far larger one overflows the event loop's clock).
MIN_TIMEOUT_SECONDS = 0.001
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
# The largest tail cache: beyond any pod's memory, and within what a 64-bit count holds.
MAX_TAIL_CACHE_BYTES = 2**40


def _count(key: str, default: int, description: str, *, minimum: int = 1, unit: str | None = None) -> Setting:
    """A count whose flag is the env name in lower case with dashes (``MAX_CONNECTIONS``:
    ``--max-connections``), as serve's flags always were."""
    env = _env_of(key)
    return Setting(
        key,
        _field(key),
        "int",
        default,
        description,
        flag="--" + env.lower().replace("_", "-"),
        env=env,
        minimum=minimum,
        unit=unit,
        hint=f" (default {default})",
    )


def _seconds(key: str, default: float, description: str) -> Setting:
    env = _env_of(key).removesuffix("_SECONDS")
    return Setting(
        key,
        _field(key).removesuffix("_seconds") + "_s",
        "number",
        default,
        description,
        flag="--" + env.lower().replace("_", "-"),
        env=env,
        minimum=MIN_TIMEOUT_SECONDS,
        maximum=MAX_TIMEOUT_SECONDS,
        unit="s",
        hint=f" (default {default:g})",
    )


def _env_of(key: str) -> str:
    """``maxConnectionsPerAddress`` -> ``MAX_CONNECTIONS_PER_ADDRESS``."""
    return "".join(f"_{c}" if c.isupper() else c.upper() for c in key)


def _field(key: str) -> str:
    return _env_of(key).lower()


CONNECTIONS = Section(
    "connectionLimits",
    "Limits of a pod's client protocol server (issue 25: bounded memory under any client). Pods read them "
    "at start.",
    (
        _count(
            "maxConnections",
            1024,
            "Client protocol connections open at once; more are refused with an error frame.",
        ),
        _count(
            "maxConnectionsPerAddress",
            256,
            "Connections one peer address may hold open (Pulsar's brokerMaxConnectionsPerIp); more are "
            "refused.",
        ),
        _count(
            "maxHandshakingConnections",
            64,
            "Connections that have not completed a request yet; the oldest is closed to admit a new one, "
            "so idle sockets cannot lock clients out.",
        ),
        _seconds(
            "handshakeTimeoutSeconds", 10.0, "Seconds a new connection has to complete its first request."
        ),
        _seconds(
            "idleTimeoutSeconds",
            600.0,
            "Seconds a connection without consumers and awaiting no answer may send nothing before it is "
            "closed.",
        ),
        _seconds("frameTimeoutSeconds", 30.0, "Seconds a started frame has to arrive completely."),
        _seconds(
            "writeTimeoutSeconds",
            120.0,
            "Seconds a connection may leave its answers unread before it is aborted.",
        ),
        _count(
            "maxPendingBytes",
            64 * MIB,
            "Bytes of incomplete frames buffered across all connections; the connection that would exceed "
            "it is closed. At least one frame of the maximum size (5 MiB).",
            minimum=MAX_FRAME_SIZE,
            unit="bytes",
        ),
        _count(
            "maxUnsentBytes",
            32 * MIB,
            "Bytes of answers and pushed messages one connection may leave unread; more aborts it. At least "
            "a maximum frame plus 1 MiB.",
            minimum=MAX_FRAME_SIZE + WRITE_HIGH_WATER,
            unit="bytes",
        ),
        _count(
            "maxTotalUnsentBytes",
            64 * MIB,
            "Bytes all connections together may leave unread; past it messages are pushed only to "
            "connections holding under 64 KiB unread (the process-wide push budget). At least a maximum "
            "frame plus 1 MiB.",
            minimum=MAX_FRAME_SIZE + WRITE_HIGH_WATER,
            unit="bytes",
        ),
        _count(
            "maxRequestsInFlight",
            1000,
            "Requests one connection may have unanswered (a Pulsar producer's sends until their receipts); "
            "past it the connection is not read until half of them are answered (Pulsar's "
            "maxPendingPublishRequestsPerConnection).",
        ),
        _count(
            "maxTotalRequestBytes",
            64 * MIB,
            "Bytes the unanswered requests of all connections together may hold; past it a connection "
            "adding one is not read until they hold half of it. At least one frame of the maximum size "
            "(5 MiB).",
            minimum=MAX_FRAME_SIZE,
            unit="bytes",
        ),
    ),
)

MEMORY = Section(
    "memory",
    "A store pod's memory budgets (only store pods keep a tail cache). Pods read them at start.",
    (
        Setting(
            "tailCacheBytes",
            "tail_cache_bytes",
            "int",
            64 * MIB,
            "Bytes of recently written entries all topics of a store pod keep in memory for consumers that "
            "keep up (each entry counts its payload plus 240); the oldest go first, whichever topic wrote "
            "them; 0 keeps none (every read goes to disk). Keep it well under the pod's memory limit.",
            flag="--tail-cache-bytes",
            env="TAIL_CACHE_BYTES",
            minimum=0,
            maximum=MAX_TAIL_CACHE_BYTES,
            unit="bytes",
            range_text=f"of bytes in 0..{MAX_TAIL_CACHE_BYTES} (0: no tail cache, consumers read from disk)",
            hint=f" (default {64 * MIB})",
        ),
    ),
)
