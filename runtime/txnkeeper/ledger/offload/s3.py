"""The ``s3`` blob-store driver: any S3-compatible endpoint (AWS, MinIO, Ceph RGW) through boto3.

boto3 is blocking, so every call runs in a small thread pool owned by the store. Large objects use a
multipart upload whose parts are at least S3's 5 MiB minimum (blocks are buffered up to that size);
an object that never reaches it is sent with one PutObject. Objects carry Pulsar's format-version user
metadata (``s3managedledgeroffloaderformatversion: 1``), which Pulsar's readers check.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, EndpointConnectionError

from .blobstore import BlobStore, BlobUpload, check_key, check_range
from .config import S3_MIN_PART_SIZE, OffloadConfig
from .errors import BlobNotFound, BlobStoreError, BlobStoreUnavailable, OffloadConfigError

T = TypeVar("T")

# DataBlockUtils.METADATA_FORMAT_VERSION_KEY, lower-cased as jclouds stores it, and CURRENT_VERSION.
FORMAT_VERSION_METADATA = {"s3managedledgeroffloaderformatversion": "1"}
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_UNAVAILABLE = {"ServiceUnavailable", "SlowDown", "503", "500", "InternalError", "RequestTimeout"}


class S3BlobStore(BlobStore):
    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        path_style: bool = True,
        min_part_size: int = S3_MIN_PART_SIZE,
        read_buffer_size: int = 1024 * 1024,
        max_workers: int = 4,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        if not bucket:
            raise OffloadConfigError("the s3 driver needs a bucket (managedLedgerOffloadBucket)")
        if min_part_size < S3_MIN_PART_SIZE:
            raise OffloadConfigError(f"min_part_size must be at least {S3_MIN_PART_SIZE} (S3's part minimum)")
        self.bucket = bucket
        self.location = f"s3://{bucket}"
        self.min_part_size = min_part_size
        self.read_buffer_size = read_buffer_size
        session = boto3.session.Session(
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            region_name=region or None,
        )
        self._client: Any = session.client(
            "s3",
            endpoint_url=endpoint or None,
            config=Config(
                s3={"addressing_style": "path" if path_style else "auto"},
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                signature_version="s3v4",
            ),
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="offload-s3"
        )

    @classmethod
    def from_config(
        cls, config: OffloadConfig, *, access_key: str | None = None, secret_key: str | None = None
    ) -> S3BlobStore:
        """Credentials come from the arguments or boto3's usual chain (environment, profile, role)."""
        return cls(
            config.managedLedgerOffloadBucket,
            endpoint=config.managedLedgerOffloadServiceEndpoint,
            region=config.managedLedgerOffloadRegion,
            access_key=access_key,
            secret_key=secret_key,
            read_buffer_size=config.managedLedgerOffloadReadBufferSizeInBytes,
        )

    def error(self, key: str | None, exc: Exception, doing: str) -> BlobStoreError:
        if isinstance(exc, BlobStoreError):
            return exc
        if isinstance(exc, EndpointConnectionError | ConnectionError):
            return BlobStoreUnavailable(
                self.location, key, f"{doing}: {exc}", "check the endpoint and network"
            )
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            message = exc.response.get("Error", {}).get("Message", "") or code
            if code in _NOT_FOUND and key is not None:
                return BlobNotFound(self.location, key, "no such object")
            if code == "NoSuchBucket":
                return BlobStoreError(self.location, key, "the bucket does not exist", "create it first")
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return BlobStoreError(self.location, key, f"{doing}: {message}", "check the credentials")
            if code in _UNAVAILABLE:
                return BlobStoreUnavailable(self.location, key, f"{doing}: {message}", "retry later")
            return BlobStoreError(self.location, key, f"{doing}: {code}: {message}")
        if isinstance(exc, BotoCoreError):
            return BlobStoreUnavailable(self.location, key, f"{doing}: {exc}")
        return BlobStoreError(self.location, key, f"{doing}: {exc!r}")

    async def call(self, key: str | None, doing: str, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn)
        except (ClientError, BotoCoreError) as exc:
            raise self.error(key, exc, doing) from exc

    async def put(self, key: str, data: bytes) -> None:
        check_key(self.location, key)
        await self.call(
            key,
            "put",
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, Metadata=FORMAT_VERSION_METADATA
            ),
        )

    def open_upload(self, key: str) -> BlobUpload:
        check_key(self.location, key)
        return _S3Upload(self, key)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        check_key(self.location, key)
        check_range(self.location, key, offset, length)
        if length == 0:
            await self.length(key)
            return b""
        rng = f"bytes={offset}-" if length is None else f"bytes={offset}-{offset + length - 1}"

        def fetch() -> bytes:
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=key, Range=rng)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # the range starts at or past the end: the object is shorter
                raise
            body = resp["Body"]
            chunks = []
            try:
                while chunk := body.read(self.read_buffer_size):
                    chunks.append(chunk)
            finally:
                body.close()
            return b"".join(chunks)

        return await self.call(key, "get", fetch)

    async def length(self, key: str) -> int:
        check_key(self.location, key)
        resp = await self.call(key, "head", lambda: self._client.head_object(Bucket=self.bucket, Key=key))
        return int(resp["ContentLength"])

    async def list(self, prefix: str = "") -> list[str]:
        def collect() -> list[str]:
            keys: list[str] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            ):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
            return sorted(keys)

        return await self.call(None, f"list prefix {prefix!r}", collect)

    async def delete(self, key: str) -> None:
        check_key(self.location, key)
        await self.call(key, "delete", lambda: self._client.delete_object(Bucket=self.bucket, Key=key))

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()


