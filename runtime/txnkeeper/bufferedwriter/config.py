"""Settings of one buffered writer (PIP-160's four knobs), validated where they are made.

Settings arrive from CR specs, JSON files and the admin API, so a wrong type or value must be refused
at once with a message naming the setting and the accepted range, before any writer sees it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from txnkeeper.bufferedwriter.codec import BATCH_HEADER_SIZE, MIN_FRAMED_RECORD_SIZE

# A batch must at least hold its header and one framed (empty) record.
MIN_MAX_SIZE_BYTES = BATCH_HEADER_SIZE + MIN_FRAMED_RECORD_SIZE
# A batch can reach about twice maxSize (it flushes after the record that crosses the limit); this bound
# keeps every batch well inside the ledger's 64 MiB entry limit.
MAX_MAX_SIZE_BYTES = 16 * 1024 * 1024

# TxnBufferedWriterStat field (Pulsar's name) -> our field.
_STAT_FIELDS = {
    "batchEnabled": "enabled",
    "batchedWriteMaxRecords": "max_records",
    "batchedWriteMaxSize": "max_size_bytes",
    "batchedWriteMaxDelayInMillis": "max_delay_millis",
    "batchedWriteFlushMode": "flush_mode",
}

# "adaptive" (the default) hands a batch to the ledger at once while no batch entry is in flight;
# "delay" is Pulsar's pure timer behaviour, kept for byte-for-byte behavioural parity.
FLUSH_MODES = ("adaptive", "delay")


class InvalidBatchedWriteConfigError(ValueError):
    """A batched-write setting is out of range or of the wrong type."""


@dataclass(frozen=True)
class BatchedWriteConfig:
    """PIP-160 settings; defaults are Pulsar's (off, 512 records, 4 MiB, 1 ms), plus the flush mode.

    ``flush_mode`` is ours, not Pulsar's: "adaptive" (default) never holds a batch while the ledger is
    idle; "delay" waits for Pulsar's timer tick exactly as Pulsar does (see writer.py).
    """

    enabled: bool = False
    max_records: int = 512
    max_size_bytes: int = 4 * 1024 * 1024
    max_delay_millis: float = 1.0
    flush_mode: str = "adaptive"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.enabled must be true or false, got {self.enabled!r}"
            )
        if not _is_int(self.max_records) or self.max_records < 1:
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxRecords must be an integer >= 1, got {self.max_records!r}"
                " (1 writes every record as its own entry)"
            )
        if (
            not _is_int(self.max_size_bytes)
            or not MIN_MAX_SIZE_BYTES <= self.max_size_bytes <= MAX_MAX_SIZE_BYTES
        ):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxSizeBytes must be an integer from {MIN_MAX_SIZE_BYTES} (the batch header"
                f" plus one record header) to {MAX_MAX_SIZE_BYTES} (16 MiB), got {self.max_size_bytes!r}"
            )
        delay = self.max_delay_millis
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxDelayMillis must be a finite number >= 0, got {delay!r}"
            )
        if self.flush_mode not in FLUSH_MODES:
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.flushMode must be one of {list(FLUSH_MODES)}, got {self.flush_mode!r}"
                ' ("delay" is Pulsar\'s behaviour, "adaptive" flushes at once while the ledger is idle)'
            )

    @property
    def batching(self) -> bool:
        """Whether records are batched at all: Pulsar writes plain entries when maxRecords <= 1."""
        return self.enabled and self.max_records > 1

    def to_stat(self) -> dict[str, Any]:
        """This config as Pulsar's TxnBufferedWriterStat (admin API shape)."""
        return {
            "batchEnabled": self.enabled,
            "batchedWriteMaxRecords": self.max_records,
            "batchedWriteMaxSize": self.max_size_bytes,
            "batchedWriteMaxDelayInMillis": _delay_for_stat(self.max_delay_millis),
            "batchedWriteFlushMode": self.flush_mode,
        }

    def with_stat(self, partial: Mapping[str, Any]) -> BatchedWriteConfig:
        """Apply a partial TxnBufferedWriterStat (e.g. ``{"batchEnabled": true}``) to this config."""
        unknown = sorted(set(partial) - set(_STAT_FIELDS))
        if unknown:
            raise InvalidBatchedWriteConfigError(
                f"unknown batched-write setting(s) {unknown}; known: {sorted(_STAT_FIELDS)}"
            )
        return replace(self, **{_STAT_FIELDS[k]: v for k, v in partial.items()})

    @classmethod
    def from_stat(cls, stat: Mapping[str, Any]) -> BatchedWriteConfig:
        """Build a config from a (possibly partial) TxnBufferedWriterStat; missing keys take defaults."""
        return cls().with_stat(stat)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _delay_for_stat(delay: float) -> int | float:
    return int(delay) if float(delay).is_integer() else delay
