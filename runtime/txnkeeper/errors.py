"""Errors that cross the wire: a service raises one, the peer receives the same code and message.

Keeping one exception type per meaning lets the client library turn an error frame back into the
exception the caller can act on (a conflict means "abort", unavailable means "retry").

They live in the shared low layer, not in ``protocol``, because they are domain errors: the coordinator
and topics raise them without knowing about frames, and the wire only carries their code and message.
"""

from __future__ import annotations

from txnkeeper.pb import txnkeeper_api_pb2 as api


class ServiceError(Exception):
    """A request failed for a reason the caller is told about (an ``Error`` frame)."""

    code: int = api.UNKNOWN_ERROR

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class BadRequestError(ServiceError):
    code = api.BAD_REQUEST


class TxnNotFoundError(ServiceError):
    code = api.TXN_NOT_FOUND


class InvalidTxnStatusError(ServiceError):
    code = api.INVALID_TXN_STATUS


class TxnConflictError(ServiceError):
    """A transactional ack met a message already pending in another transaction."""

    code = api.TXN_CONFLICT


class NotServedHereError(ServiceError):
    """Not on this pod. With ``owner_address`` set, placement says where it is served now (a redirect,
    docs/contracts.md §12); with it empty and ``moving`` true, it is being moved: retry shortly."""

    code = api.NOT_SERVED_HERE

    def __init__(
        self,
        message: str,
        code: int | None = None,
        *,
        owner_address: str = "",
        placement_epoch: int = 0,
    ) -> None:
        super().__init__(message, code)
        self.owner_address = owner_address
        self.placement_epoch = placement_epoch


class UnavailableError(ServiceError):
    """The server cannot serve this yet (recovering) or any more (closing); retrying may succeed."""

    code = api.UNAVAILABLE


class ConsumerBusyError(ServiceError):
    code = api.CONSUMER_BUSY


class DataUnreadableError(ServiceError):
    """Stored entries cannot be read (offloaded tier data damaged or unreachable, ...): nothing is
    served in their place; the store retries and serves them once they can be read."""

    code = api.DATA_UNREADABLE


class BacklogQuotaExceededError(ServiceError):
    """A send to a topic whose backlog quota is exceeded was refused, or held until the store gave up
    (Pulsar's ProducerBlockedQuotaExceededException); nothing was written. Retry once the backlog
    drains."""

    code = api.BACKLOG_QUOTA_EXCEEDED


class ConnectionClosedError(ServiceError):
    """The connection carrying a request went away before its response arrived."""

    code = api.UNAVAILABLE


class TlsHandshakeError(ConnectionClosedError):
    """A TLS connection could not be set up: the message says which certificate was refused and why
    (contract/tls.py ``describe``); retrying does not help until the certificates are fixed."""


class RequestTimeoutError(ServiceError):
    """No response within the caller's timeout; the request's outcome is unknown."""

    code = api.UNAVAILABLE


_BY_CODE: dict[int, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        TxnNotFoundError,
        InvalidTxnStatusError,
        TxnConflictError,
        NotServedHereError,
        UnavailableError,
        ConsumerBusyError,
        DataUnreadableError,
        BacklogQuotaExceededError,
    )
}


def from_error_frame(error: api.Error) -> ServiceError:
    """Rebuild the exception a remote service raised."""
    if error.code == api.NOT_SERVED_HERE:
        return NotServedHereError(
            error.message, owner_address=error.owner_address, placement_epoch=error.placement_epoch
        )
    cls = _BY_CODE.get(error.code, ServiceError)
    return cls(error.message, error.code)
