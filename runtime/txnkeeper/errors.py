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
    code = api.NOT_SERVED_HERE


class UnavailableError(ServiceError):
    """The server cannot serve this yet (recovering) or any more (closing); retrying may succeed."""

    code = api.UNAVAILABLE


class ConsumerBusyError(ServiceError):
    code = api.CONSUMER_BUSY


class DataUnreadableError(ServiceError):
    """Stored entries cannot be read (offloaded tier data damaged or unreachable, ...): nothing is
    served in their place; the store retries and serves them once they can be read."""

    code = api.DATA_UNREADABLE


class ConnectionClosedError(ServiceError):
    """The connection carrying a request went away before its response arrived."""

    code = api.UNAVAILABLE


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
    )
}


def from_error_frame(error: api.Error) -> ServiceError:
    """Rebuild the exception a remote service raised."""
    cls = _BY_CODE.get(error.code, ServiceError)
    return cls(error.message, error.code)
