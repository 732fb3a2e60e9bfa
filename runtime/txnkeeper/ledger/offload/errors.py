"""Errors of the offload layer, each naming what was wrong, where, and what to do.

Blob-store failures name the store (``s3://bucket`` or ``file:///dir``) and the key, so an operator can
look at the object; corruption names the segment uuid, the part (block) and the byte offset, so nothing
corrupt is ever mistaken for data and the damaged object can be found.
"""

from __future__ import annotations


class OffloadError(Exception):
    """Base of every offload-layer error."""


class OffloadConfigError(OffloadError, ValueError):
    """An offload setting is out of range or missing; the message names the Pulsar key."""


class OffloadInputError(OffloadError, ValueError):
    """A caller fed the writer or reader something invalid (order, ids, sizes); nothing was uploaded."""


class BlobStoreError(OffloadError):
    """A blob-store operation failed; names the store location and the key."""

    def __init__(self, location: str, key: str | None, problem: str, remedy: str | None = None) -> None:
        self.location = location
        self.key = key
        self.problem = problem
        self.remedy = remedy
        where = f"{location}/{key}" if key is not None else location
        text = f"{where}: {problem}"
        if remedy:
            text += f"; {remedy}"
        super().__init__(text)


class BlobNotFound(BlobStoreError):
    """The key does not exist in the store."""


class BlobStoreUnavailable(BlobStoreError):
    """The store could not be reached (connection refused, timeout); retrying later may succeed."""


class OffloadFormatError(OffloadError):
    """Bytes that are not a valid PIP-76 block or index; ``offset`` is relative to the decoded buffer."""

    def __init__(self, offset: int, problem: str) -> None:
        self.offset = offset
        self.problem = problem
        super().__init__(f"at byte {offset}: {problem}")


class OffloadCorruptionError(OffloadError):
    """A stored segment object is damaged: names uuid, part (None for the index) and object offset."""

    def __init__(self, uuid: str, part: int | None, offset: int, problem: str, key: str) -> None:
        self.uuid = uuid
        self.part = part
        self.offset = offset
        self.problem = problem
        self.key = key
        what = "index" if part is None else f"part {part}"
        super().__init__(
            f"offloaded segment {uuid} is corrupt: {what}, object {key!r} offset {offset}: {problem}; "
            "the data was not served. Re-offload the segment from the ledger if it still exists, "
            "or restore the object from a backup"
        )


class OffloadRangeError(OffloadError, LookupError):
    """The segment does not hold the requested ledger or entries."""


class StagedBlockLost(OSError):
    """A block staged in the read-back worker process is gone: the worker holding it was replaced
    (it died between calls). Nothing was sent; the segment writer stages the block again from the
    local files."""