class _S3Upload(BlobUpload):
    """Buffers to the part minimum; starts the multipart upload only once a full part exists."""

    def __init__(self, store: S3BlobStore, key: str) -> None:
        self.store = store
        self.key = key
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.size = 0
        self.done = False

    def _check(self) -> None:
        if self.done:
            raise BlobStoreError(self.store.location, self.key, "upload already completed or aborted")

    async def write(self, data: bytes | bytearray) -> None:
        self._check()
        self.buffer += data
        self.size += len(data)
        if len(self.buffer) >= self.store.min_part_size:
            await self._send_part()

    async def _send_part(self) -> None:
        s = self.store
        try:
            if self.upload_id is None:
                resp = await s.call(
                    self.key,
                    "start multipart upload",
                    lambda: s._client.create_multipart_upload(
                        Bucket=s.bucket, Key=self.key, Metadata=FORMAT_VERSION_METADATA
                    ),
                )
                self.upload_id = str(resp["UploadId"])
            body = bytes(self.buffer)
            number = len(self.parts) + 1
            upload_id = self.upload_id
            resp = await s.call(
                self.key,
                f"upload part {number}",
                lambda: s._client.upload_part(
                    Bucket=s.bucket, Key=self.key, UploadId=upload_id, PartNumber=number, Body=body
                ),
            )
            self.parts.append({"ETag": resp["ETag"], "PartNumber": number})
            self.buffer = bytearray()
        except BaseException:
            await self.abort()
            raise

    async def complete(self) -> int:
        self._check()
        s = self.store
        try:
            if self.upload_id is None:
                await s.put(self.key, bytes(self.buffer))
            else:
                if self.buffer:
                    await self._send_part()
                upload_id, parts = self.upload_id, list(self.parts)
                await s.call(
                    self.key,
                    "complete multipart upload",
                    lambda: s._client.complete_multipart_upload(
                        Bucket=s.bucket, Key=self.key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                    ),
                )
        except BaseException:
            await self.abort()
            raise
        self.done = True
        return self.size

    async def abort(self) -> None:
        self.done = True
        self.buffer = bytearray()
        if self.upload_id is not None:
            s, upload_id, self.upload_id = self.store, self.upload_id, None
            # If this fails, the bucket's lifecycle rule for incomplete uploads cleans up instead.
            with contextlib.suppress(BlobStoreError):
                await s.call(
                    self.key,
                    "abort multipart upload",
                    lambda: s._client.abort_multipart_upload(
                        Bucket=s.bucket, Key=self.key, UploadId=upload_id
                    ),
                )
