"""Client-side errors (the server's errors arrive as ``txnkeeper.errors.ServiceError``).

The single-routing-key writer's errors (PDP-44) are here too: some are raised by the client alone
(size, timeout), the others are what a store's answer means for the writer (fenced, state lost,
feature missing), so an application can act on each: shrink the transaction, retry it, stop the
older writer, or start from what the topic holds.
"""

from __future__ import annotations

from txnkeeper.errors import RequestTimeoutError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api


class TransactionFailedError(ServiceError):
    """An operation inside the transaction failed, so the client aborted it instead of committing."""


class ClientClosedError(ServiceError):
    """The client, producer or consumer was closed."""


# A request got no response within the client's operation timeout (its outcome is unknown).
OperationTimeoutError = RequestTimeoutError


class TxnFailedError(TransactionFailedError):
    """A single-key transaction failed before anything of it was sent (its timeout passed before
    commit): nothing was written; begin a new transaction to retry."""


class MaxTransactionSizeExceededError(ServiceError):
    """A write would take a single-key transaction over the writer's ``max_txn_bytes``; the write is
    refused and nothing of the transaction was sent (commit what fits, or create the writer with a
    larger limit)."""

    code = api.BAD_REQUEST


class UnsupportedFeatureError(ServiceError):
    """The store does not serve single-routing-key appends (an older release, or the feature is
    switched off on that store): upgrade it, or use a full transaction."""

    code = api.UNSUPPORTED_FEATURE


class WriterStateLostError(ServiceError):
    """The store no longer knows what this writer id appended (its state expired or was trimmed), so
    whether an unacknowledged block was applied cannot be decided. The client does not re-send it
    (that could apply it twice): read the topic to find out, then continue with a new writer."""

    code = api.WRITER_STATE_LOST


class WriterFencedError(ServiceError):
    """A newer session with the same writer id took over this writer on the store; this one can no
    longer append. Stop one of the two writers."""

    code = api.WRITER_FENCED


class ProducerFencedError(WriterFencedError):
    """Another producer with the same name opened on the store after this one (the newest producer of
    a name fences the older ones, like a writer's SetupAppend): this producer's sends are refused from
    now on and it does not reconnect. Sends answered before stay written, once. Close it; run one
    producer per name (a restarted application reusing its name is the newer one and continues)."""


def writer_error(failure: BaseException, context: str) -> BaseException:
    """The client-side error a store's refusal means for a writer (by its code), else ``failure``."""
    if isinstance(failure, ServiceError) and not isinstance(failure, _WRITER_ERRORS):
        cls = _BY_CODE.get(failure.code)
        if cls is not None:
            converted = cls(f"{context}: {failure}", failure.code)
            converted.__cause__ = failure
            return converted
    return failure


_WRITER_ERRORS = (UnsupportedFeatureError, WriterStateLostError, WriterFencedError)
_BY_CODE: dict[int, type[ServiceError]] = {
    api.WRITER_FENCED: WriterFencedError,
    api.WRITER_STATE_LOST: WriterStateLostError,
    api.UNSUPPORTED_FEATURE: UnsupportedFeatureError,
}
