"""Prometheus metrics of a buffered writer, under the names Pulsar shipped for PIP-160.

One metric family per (registry, prefix) is shared by every writer of that kind (each coordinator's
log, each subscription's pending-ack log) and told apart by labels, because prometheus-client refuses
two collectors with one name in a registry. Observations happen once per flushed entry, never per
record; at one transaction in flight that is once per record all the same, and prometheus-client's
histograms and counters (a lock and a wrapper call per value) made a batched entry cost 5 us of metrics
against 1 us for an unbatched one. So the counters and histograms are plain ints a writer bumps, and
one collector per family set turns them into samples only when scraped; the flush-mode gauge, set only
on reconfiguration, stays a prometheus-client Gauge.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from txnkeeper.contract.batching import FLUSH_MODES

TXN_LOG_PREFIX = "pulsar_txn_tc"
PENDING_ACK_PREFIX = "pulsar_txn_pending_ack_store"

BATCH_RECORDS_BUCKETS = (10, 50, 100, 200, 500, 1000)
BATCH_SIZE_BYTES_BUCKETS = (128, 512, 1024, 2048, 4096, 16384, 102400, 1232896)
# Pulsar meant 1/5/10 ms but exported the numbers as seconds; these are the intended values, in seconds.
OLDEST_RECORD_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class FlushTrigger(Enum):
    """Why a batch was flushed (Pulsar's four trigger counters, our idle one), plus uncounted flushes."""

    MAX_RECORDS = "max_records"
    MAX_SIZE = "max_size"
    MAX_DELAY = "max_delay"
    LARGE_DATA = "large_data"
    # Ours (adaptive flush mode): the batch left because no batch entry of its writer was in flight.
    # Counted as ..._flush_trigger_idle_total, so a scrape shows which mode is doing the flushing.
    IDLE = "idle"
    # Not counted by a trigger metric: reconfiguration or an explicit flush (e.g. graceful close).
    FORCED = "forced"


class _Stats:
    """One label set's counters and histogram buckets (non-cumulative; the last slot is +Inf)."""

    __slots__ = (
        "batch_records",
        "batch_records_sum",
        "batch_size",
        "batch_size_sum",
        "batched_entries",
        "delay",
        "delay_sum",
        "failed",
        "plain_entries",
        "records",
        "triggers",
    )

    def __init__(self) -> None:
        self.triggers = dict.fromkeys(FlushTrigger, 0)
        self.batch_records = [0] * (len(BATCH_RECORDS_BUCKETS) + 1)
        self.batch_records_sum = 0
        self.batch_size = [0] * (len(BATCH_SIZE_BYTES_BUCKETS) + 1)
        self.batch_size_sum = 0
        self.delay = [0] * (len(OLDEST_RECORD_DELAY_BUCKETS) + 1)
        self.delay_sum = 0.0
        self.records = 0
        self.batched_entries = 0
        self.plain_entries = 0
        self.failed = 0


# prometheus-client's spelling of a bucket bound ("10.0", "0.0005", "+Inf"), as its Histogram exposed.
_le: Callable[[float], str] = floatToGoString


def _histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    bounds: tuple[float, ...],
    counts: list[int],
    total: float,
) -> None:
    cumulative, buckets = 0, []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        buckets.append((_le(bound), float(cumulative)))
    family.add_metric(labels, buckets, float(total))


