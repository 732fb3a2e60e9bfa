"""What the Pulsar-protocol modules of a pod share: building commands, Pulsar's errors and the
refusal types, and the constants of the wire they agree on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from txnkeeper.errors import ServiceError
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import encode_command
from txnkeeper.protocol.pulsar_server import server_error
from txnkeeper.server.pulsar_coordinator import CoordinatorNotFoundError

log = logging.getLogger(__name__)

T = pulsar.BaseCommand
# The newest protocol version this server speaks (v20: topic migration, which it never sends).
SERVER_PROTOCOL_VERSION = 20
MAX_PERMITS = 100_000
SCHEMA_BYTES = 0  # Schema.Type None: raw bytes (what a client without a schema sends, if anything)
SCHEMA_STRING = 1


def new_command(kind: int) -> pulsar.BaseCommand:
    return pulsar.BaseCommand(type=kind)  # type: ignore[arg-type]


def success(request_id: int) -> bytes:
    command = new_command(T.SUCCESS)
    command.success.request_id = request_id
    return encode_command(command)


class NotAllowedError(ServiceError):
    """Something Pulsar's protocol has that this server does not serve (yet): Pulsar's NotAllowedError."""


class ChecksumError(ServiceError):
    """A SEND whose CRC32C does not match its metadata and payload (Pulsar's ChecksumError)."""


def pulsar_error(exc: BaseException) -> tuple[int, str]:
    """Pulsar's ServerError and message for a command that failed with ``exc``."""
    if isinstance(exc, NotAllowedError):
        return pulsar.NotAllowedError, str(exc)
    if isinstance(exc, ChecksumError):
        return pulsar.ChecksumError, str(exc)
    if isinstance(exc, CoordinatorNotFoundError):
        return pulsar.TransactionCoordinatorNotFound, str(exc)
    if isinstance(exc, ServiceError):
        return server_error(exc.code), str(exc)
    log.error("a Pulsar command failed unexpectedly", exc_info=exc)
    return pulsar.UnknownError, f"{type(exc).__name__}: {exc}"


def log_failure(what: str, future: asyncio.Future[Any]) -> None:
    """Log why ``what`` failed: a command with nobody to answer (an ack without a request id)."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("%s failed: %s", what, exc)
