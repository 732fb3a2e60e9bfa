"""A store shard moved between two pods that share an S3 tier (a real MinIO): ledgers that live only in
the tier move as metadata, the target proves every segment object they need is in its own bucket
before it installs anything, and reads them from there; a bucket that lacks them fails the move and
the source keeps serving (docs/contracts.md §12, "Offloaded ledgers"). The filesystem-tier versions of
these tests are in tests/runtime/test_shard_precopy.py; S3 answers a missing object differently (a
404 from HEAD), which is what this proves the existence check handles.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import TOKEN, ServePod, http
from shard_pods import (
    FILLED,
    MOVED,
    PAYLOAD,
    fill,
    has_first_ledger,
    offloaded_and_deleted,
    read_all,
    topic_in_moved_shard,
    two_stores,
)

from txnkeeper.admin.move import MoveError, move_shard
from txnkeeper.client import Client

from .conftest import ACCESS_KEY, SECRET_KEY, MinioServer, make_bucket

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ServePod]]:
    """Pods that reach MinIO with its credentials (boto3's environment chain, as in a pod)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    started: list[ServePod] = []

    def make(name: str, role: str, **kwargs: Any) -> ServePod:
        pod = ServePod(tmp_path, name, role, **kwargs)
        started.append(pod)
        return pod.start()

    yield make
    for pod in started:
        pod.stop()


def s3_tier(minio: MinioServer, bucket: str) -> dict[str, Any]:
    return {
        "managedLedgerOffloadDriver": "aws-s3",
        "managedLedgerOffloadBucket": bucket,
        "managedLedgerOffloadServiceEndpoint": minio.endpoint,
        "managedLedgerOffloadRegion": "us-east-1",
        "managedLedgerOffloadThresholdInBytes": 0,
        "managedLedgerOffloadDeletionLagMs": 0,
    }


def empty_bucket(minio: MinioServer, bucket: str) -> int:
    """Delete every object of ``bucket``; how many there were."""
    s3 = boto3.client(
        "s3",
        endpoint_url=minio.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    try:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        for key in keys:
            s3.delete_object(Bucket=bucket, Key=key)
        return len(keys)
    finally:
        s3.close()


async def test_an_offloaded_shard_moves_as_metadata_and_is_read_from_the_shared_bucket(
    pods: Callable[..., ServePod], minio: MinioServer
) -> None:
    tc, source, target = two_stores(pods, s3_tier(minio, make_bucket(minio)))
    topic = topic_in_moved_shard("s3-tiered")
    await fill(tc, source, topic)
    await offloaded_and_deleted(source, topic, "s1", target)
    report = await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move="s1")
    assert report.bytes < PAYLOAD * 4, f"metadata and the open ledger only: {report.to_json()}"
    assert not has_first_ledger(target, topic)
    assert await read_all(tc, target, topic) == FILLED, "read from the bucket on the new owner"


async def test_objects_missing_from_the_bucket_fail_the_move_and_the_source_keeps_the_shard(
    pods: Callable[..., ServePod], minio: MinioServer
) -> None:
    bucket = make_bucket(minio)
    tc, source, target = two_stores(pods, s3_tier(minio, bucket))
    topic = topic_in_moved_shard("s3-lost")
    await fill(tc, source, topic)
    await offloaded_and_deleted(source, topic, "s2", target)
    assert empty_bucket(minio, bucket) >= 2, "a segment's data and index objects"
    with pytest.raises(MoveError) as refused:
        await move_shard(MOVED, source.admin_url(), target.admin_url(), token=TOKEN, move="s2")
    assert refused.value.step == "receive" and "lacks" in str(refused.value), refused.value
    assert bucket in str(refused.value), "the message names the tier that lacks them"
    assert not has_first_ledger(target, topic)
    _, listing = http("GET", f"{source.admin_url()}/admin/v1/shards")
    row = next(r for r in listing["shards"] if r["shard"] == MOVED)
    assert row["owner"] == 0 and row["state"] == "serving", row
    async with Client(coordinators=[tc.listen], stores=[source.listen]) as client:
        await (await client.create_producer(topic)).send(b"after")  # the source serves it again
