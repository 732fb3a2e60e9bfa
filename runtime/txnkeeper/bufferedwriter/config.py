"""Settings of one buffered writer (PIP-160's four knobs), validated where they are made.

Settings arrive from CR specs, JSON files and the admin API, so a wrong type or value must be refused
at once with a message naming the setting and the accepted range, before any writer sees it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from txnkeeper.contract.batching import (
    BLOCK_FIELDS,
    DEFAULT_ENABLED,
    DEFAULT_FLUSH_MODE,
    DEFAULT_MAX_DELAY_MILLIS,
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_SIZE_BYTES,
    FLUSH_MODES,
    MAX_MAX_DELAY_MILLIS,
    MAX_MAX_RECORDS,
    MAX_MAX_SIZE_BYTES,
    MIN_MAX_DELAY_MILLIS,
    MIN_MAX_RECORDS,
    MIN_MAX_SIZE_BYTES,
    STAT_FIELDS,
)


class InvalidBatchedWriteConfigError(ValueError):
    """A batched-write setting is out of range or of the wrong type."""


@dataclass(frozen=True)
class BatchedWriteConfig:
    """PIP-160 settings; defaults are Pulsar's (off, 512 records, 4 MiB, 1 ms), plus the flush mode.

    ``flush_mode`` is ours, not Pulsar's: "adaptive" (default) never holds a batch while the ledger is
    idle; "delay" waits for Pulsar's timer tick exactly as Pulsar does (see writer.py).
    """

    enabled: bool = DEFAULT_ENABLED
    max_records: int = DEFAULT_MAX_RECORDS
    max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES
    max_delay_millis: float = float(DEFAULT_MAX_DELAY_MILLIS)
    flush_mode: str = DEFAULT_FLUSH_MODE

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.enabled must be true or false, got {_shown(self.enabled)}"
            )
        if not _is_int(self.max_records) or not MIN_MAX_RECORDS <= self.max_records <= MAX_MAX_RECORDS:
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxRecords must be an integer from {MIN_MAX_RECORDS} (every record its own"
                f" entry) to {MAX_MAX_RECORDS}, got {_shown(self.max_records)}"
            )
        if (
            not _is_int(self.max_size_bytes)
            or not MIN_MAX_SIZE_BYTES <= self.max_size_bytes <= MAX_MAX_SIZE_BYTES
        ):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxSizeBytes must be an integer from {MIN_MAX_SIZE_BYTES} (the batch header"
                f" plus one record header) to {MAX_MAX_SIZE_BYTES} (16 MiB),"
                f" got {_shown(self.max_size_bytes)}"
            )
        delay = self.max_delay_millis
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not math.isfinite(delay)
            or not MIN_MAX_DELAY_MILLIS <= delay <= MAX_MAX_DELAY_MILLIS
        ):
            raise InvalidBatchedWriteConfigError(
                f"batchedWrite.maxDelayMillis must be a number of milliseconds from {MIN_MAX_DELAY_MILLIS}"
                f" to {MAX_MAX_DELAY_MILLIS} (every transactional call waits up to this long), got"
                f" {_shown(delay)}"
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
        stat = {key: getattr(self, name) for key, name in STAT_FIELDS.items()}
        stat["batchedWriteMaxDelayInMillis"] = _delay_for_stat(self.max_delay_millis)
        return stat

    def with_stat(self, partial: Mapping[str, Any]) -> BatchedWriteConfig:
        """Apply a partial TxnBufferedWriterStat (e.g. ``{"batchEnabled": true}``) to this config."""
        return self._with(partial, STAT_FIELDS)

    def with_block(self, partial: Mapping[str, Any]) -> BatchedWriteConfig:
        """Apply a partial batchedWrite block (the CR's and the --config file's keys) to this config."""
        return self._with(partial, BLOCK_FIELDS)

    def _with(self, partial: Mapping[str, Any], spelling: Mapping[str, str]) -> BatchedWriteConfig:
        # The key tables are the contract's (BatchSettings' spellings); the values are checked here.
        unknown = sorted(str(k) for k in set(partial) - set(spelling))
        if unknown:
            raise InvalidBatchedWriteConfigError(
                f"unknown batched-write setting(s) {unknown}; known: {sorted(spelling)}"
            )
        return replace(self, **{spelling[k]: v for k, v in partial.items()})

    @classmethod
    def from_stat(cls, stat: Mapping[str, Any]) -> BatchedWriteConfig:
        """Build a config from a (possibly partial) TxnBufferedWriterStat; missing keys take defaults."""
        return cls().with_stat(stat)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut short: a request's 10^5-digit integer must not become a 100 kB message (nor
    hit Python's int-to-text limit, which raises)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list | dict):  # its repr could be huge, or nested past the recursion limit
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _delay_for_stat(delay: float) -> int | float:
    return int(delay) if float(delay).is_integer() else delay
