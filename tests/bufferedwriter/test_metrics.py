"""The buffered writer's metrics: plain counters on the flush path, Pulsar's families at scrape time.

The values are kept as ints and turned into samples by a collector (prometheus-client's histograms
cost 5 us per batched entry, the whole batching overhead at one transaction in flight). The exposition
must stay what prometheus-client's Histogram and Counter produced: cumulative ``le`` buckets spelled as
before, ``_count`` equal to the +Inf bucket, ``_sum``, ``_total`` counters, one series per label set.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from txnkeeper.bufferedwriter import BufferedWriterMetrics
from txnkeeper.bufferedwriter.metrics import FlushTrigger

P = "pulsar_txn_tc_bufferedwriter"


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(f"{P}_{name}", labels)


def test_histograms_are_cumulative_with_prometheus_spelled_bounds() -> None:
    registry = CollectorRegistry()
    m = BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "0"}, registry)
    # records 1, 10 (on a bound: counted in le=10), 11, 5000 (+Inf only); sizes 100 and 2 MB
    for records, size in ((1, 100), (10, 100), (11, 100), (5000, 2_000_000)):
        m.on_flush(FlushTrigger.IDLE, records, size, 0.0001)
    labels = {"coordinator_id": "0"}
    buckets = {
        le: sample(registry, "batch_records_bucket", {**labels, "le": le})
        for le in ("10.0", "50.0", "1000.0", "+Inf")
    }
    assert buckets == {"10.0": 2, "50.0": 3, "1000.0": 3, "+Inf": 4}
    assert sample(registry, "batch_records_count", labels) == 4
    assert sample(registry, "batch_records_sum", labels) == 1 + 10 + 11 + 5000
    assert sample(registry, "batch_size_bytes_bucket", {**labels, "le": "1.232896e+06"}) == 3
    assert sample(registry, "batch_oldest_record_delay_seconds_bucket", {**labels, "le": "0.0005"}) == 4
    assert sample(registry, "flush_trigger_idle_total", labels) == 4
    assert sample(registry, "flush_trigger_max_records_total", labels) == 0
    text = generate_latest(registry).decode()
    assert "forced" not in text, "explicit flushes are not a trigger Pulsar exports"
    assert f"# TYPE {P}_batch_records histogram" in text


def test_counters_failures_and_two_writers_told_apart_by_labels() -> None:
    registry = CollectorRegistry()
    a = BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "1"}, registry)
    b = BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "2"}, registry)
    a.on_written(5, batched=True)
    a.on_written(1, batched=False)
    b.on_failed(3)
    one, two = {"coordinator_id": "1"}, {"coordinator_id": "2"}
    assert sample(registry, "records_written_total", one) == 6
    assert sample(registry, "entries_written_total", {**one, "format": "batched"}) == 1
    assert sample(registry, "entries_written_total", {**one, "format": "unbatched"}) == 1
    assert sample(registry, "records_failed_total", two) == 3
    assert sample(registry, "records_written_total", two) == 0
    # A store reopened under the same labels continues the same series (as prometheus children did).
    again = BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "1"}, registry)
    again.on_written(1, batched=True)
    assert sample(registry, "records_written_total", one) == 7
    a.unregister()
    assert sample(registry, "records_written_total", one) is None
    assert sample(registry, "records_failed_total", two) == 3


def test_a_clashing_metric_name_is_refused_at_registration() -> None:
    registry = CollectorRegistry()
    BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "0"}, registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter(f"{P}_records_written", "clash", registry=registry)


def test_other_label_names_for_the_same_prefix_are_refused() -> None:
    registry = CollectorRegistry()
    BufferedWriterMetrics("pulsar_txn_tc", {"coordinator_id": "0"}, registry)
    with pytest.raises(ValueError, match="already exist in this registry with labels"):
        BufferedWriterMetrics("pulsar_txn_tc", {"topic": "t"}, registry)
