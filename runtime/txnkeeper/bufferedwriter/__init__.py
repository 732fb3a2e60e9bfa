"""PIP-160 buffered writer (layer 2): batches log records into durable ledger entries.

Exports the writer, its settings, the Pulsar-compatible batched entry codec and the writer metrics.
"""

from txnkeeper.bufferedwriter.codec import (
    BATCH_HEADER,
    BATCH_MAGIC,
    BATCH_VERSION,
    PENDING_ACK_CODEC,
    TXN_LOG_CODEC,
    DecodedEntry,
    EntryDecodeError,
    RecordCodec,
    RecordEncodeError,
    UnknownBatchVersionError,
    decode_entry,
    encode_batch,
    is_batched,
)
from txnkeeper.bufferedwriter.config import BatchedWriteConfig, InvalidBatchedWriteConfigError
from txnkeeper.bufferedwriter.metrics import (
    PENDING_ACK_PREFIX,
    TXN_LOG_PREFIX,
    BufferedWriterMetrics,
    FlushTrigger,
)
from txnkeeper.bufferedwriter.writer import (
    BufferedWriter,
    BufferedWriterClosedError,
    EntryLog,
    WritePosition,
    WriterState,
)

__all__ = [
    "BATCH_HEADER",
    "BATCH_MAGIC",
    "BATCH_VERSION",
    "PENDING_ACK_CODEC",
    "PENDING_ACK_PREFIX",
    "TXN_LOG_CODEC",
    "TXN_LOG_PREFIX",
    "BatchedWriteConfig",
    "BufferedWriter",
    "BufferedWriterClosedError",
    "BufferedWriterMetrics",
    "DecodedEntry",
    "EntryDecodeError",
    "EntryLog",
    "FlushTrigger",
    "InvalidBatchedWriteConfigError",
    "RecordCodec",
    "RecordEncodeError",
    "UnknownBatchVersionError",
    "WritePosition",
    "WriterState",
    "decode_entry",
    "encode_batch",
    "is_batched",
]
