"""Client-side errors (the server's errors arrive as ``txnkeeper.errors.ServiceError``)."""

from __future__ import annotations

from txnkeeper.errors import RequestTimeoutError, ServiceError


class TransactionFailedError(ServiceError):
    """An operation inside the transaction failed, so the client aborted it instead of committing."""


class ClientClosedError(ServiceError):
    """The client, producer or consumer was closed."""


# A request got no response within the client's operation timeout (its outcome is unknown).
OperationTimeoutError = RequestTimeoutError
