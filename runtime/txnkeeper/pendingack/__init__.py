"""Pending-ack store (layer 3): one per subscription.

Its log is the managed ledger ``{topic}-{subscription}__transaction_pending_ack``.
"""

from txnkeeper.pendingack.store import CURSOR_NAME, PendingAckState, PendingAckStore, pending_ack_log_name
from txnkeeper.stores.recordlog import (
    BatchedWriteNotAllowedError,
    FormatLevelError,
    LiveEntryFormats,
    ReplayError,
    StoreAlreadyOpenError,
)
from txnkeeper.stores.txnstore import StoreClosedError
from txnkeeper.txnid import TxnID

__all__ = [
    "CURSOR_NAME",
    "BatchedWriteNotAllowedError",
    "FormatLevelError",
    "LiveEntryFormats",
    "PendingAckState",
    "PendingAckStore",
    "ReplayError",
    "StoreAlreadyOpenError",
    "StoreClosedError",
    "TxnID",
    "pending_ack_log_name",
]
