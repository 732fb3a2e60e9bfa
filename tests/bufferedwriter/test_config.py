"""Batched-write settings: Pulsar's defaults, and every bad value refused with a useful message."""

from __future__ import annotations

from typing import Any

import pytest

from txnkeeper.bufferedwriter.config import (
    MIN_MAX_SIZE_BYTES,
    BatchedWriteConfig,
    InvalidBatchedWriteConfigError,
)


def test_defaults_are_pulsars() -> None:
    c = BatchedWriteConfig()
    assert (c.enabled, c.max_records, c.max_size_bytes, c.max_delay_millis) == (False, 512, 4194304, 1.0)
    assert not c.batching


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_records": 0}, r"maxRecords must be an integer >= 1, got 0"),
        ({"max_records": -5}, r"maxRecords"),
        ({"max_records": "512"}, r"maxRecords .* got '512'"),
        ({"max_records": True}, r"maxRecords"),
        ({"max_delay_millis": -1}, r"maxDelayMillis must be a finite number >= 0, got -1"),
        ({"max_delay_millis": float("nan")}, r"maxDelayMillis"),
        ({"max_delay_millis": float("inf")}, r"maxDelayMillis"),
        ({"max_size_bytes": MIN_MAX_SIZE_BYTES - 1}, r"maxSizeBytes must be an integer from 6 .*header"),
        ({"max_size_bytes": 16 * 1024 * 1024 + 1}, r"maxSizeBytes .* to 16777216 \(16 MiB\)"),
        ({"max_size_bytes": 1.5e6}, r"maxSizeBytes"),
        ({"enabled": "yes"}, r"enabled must be true or false"),
        ({"flush_mode": "fast"}, r"flushMode must be one of \['adaptive', 'delay'\], got 'fast'"),
        ({"flush_mode": None}, r"flushMode"),
    ],
)
def test_invalid_values_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchedWriteConfigError, match=message):
        BatchedWriteConfig(**kwargs)


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
