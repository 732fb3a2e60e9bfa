"""What the transaction log and pending-ack stores share (layer 3, below both stores).

``recordlog``: a log of records on one managed ledger (buffered writes, replay, record-level deletes,
the format-level rule, the live-entry census); ``txnstore``: records grouped by transaction and the
one ``open_store`` prelude (open the log, build the store, replay). Each store package adds only its
record semantics and its ledger naming.
"""

from txnkeeper.stores.recordlog import (
    BatchedWriteNotAllowedError,
    FormatLevelError,
    LiveEntryFormats,
    RecordLog,
    ReplayError,
    StoreAlreadyOpenError,
)
from txnkeeper.stores.txnstore import StoreClosedError, StoreSnapshot, TxnRecordStore, open_store

__all__ = [
    "BatchedWriteNotAllowedError",
    "FormatLevelError",
    "LiveEntryFormats",
    "RecordLog",
    "ReplayError",
    "StoreAlreadyOpenError",
    "StoreClosedError",
    "StoreSnapshot",
    "TxnRecordStore",
    "open_store",
]
