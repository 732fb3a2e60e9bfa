"""Settings of one buffered writer (PIP-160's four knobs plus the flush mode), validated where they are made.

Settings arrive from CR specs, JSON files and the admin API, so a wrong type or value must be refused
at once with a message naming the setting and the accepted range, before any writer sees it. What is
accepted, and how a refusal reads, is the declaration's (``contract.settings.batched_write``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.batched_write import (
    BATCHED_WRITE,
    DEFAULT_ENABLED,
    DEFAULT_FLUSH_MODE,
    DEFAULT_MAX_DELAY_MILLIS,
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_SIZE_BYTES,
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
        for setting in BATCHED_WRITE.settings:
            try:
                setting.check(getattr(self, setting.field), f"{BATCHED_WRITE.name}.{setting.key}")
            except schema.SettingValueError as exc:
                raise InvalidBatchedWriteConfigError(str(exc)) from exc

    @property
    def batching(self) -> bool:
        """Whether records are batched at all: Pulsar writes plain entries when maxRecords <= 1."""
        return self.enabled and self.max_records > 1

    def to_stat(self) -> dict[str, Any]:
        """This config as Pulsar's TxnBufferedWriterStat (admin API shape)."""
        stat = {key: getattr(self, s.field) for key, s in BATCHED_WRITE.keys("stat").items()}
        stat["batchedWriteMaxDelayInMillis"] = _delay_for_stat(self.max_delay_millis)
        return stat

    def with_stat(self, partial: Mapping[str, Any]) -> BatchedWriteConfig:
        """Apply a partial TxnBufferedWriterStat (e.g. ``{"batchEnabled": true}``) to this config."""
        return self._with(partial, "stat")

    def _with(self, partial: Mapping[str, Any], spelling: str | None) -> BatchedWriteConfig:
        # Keys by the declaration's spelling; values are checked (and refusals worded) by __post_init__.
        keys = BATCHED_WRITE.keys(spelling)
        unknown = sorted(str(k) for k in set(partial) - set(keys))
        if unknown:
            raise InvalidBatchedWriteConfigError(
                f"unknown batched-write setting(s) {unknown}; known: {sorted(keys)}"
            )
        return replace(self, **{keys[k].field: v for k, v in partial.items()})

    @classmethod
    def from_stat(cls, stat: Mapping[str, Any]) -> BatchedWriteConfig:
        """Build a config from a (possibly partial) TxnBufferedWriterStat; missing keys take defaults."""
        return cls().with_stat(stat)


def _delay_for_stat(delay: float) -> int | float:
    return int(delay) if float(delay).is_integer() else delay
