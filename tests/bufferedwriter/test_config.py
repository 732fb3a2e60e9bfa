"""Batched-write settings: Pulsar's defaults, and every bad value refused with a useful message."""

from __future__ import annotations

from typing import Any

import pytest

from txnkeeper.bufferedwriter.codec import BATCH_HEADER_SIZE, MIN_FRAMED_RECORD_SIZE
from txnkeeper.bufferedwriter.config import BatchedWriteConfig, InvalidBatchedWriteConfigError
from txnkeeper.contract import batching
from txnkeeper.contract.batching import MIN_MAX_SIZE_BYTES


def test_defaults_are_pulsars() -> None:
    c = BatchedWriteConfig()
    assert (c.enabled, c.max_records, c.max_size_bytes, c.max_delay_millis) == (False, 512, 4194304, 1.0)
    assert not c.batching


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_records": 0}, r"maxRecords must be an integer from 1 .* to 65536, got 0"),
        ({"max_records": 65537}, r"maxRecords .* to 65536, got 65537"),
        ({"max_records": 10**5000}, r"maxRecords .* got an integer of 16610 bits"),
        ({"max_records": -5}, r"maxRecords"),
        ({"max_records": "512"}, r"maxRecords .* got '512'"),
        ({"max_records": True}, r"maxRecords"),
        ({"max_delay_millis": -1}, r"maxDelayMillis must be a number of milliseconds from 0 to 60000"),
        ({"max_delay_millis": 10**12}, r"maxDelayMillis .* to 60000 .* got 1000000000000"),
        ({"max_delay_millis": 60_000.5}, r"maxDelayMillis"),
        ({"max_delay_millis": True}, r"maxDelayMillis"),
        ({"max_delay_millis": float("nan")}, r"maxDelayMillis"),
        ({"max_delay_millis": float("inf")}, r"maxDelayMillis"),
        ({"max_size_bytes": MIN_MAX_SIZE_BYTES - 1}, r"maxSizeBytes must be an integer from 6 .*header"),
        ({"max_size_bytes": 16 * 1024 * 1024 + 1}, r"maxSizeBytes .* to 16777216 \(16 MiB\)"),
        ({"max_size_bytes": 1.5e6}, r"maxSizeBytes"),
        ({"enabled": "yes"}, r"enabled must be true or false"),
        ({"max_delay_millis": [1]}, r"maxDelayMillis .* got a JSON array$"),
        ({"max_size_bytes": "x" * 1000}, r"maxSizeBytes .* got 'x{30,40}\.\.\.$"),
        ({"flush_mode": "fast"}, r"flushMode must be one of \['adaptive', 'delay'\], got 'fast'"),
        ({"flush_mode": None}, r"flushMode"),
    ],
)
def test_invalid_values_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchedWriteConfigError, match=message):
        BatchedWriteConfig(**kwargs)


def test_limits_are_the_contracts_and_inclusive() -> None:
    """The runtime enforces exactly the shared contract's bounds (the CRDs are generated from them)."""
    assert MIN_MAX_SIZE_BYTES == BATCH_HEADER_SIZE + MIN_FRAMED_RECORD_SIZE
    # A batch reaches about twice maxSize: it must stay inside the ledger's 64 MiB entry limit.
    assert 2 * batching.MAX_MAX_SIZE_BYTES < 64 * 1024 * 1024
    edges = BatchedWriteConfig(
        max_records=batching.MAX_MAX_RECORDS,
        max_size_bytes=batching.MAX_MAX_SIZE_BYTES,
        max_delay_millis=batching.MAX_MAX_DELAY_MILLIS,
    )
    assert edges.max_delay_millis == 60_000
    low = BatchedWriteConfig(max_records=1, max_size_bytes=MIN_MAX_SIZE_BYTES, max_delay_millis=0)
    assert low.max_records == batching.MIN_MAX_RECORDS
    c = BatchedWriteConfig()
    assert (c.enabled, c.max_records, c.max_size_bytes, c.max_delay_millis) == (
        batching.DEFAULT_ENABLED,
        batching.DEFAULT_MAX_RECORDS,
        batching.DEFAULT_MAX_SIZE_BYTES,
        batching.DEFAULT_MAX_DELAY_MILLIS,
    )


def test_max_records_one_means_plain_entries() -> None:
    assert not BatchedWriteConfig(enabled=True, max_records=1).batching
    assert BatchedWriteConfig(enabled=True, max_records=2).batching


def test_stat_round_trip_uses_pulsar_field_names() -> None:
    c = BatchedWriteConfig(enabled=True, max_records=100, max_size_bytes=1 << 20, max_delay_millis=5)
    stat = c.to_stat()
    assert stat == {
        "batchEnabled": True,
        "batchedWriteMaxRecords": 100,
        "batchedWriteMaxSize": 1 << 20,
        "batchedWriteMaxDelayInMillis": 5,
        "batchedWriteFlushMode": "adaptive",
    }
    assert BatchedWriteConfig.from_stat(stat) == c
    assert c.with_stat({"batchedWriteFlushMode": "delay"}).flush_mode == "delay"
    assert c.with_stat({"batchEnabled": False}) == BatchedWriteConfig(
        enabled=False, max_records=100, max_size_bytes=1 << 20, max_delay_millis=5
    )


def test_unknown_stat_key_is_refused() -> None:
    with pytest.raises(
        InvalidBatchedWriteConfigError, match=r"unknown batched-write setting\(s\) \['maxRecords'\]"
    ):
        BatchedWriteConfig().with_stat({"maxRecords": 3})
