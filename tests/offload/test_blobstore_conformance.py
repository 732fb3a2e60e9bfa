"""One conformance suite for every blob-store driver: filesystem always, s3 against a real MinIO."""

from __future__ import annotations

import os

import pytest

from txnkeeper.ledger.offload import BlobNotFound, BlobStore, BlobStoreError


async def test_put_get_whole_and_ranges(store: BlobStore) -> None:
    data = bytes(range(256)) * 4
    await store.put("seg/a", data)
    assert await store.get("seg/a") == data
    assert await store.get("seg/a", 10, 5) == data[10:15]
    assert await store.get("seg/a", 1000) == data[1000:]
    assert await store.length("seg/a") == len(data)


async def test_range_past_the_end_returns_only_what_exists(store: BlobStore) -> None:
    await store.put("short", b"0123456789")
    assert await store.get("short", 8, 10) == b"89"
    assert await store.get("short", 10, 5) == b""
    assert await store.get("short", 50, 5) == b""


async def test_put_replaces(store: BlobStore) -> None:
    await store.put("k", b"old")
    await store.put("k", b"new!")
    assert await store.get("k") == b"new!"


async def test_missing_key_is_blob_not_found_naming_location_and_key(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound) as err:
        await store.get("nope")
    assert err.value.key == "nope"
    assert f"{store.location}/nope" in str(err.value)
    with pytest.raises(BlobNotFound):
        await store.length("nope")


async def test_list_by_prefix_sorted(store: BlobStore) -> None:
    for key in ("b-index", "a", "b", "c/d", "a-index"):
        await store.put(key, key.encode())
    assert await store.list() == ["a", "a-index", "b", "b-index", "c/d"]
    assert await store.list("b") == ["b", "b-index"]
    assert await store.list("c/") == ["c/d"]
    assert await store.list("zzz") == []


async def test_delete_is_idempotent(store: BlobStore) -> None:
    await store.put("gone", b"x")
    await store.delete("gone")
    await store.delete("gone")
    assert await store.list("gone") == []
    with pytest.raises(BlobNotFound):
        await store.get("gone")


async def test_streaming_upload_is_invisible_until_complete(store: BlobStore) -> None:
    # 6 MiB in 1 MiB writes: on S3 this crosses the 5 MiB part minimum, so a real multipart upload runs.
    chunk = os.urandom(1024 * 1024)
    upload = store.open_upload("big")
    for _ in range(6):
        await upload.write(chunk)
    assert await store.list("big") == []
    assert await upload.complete() == 6 * len(chunk)
    assert await store.length("big") == 6 * len(chunk)
    assert await store.get("big", 5 * len(chunk) - 3, 6) == chunk[-3:] + chunk[:3]
    with pytest.raises(BlobStoreError, match="already completed"):
        await upload.write(b"more")


async def test_small_streaming_upload(store: BlobStore) -> None:
    upload = store.open_upload("small")
    await upload.write(b"abc")
    await upload.write(b"def")
    assert await upload.complete() == 6
    assert await store.get("small") == b"abcdef"


async def test_aborted_upload_leaves_previous_object(store: BlobStore) -> None:
    await store.put("kept", b"before")
    upload = store.open_upload("kept")
    await upload.write(os.urandom(6 * 1024 * 1024))
    await upload.abort()
    await upload.abort()
    assert await store.get("kept") == b"before"
    assert await store.list() == ["kept"]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "sp ace", "x/.txnkeeper-upload-1"])
async def test_invalid_keys_are_refused_by_every_driver(store: BlobStore, key: str) -> None:
    with pytest.raises(BlobStoreError, match="invalid key"):
        await store.put(key, b"x")


async def test_invalid_range_is_refused(store: BlobStore) -> None:
    await store.put("r", b"abc")
    with pytest.raises(BlobStoreError, match="invalid byte range"):
        await store.get("r", -1, 2)
