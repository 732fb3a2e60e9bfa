"""The blob-store seam of offload: what a segment writer and reader need from S3 or a directory.

Keeping the interface this small (streaming upload, ranged get, length, list by prefix, delete) lets the
same PIP-76 objects live in any S3-compatible bucket or in a plain directory (an RWX volume), and lets
one conformance suite hold both drivers to the same behaviour.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import Callable
from typing import TypeVar

from .errors import BlobStoreError

T = TypeVar("T")

_KEY_CHARS = re.compile(r"^[A-Za-z0-9._\-/]+$")
MAX_KEY_LENGTH = 1024


def check_key(location: str, key: str) -> str:
    """Refuse keys a driver could not map safely (both drivers accept exactly the same keys)."""
    if not key or len(key.encode()) > MAX_KEY_LENGTH or not _KEY_CHARS.match(key):
        raise BlobStoreError(
            location, key, "invalid key", f"use 1-{MAX_KEY_LENGTH} characters from A-Z a-z 0-9 . _ - /"
        )
    parts = key.split("/")
    if key.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[-1].startswith(".txnkeeper-"):
        raise BlobStoreError(
            location,
            key,
            "invalid key",
            "keys are relative paths without empty, '.', '..' or '.txnkeeper-' parts",
        )
    return key


class BlobUpload(abc.ABC):
    """One object being written in pieces; invisible to readers until ``complete`` returns."""

    #: whether ``local_file`` offers a file another process may write the object's bytes into
    local_files = False

    @abc.abstractmethod
    async def write(self, data: bytes | bytearray) -> None:
        """Append ``data``; drivers may buffer it to their part size before sending."""

    @abc.abstractmethod
    async def complete(self) -> int:
        """Make the object durable and visible under its key; returns its length."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Discard what was written; the key keeps whatever it held before. Safe to call twice."""

    def local_file(self) -> str | None:
        """A local file another process may write this upload's next bytes into (at the length
        written so far) and make durable (then ``appended``); None when bytes must go through
        ``write`` (S3). Lets the streaming offload's worker process upload the blocks it built,
        without their bytes crossing back to the ledger process."""
        return None

    def appended(self, length: int) -> None:
        """``length`` more bytes were written and made durable in ``local_file()`` by another process."""
        raise NotImplementedError(f"{type(self).__name__} has no local file")


class BlobStore(abc.ABC):
    """An async object store; errors (BlobNotFound, BlobStoreUnavailable, BlobStoreError) name the key."""

    #: where objects live, for messages: ``s3://bucket`` or ``file:///dir``
    location: str

    @abc.abstractmethod
    async def put(self, key: str, data: bytes) -> None:
        """Store a whole object atomically (replacing any previous one)."""

    @abc.abstractmethod
    def open_upload(self, key: str) -> BlobUpload:
        """Start a streaming upload (multipart on S3) for an object too large to hold in memory."""

    @abc.abstractmethod
    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` (to the end when length is None).

        Returns fewer bytes only when the object ends first, so a caller can tell a truncated object
        from a short one it asked for.
        """

    async def read_checked(self, key: str, offset: int, length: int, check: Callable[[memoryview], T]) -> T:
        """Bytes ``[offset, offset+length)`` (fewer where the object ends) handed to ``check`` on a
        worker thread; returns what ``check`` returns, raises what it raises.

        For readers that verify and decode a block before keeping anything of it: ``check`` must
        not keep the view (copy what it keeps), so a driver may read into a buffer it reuses. This
        default GETs, then checks on a thread; the filesystem driver reads and checks in one thread
        call into a pooled buffer (a drain of the tier spent a fifth of its time allocating and
        page-faulting a fresh block-sized object per block).
        """
        raw = await self.get(key, offset, length)
        return await asyncio.to_thread(check, memoryview(raw))

    @abc.abstractmethod
    async def length(self, key: str) -> int:
        """The object's size in bytes (a HEAD request on S3)."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix``, sorted."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error (as on S3)."""

    async def close(self) -> None:  # noqa: B027 - drivers without resources need not override
        """Release connections and threads."""


def check_range(location: str, key: str, offset: int, length: int | None) -> None:
    if offset < 0 or (length is not None and length < 0):
        raise BlobStoreError(location, key, f"invalid byte range offset={offset} length={length}")
