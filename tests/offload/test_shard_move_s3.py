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
from functools import partial
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import ServePod, started_pods
from shard_pods import moves_as_metadata, refused_for_missing_objects, topic_in_moved_shard, two_stores

from .conftest import ACCESS_KEY, SECRET_KEY, MinioServer, make_bucket, s3_client

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ServePod]]:
    """Pods that reach MinIO with its credentials (boto3's environment chain, as in a pod)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    yield from started_pods(tmp_path)


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
    s3 = s3_client(minio)
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
    await moves_as_metadata(tc, source, target, topic_in_moved_shard("s3-tiered"), "s1")


async def test_objects_missing_from_the_bucket_fail_the_move_and_the_source_keeps_the_shard(
    pods: Callable[..., ServePod], minio: MinioServer
) -> None:
    bucket = make_bucket(minio)
    tc, source, target = two_stores(pods, s3_tier(minio, bucket))
    lose = partial(empty_bucket, minio, bucket)
    refused = await refused_for_missing_objects(
        # at least a segment's data and index objects
        tc,
        source,
        target,
        topic_in_moved_shard("s3-lost"),
        "s2",
        lose=lose,
        at_least=2,
    )
    assert bucket in str(refused), "the message names the tier that lacks them"
