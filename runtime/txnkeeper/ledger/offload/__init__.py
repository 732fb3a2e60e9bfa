"""Layer 1 offload (PIP-76 streaming offload): blob stores, Pulsar's object format, the offloader.

What exists: the BlobStore interface with ``filesystem`` and ``s3`` drivers, Pulsar's byte-exact data
block and index formats (with a per-block CRC carried in the index's LedgerInfo properties), a streaming
segment writer and a verifying segment reader, and the managed ledger's ``Offloader`` (segments in
ledger metadata, read-through, deletion rules; ``offloader.py``). Admin/CLI and operator wiring come
later (docs/contracts.md section 9). The ``s3`` driver lives in ``txnkeeper.ledger.offload.s3`` and is
imported only when used, since boto3 is an optional dependency (the ``offload`` extra).
"""

from .blobstore import BlobStore, BlobUpload
from .config import OffloadConfig
from .errors import (
    BlobNotFound,
    BlobStoreError,
    BlobStoreUnavailable,
    OffloadConfigError,
    OffloadCorruptionError,
    OffloadError,
    OffloadFormatError,
    OffloadInputError,
    OffloadRangeError,
)
from .filesystem import FileSystemBlobStore
from .reader import IndexCache, OffloadedEntry, SegmentReader
from .writer import BlockDescription, SegmentDescription, SegmentWriter, data_key, index_key

__all__ = [
    "BlobNotFound",
    "BlobStore",
    "BlobStoreError",
    "BlobStoreUnavailable",
    "BlobUpload",
    "BlockDescription",
    "FileSystemBlobStore",
    "IndexCache",
    "OffloadConfig",
    "OffloadConfigError",
    "OffloadCorruptionError",
    "OffloadError",
    "OffloadFormatError",
    "OffloadInputError",
    "OffloadRangeError",
    "OffloadedEntry",
    "SegmentDescription",
    "SegmentReader",
    "SegmentWriter",
    "data_key",
    "index_key",
]


def open_store(config: OffloadConfig) -> BlobStore:
    """The driver ``config`` names (credentials for S3 come from boto3's usual chain)."""
    if config.is_s3:
        from .s3 import S3BlobStore

        return S3BlobStore.from_config(config)
    return FileSystemBlobStore(config.fileSystemURI)
