"""``BlobStore.read_checked`` on every driver: the bytes ``get`` would return, handed to a check whose
result (or error) is the caller's; the filesystem driver's reused buffers never show one read's bytes
to another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txnkeeper.ledger.offload import BlobNotFound, BlobStore, BlobStoreError, FileSystemBlobStore
from txnkeeper.ledger.offload.filesystem import READ_BUFFERS


class Refused(Exception):
    pass


async def test_read_checked_hands_the_range_to_the_check(store: BlobStore) -> None:
    data = os.urandom(10_000)
    await store.put("seg/obj", data)
    assert await store.read_checked("seg/obj", 100, 1000, bytes) == data[100:1100]
    assert await store.read_checked("seg/obj", 0, len(data), bytes) == data
    # Fewer bytes where the object ends, as get returns them: a caller tells truncation by length.
    assert await store.read_checked("seg/obj", 9_900, 500, bytes) == data[9_900:]
    assert await store.read_checked("seg/obj", 9_900, 500, len) == 100


async def test_read_checked_raises_the_checks_error_and_the_stores(store: BlobStore) -> None:
    await store.put("seg/obj", b"x" * 100)

    def refuse(view: memoryview) -> None:
        raise Refused(f"refused {len(view)} bytes")

    with pytest.raises(Refused, match="refused 10 bytes"):
        await store.read_checked("seg/obj", 0, 10, refuse)
    with pytest.raises(BlobNotFound):
        await store.read_checked("seg/missing", 0, 10, bytes)
    with pytest.raises(BlobStoreError, match="invalid byte range"):
        await store.read_checked("seg/obj", -1, 10, bytes)


async def test_pooled_buffers_never_show_another_reads_bytes(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    big, small = os.urandom(4096), os.urandom(64)
    await store.put("big", big)
    await store.put("small", small)
    for _ in range(READ_BUFFERS + 2):  # past the pool's size, buffers are reused
        assert await store.read_checked("big", 0, 4096, bytes) == big
        # A short object read into a buffer that held a larger one: only its own bytes are seen.
        assert await store.read_checked("small", 0, 4096, bytes) == small
        assert await store.read_checked("big", 4000, 4096, bytes) == big[4000:]
