"""Transaction log store (layer 3): one per coordinator, on ``__transaction_log_{coordinatorId}``."""

from txnkeeper.stores.recordlog import (
    BatchedWriteNotAllowedError,
    FormatLevelError,
    LiveEntryFormats,
    ReplayError,
    StoreAlreadyOpenError,
)
from txnkeeper.stores.txnstore import StoreClosedError
from txnkeeper.txnid import TxnID, TxnIdLike
from txnkeeper.txnlog.store import (
    CURSOR_NAME,
    TransactionLogStore,
    TxnLogRecord,
    TxnLogState,
    transaction_log_name,
)

__all__ = [
    "CURSOR_NAME",
    "BatchedWriteNotAllowedError",
    "FormatLevelError",
    "LiveEntryFormats",
    "ReplayError",
    "StoreAlreadyOpenError",
    "StoreClosedError",
    "TransactionLogStore",
    "TxnID",
    "TxnIdLike",
    "TxnLogRecord",
    "TxnLogState",
    "transaction_log_name",
]