@dataclass(eq=False)  # hashable by identity: the registry keys its collectors
class _Families(Collector):
    """Every writer's stats of one (registry, prefix), exposed as Pulsar's metric families."""

    prefix: str
    label_names: tuple[str, ...]
    flush_mode: Gauge
    stats: dict[tuple[str, ...], _Stats] = field(default_factory=dict)

    def describe(self) -> Iterator[Metric]:
        # The names, so the registry refuses a second collector that would clash with them.
        return self._families(with_samples=False)

    def collect(self) -> Iterator[Metric]:
        return self._families(with_samples=True)

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        p, labels = f"{self.prefix}_bufferedwriter", list(self.label_names)
        # A copy: a scrape may run beside the loop that adds and drops writers.
        items = list(self.stats.items()) if with_samples else []
        histograms = (
            ("batch_records", "Records per flushed batch", BATCH_RECORDS_BUCKETS),
            ("batch_size_bytes", "Bytes of records per flushed batch", BATCH_SIZE_BYTES_BUCKETS),
            (
                "batch_oldest_record_delay_seconds",
                "Time the oldest record of a batch waited before the flush",
                OLDEST_RECORD_DELAY_BUCKETS,
            ),
        )
        for name, doc, bounds in histograms:
            hist = HistogramMetricFamily(f"{p}_{name}", doc, labels=labels)
            for values, st in items:
                if name == "batch_records":
                    _histogram(hist, list(values), bounds, st.batch_records, st.batch_records_sum)
                elif name == "batch_size_bytes":
                    _histogram(hist, list(values), bounds, st.batch_size, st.batch_size_sum)
                else:
                    _histogram(hist, list(values), bounds, st.delay, st.delay_sum)
            yield hist
        for trigger in FlushTrigger:
            if trigger is FlushTrigger.FORCED:
                continue
            counter = CounterMetricFamily(
                f"{p}_flush_trigger_{trigger.value}",
                f"Batches flushed by the {trigger.value} trigger",
                labels=labels,
            )
            for values, st in items:
                counter.add_metric(list(values), st.triggers[trigger])
            yield counter
        records = CounterMetricFamily(
            f"{p}_records_written", "Records acknowledged durable by the ledger", labels=labels
        )
        entries = CounterMetricFamily(
            f"{p}_entries_written", "Ledger entries written, by entry format", labels=[*labels, "format"]
        )
        failed = CounterMetricFamily(
            f"{p}_records_failed", "Records whose ledger write failed", labels=labels
        )
        for values, st in items:
            records.add_metric(list(values), st.records)
            entries.add_metric([*values, "batched"], st.batched_entries)
            entries.add_metric([*values, "unbatched"], st.plain_entries)
            failed.add_metric(list(values), st.failed)
        yield records
        yield entries
        yield failed


_families_lock = threading.Lock()
_families: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, _Families]] = weakref.WeakKeyDictionary()


def _families_for(registry: CollectorRegistry, prefix: str, label_names: tuple[str, ...]) -> _Families:
    with _families_lock:
        per_registry = _families.setdefault(registry, {})
        existing = per_registry.get(prefix)
        if existing is not None:
            if existing.label_names != label_names:
                raise ValueError(
                    f"metrics {prefix}_bufferedwriter_* already exist in this registry with labels"
                    f" {existing.label_names}, not {label_names}"
                )
            return existing
        fams = _Families(
            prefix=prefix,
            label_names=label_names,
            flush_mode=Gauge(
                f"{prefix}_bufferedwriter_flush_mode",
                "1 for the flush mode in force (adaptive, or delay: Pulsar's), 0 for the other",
                [*label_names, "mode"],
                registry=registry,
            ),
        )
        registry.register(fams)
        per_registry[prefix] = fams
        return fams


class BufferedWriterMetrics:
    """The metrics of one writer (one label set); writers with equal labels share their values."""

    def __init__(
        self,
        prefix: str,
        labels: dict[str, str],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.prefix = prefix
        self.labels = dict(labels)
        self._values = tuple(labels.values())
        self._fams = _families_for(registry if registry is not None else REGISTRY, prefix, tuple(labels))
        self._stats = self._fams.stats.setdefault(self._values, _Stats())
        self._modes = {mode: self._fams.flush_mode.labels(*self._values, mode) for mode in FLUSH_MODES}

    def set_flush_mode(self, mode: str) -> None:
        """Name the flush mode in force (the writer calls this whenever its settings change)."""
        for name, gauge in self._modes.items():
            gauge.set(1 if name == mode else 0)

    def on_flush(self, trigger: FlushTrigger, records: int, size_bytes: int, oldest_delay_s: float) -> None:
        """A batch was handed to the ledger (FORCED flushes are kept but not exported, as before)."""
        st = self._stats
        st.triggers[trigger] += 1
        st.batch_records[bisect_left(BATCH_RECORDS_BUCKETS, records)] += 1
        st.batch_records_sum += records
        st.batch_size[bisect_left(BATCH_SIZE_BYTES_BUCKETS, size_bytes)] += 1
        st.batch_size_sum += size_bytes
        st.delay[bisect_left(OLDEST_RECORD_DELAY_BUCKETS, oldest_delay_s)] += 1
        st.delay_sum += oldest_delay_s

    def on_written(self, records: int, batched: bool) -> None:
        """An entry holding ``records`` records is durable."""
        st = self._stats
        st.records += records
        if batched:
            st.batched_entries += 1
        else:
            st.plain_entries += 1

    def on_failed(self, records: int) -> None:
        """An entry's write failed; its ``records`` records failed with it."""
        self._stats.failed += records

    def unregister(self) -> None:
        """Drop this writer's label set (the store closed), so scrapes stop showing a dead log."""
        self._fams.stats.pop(self._values, None)
        for mode in FLUSH_MODES:
            with contextlib.suppress(KeyError):
                self._fams.flush_mode.remove(*self._values, mode)
