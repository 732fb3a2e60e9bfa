"""Driver-specific behaviour: the filesystem driver's atomic files, the s3 driver's errors and metadata."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from txnkeeper.ledger.offload import (
    BlobStoreError,
    BlobStoreUnavailable,
    FileSystemBlobStore,
    OffloadConfig,
    OffloadConfigError,
)
from txnkeeper.ledger.offload.filesystem import WRITE_SLICE_BYTES

from .conftest import ACCESS_KEY, SECRET_KEY, MinioServer, make_bucket, s3_client


async def test_filesystem_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path)
    await store.put("a/b", b"x")
    upload = store.open_upload("c")
    await upload.write(b"partial")
    # The upload's temporary file is hidden from listings and from the key.
    assert await store.list() == ["a/b"]
    await upload.abort()
    assert sorted(p.name for p in await asyncio.to_thread(lambda: list(tmp_path.rglob("*")))) == ["a", "b"]


async def test_filesystem_upload_larger_than_a_write_slice_reads_back_whole(tmp_path: Path) -> None:
    # Uploads are written and synced in WRITE_SLICE_BYTES slices (so the tier's writeback never piles
    # up in front of the ledgers' fsyncs); parts straddling slice edges must land in order.
    store = FileSystemBlobStore(tmp_path)
    parts = [os.urandom(WRITE_SLICE_BYTES + 17), os.urandom(3), os.urandom(2 * WRITE_SLICE_BYTES - 5)]
    upload = store.open_upload("seg")
    for part in parts:
        await upload.write(part)
    assert await upload.complete() == sum(map(len, parts))
    assert await store.get("seg") == b"".join(parts)
    assert (
        await store.get("seg", WRITE_SLICE_BYTES, 40)
        == b"".join(parts)[WRITE_SLICE_BYTES : WRITE_SLICE_BYTES + 40]
    )


async def test_filesystem_missing_directory_is_unavailable(tmp_path: Path) -> None:
    store = FileSystemBlobStore(tmp_path / "not-mounted")
    with pytest.raises(BlobStoreUnavailable, match="does not exist"):
        await store.put("k", b"x")


def test_config_uses_pulsar_keys_and_defaults() -> None:
    cfg = OffloadConfig(fileSystemURI="/x")
    assert cfg.managedLedgerOffloadMaxBlockSizeInBytes == 64 * 1024 * 1024
    assert cfg.managedLedgerOffloadReadBufferSizeInBytes == 1024 * 1024
    cfg = OffloadConfig.from_properties(
        {"managedLedgerOffloadDriver": "aws-s3", "managedLedgerOffloadBucket": "b"}
        | {"managedLedgerOffloadMaxBlockSizeInBytes": "1048576"}
    )
    assert cfg.is_s3 and cfg.managedLedgerOffloadMaxBlockSizeInBytes == 1048576
    with pytest.raises(OffloadConfigError, match="unknown offload setting 'maxBlock'"):
        OffloadConfig.from_properties({"maxBlock": "1"})
    with pytest.raises(OffloadConfigError, match="managedLedgerOffloadBucket is required"):
        OffloadConfig(managedLedgerOffloadDriver="S3")
    with pytest.raises(OffloadConfigError, match="is not an integer"):
        OffloadConfig.from_properties(
            {"fileSystemURI": "/x", "managedLedgerOffloadMaxBlockSizeInBytes": "big"}
        )
    with pytest.raises(OffloadConfigError, match="too small"):
        OffloadConfig(fileSystemURI="/x", managedLedgerOffloadMaxBlockSizeInBytes=100)


async def test_s3_unreachable_endpoint_is_unavailable() -> None:
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    store = S3BlobStore(
        "b",
        endpoint=f"http://127.0.0.1:{port}",
        region="us-east-1",
        access_key="a",
        secret_key="b",
        connect_timeout=2,
    )
    try:
        with pytest.raises(BlobStoreUnavailable) as err:
            await store.get("k")
        assert err.value.location == "s3://b"
        assert err.value.key == "k"
    finally:
        await store.close()


async def test_s3_missing_bucket_and_bad_credentials_are_clear(minio: MinioServer) -> None:
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    missing = S3BlobStore(
        "no-such-bucket",
        endpoint=minio.endpoint,
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )
    wrong = S3BlobStore(
        make_bucket(minio),
        endpoint=minio.endpoint,
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key="wrong-secret",
    )
    try:
        with pytest.raises(BlobStoreError, match="the bucket does not exist; create it first"):
            await missing.put("k", b"x")
        with pytest.raises(BlobStoreError, match="check the credentials"):
            await wrong.put("k", b"x")
    finally:
        await missing.close()
        await wrong.close()


async def test_s3_objects_carry_pulsars_format_version(minio: MinioServer) -> None:
    from txnkeeper.ledger.offload.s3 import S3BlobStore

    bucket = make_bucket(minio)
    store = S3BlobStore(
        bucket, endpoint=minio.endpoint, region="us-east-1", access_key=ACCESS_KEY, secret_key=SECRET_KEY
    )
    try:
        await store.put("small", b"x")
        upload = store.open_upload("big")
        await upload.write(bytes(6 * 1024 * 1024))
        await upload.complete()
    finally:
        await store.close()
    client = s3_client(minio)
    for key in ("small", "big"):
        meta = client.head_object(Bucket=bucket, Key=key)["Metadata"]
        assert meta == {"s3managedledgeroffloaderformatversion": "1"}
    client.close()
