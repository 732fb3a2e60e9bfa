"""Prometheus metrics of a buffered writer, under the names Pulsar shipped for PIP-160.

One metric family per (registry, prefix) is shared by every writer of that kind (each coordinator's
log, each subscription's pending-ack log) and told apart by labels, because prometheus-client refuses
two collectors with one name in a registry. Observations happen once per flushed entry, never per
record, so they cost nothing on the record path.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

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


@dataclass(frozen=True)
class _Families:
    label_names: tuple[str, ...]
    batch_records: Histogram
    batch_size_bytes: Histogram
    oldest_record_delay: Histogram
    triggers: dict[FlushTrigger, Counter]
    records_written: Counter
    entries_written: Counter
    records_failed: Counter
    flush_mode: Gauge


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
        p = f"{prefix}_bufferedwriter"
        labels = list(label_names)

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(f"{p}_{name}", doc, [*labels, *extra], registry=registry)

        fams = _Families(
            label_names=label_names,
            batch_records=Histogram(
                f"{p}_batch_records",
                "Records per flushed batch",
                labels,
                buckets=BATCH_RECORDS_BUCKETS,
                registry=registry,
            ),
            batch_size_bytes=Histogram(
                f"{p}_batch_size_bytes",
                "Bytes of records per flushed batch",
                labels,
                buckets=BATCH_SIZE_BYTES_BUCKETS,
                registry=registry,
            ),
            oldest_record_delay=Histogram(
                f"{p}_batch_oldest_record_delay_seconds",
                "Time the oldest record of a batch waited before the flush",
                labels,
                buckets=OLDEST_RECORD_DELAY_BUCKETS,
                registry=registry,
            ),
            triggers={
                t: counter(f"flush_trigger_{t.value}", f"Batches flushed by the {t.value} trigger")
                for t in FlushTrigger
                if t is not FlushTrigger.FORCED
            },
            records_written=counter("records_written", "Records acknowledged durable by the ledger"),
            entries_written=counter("entries_written", "Ledger entries written, by entry format", ["format"]),
            records_failed=counter("records_failed", "Records whose ledger write failed"),
            flush_mode=Gauge(
                f"{p}_flush_mode",
                "1 for the flush mode in force (adaptive, or delay: Pulsar's), 0 for the other",
                [*labels, "mode"],
                registry=registry,
            ),
        )
        per_registry[prefix] = fams
        return fams


class BufferedWriterMetrics:
    """The metric children of one writer (one label set)."""

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
        f, v = self._fams, self._values
        self._batch_records = f.batch_records.labels(*v)
        self._batch_size = f.batch_size_bytes.labels(*v)
        self._delay = f.oldest_record_delay.labels(*v)
        self._triggers = {t: c.labels(*v) for t, c in f.triggers.items()}
        self._records = f.records_written.labels(*v)
        self._batched_entries = f.entries_written.labels(*v, "batched")
        self._plain_entries = f.entries_written.labels(*v, "unbatched")
        self._failed = f.records_failed.labels(*v)
        self._modes = {mode: f.flush_mode.labels(*v, mode) for mode in FLUSH_MODES}

    def set_flush_mode(self, mode: str) -> None:
        """Name the flush mode in force (the writer calls this whenever its settings change)."""
        for name, gauge in self._modes.items():
            gauge.set(1 if name == mode else 0)

    def on_flush(self, trigger: FlushTrigger, records: int, size_bytes: int, oldest_delay_s: float) -> None:
        """A batch was handed to the ledger."""
        counter = self._triggers.get(trigger)
        if counter is not None:
            counter.inc()
        self._batch_records.observe(records)
        self._batch_size.observe(size_bytes)
        self._delay.observe(oldest_delay_s)

    def on_written(self, records: int, batched: bool) -> None:
        """An entry holding ``records`` records is durable."""
        self._records.inc(records)
        (self._batched_entries if batched else self._plain_entries).inc()

    def on_failed(self, records: int) -> None:
        """An entry's write failed; its ``records`` records failed with it."""
        self._failed.inc(records)

    def unregister(self) -> None:
        """Drop this writer's label set (the store closed), so scrapes stop showing a dead log."""
        f, v = self._fams, self._values
        for fam in (
            f.batch_records,
            f.batch_size_bytes,
            f.oldest_record_delay,
            f.records_written,
            f.records_failed,
            *f.triggers.values(),
        ):
            _remove(fam, v)
        for mode in FLUSH_MODES:
            _remove(f.flush_mode, (*v, mode))
        _remove(f.entries_written, (*v, "batched"))
        _remove(f.entries_written, (*v, "unbatched"))


def _remove(metric: MetricWrapperBase, values: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*values)
