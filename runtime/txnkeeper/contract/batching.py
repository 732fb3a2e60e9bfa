"""The PIP-160 batched-write value every layer passes around (``BatchSettings``) and its spellings.

The settings themselves (keys, types, limits, defaults, error texts) are declared once in
``contract.settings.batched_write``; the runtime, its ``--config`` file, the admin API and the CRDs all
check through that declaration, and this module re-exports its constants. Standard library only, so
the operator (which never imports runtime internals, docs/contracts.md §0) can import it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    FLUSH_MODES,
    MAX_MAX_DELAY_MILLIS,
    MAX_MAX_RECORDS,
    MAX_MAX_SIZE_BYTES,
    MIN_MAX_DELAY_MILLIS,
    MIN_MAX_RECORDS,
    MIN_MAX_RECORDS_WHEN_ENABLED,
    MIN_MAX_SIZE_BYTES,
)

# Re-exported: the declaration's limits, under the names every layer has used.
__all__ = [
    "BATCHED_WRITE",
    "DEFAULT_ENABLED",
    "DEFAULT_FLUSH_MODE",
    "DEFAULT_MAX_DELAY_MILLIS",
    "DEFAULT_MAX_RECORDS",
    "DEFAULT_MAX_SIZE_BYTES",
    "FLUSH_MODES",
    "MAX_MAX_DELAY_MILLIS",
    "MAX_MAX_RECORDS",
    "MAX_MAX_SIZE_BYTES",
    "MIN_MAX_DELAY_MILLIS",
    "MIN_MAX_RECORDS",
    "MIN_MAX_RECORDS_WHEN_ENABLED",
    "MIN_MAX_SIZE_BYTES",
    "BatchSettings",
    "InvalidBatchSettingsError",
    "parse_fields",
]


class InvalidBatchSettingsError(ValueError):
    """A batchedWrite block or TxnBufferedWriterStat has an unknown key or a value it does not allow."""


def parse_fields(
    spelled: object, spelling: str | None, where: str, unknown_noun: str = "key(s)"
) -> dict[str, Any]:
    """The BatchSettings fields a (possibly partial) block (``spelling`` None) or stat (``"stat"``)
    sets, keyed by field name, each checked against the declaration (type and range); an unknown key
    or a value it does not allow is refused naming ``where.key``, the value and what is allowed."""
    try:
        return schema.parse(BATCHED_WRITE, spelled, where, spelling=spelling, unknown_noun=unknown_noun)
    except schema.SettingValueError as exc:
        raise InvalidBatchSettingsError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The PIP-160 batchedWrite settings for one pod's stores, and every spelling of them.

    Spellings: the CRD's and the --config file's ``batchedWrite`` block (``from_block``/``to_block``)
    and Pulsar's TxnBufferedWriterStat, which the admin API takes and reports (``from_stat``/``to_stat``).
    ``flush_mode`` is set by the --config file and the admin API only (the CRD has no field for it, so
    the operator leaves it at the default and does not compare it); it is spelled only when not default.
    """

    enabled: bool = DEFAULT_ENABLED
    max_records: int = DEFAULT_MAX_RECORDS
    max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES
    max_delay_millis: int = DEFAULT_MAX_DELAY_MILLIS
    flush_mode: str = DEFAULT_FLUSH_MODE

    def disabled(self) -> BatchSettings:
        return replace(self, enabled=False)

    @classmethod
    def from_stat(cls, stat: Mapping[str, Any]) -> BatchSettings:
        """From Pulsar's TxnBufferedWriterStat, as a pod's admin API reports it."""
        return cls(
            enabled=bool(stat["batchEnabled"]),
            max_records=int(stat["batchedWriteMaxRecords"]),
            max_size_bytes=int(stat["batchedWriteMaxSize"]),
            max_delay_millis=round(float(stat["batchedWriteMaxDelayInMillis"])),
        )

    @classmethod
    def effective(cls, pod_level: BatchSettings, stores: Iterable[BatchSettings]) -> BatchSettings:
        """One value for a whole pod from its pod-level settings and its stores' own.

        Stores that disagree with the pod level make it a value that satisfies no spec (so the engine
        configures the pod again), enabled if any store batches (so a downgrade never mistakes a
        half-disabled pod for a disabled one).
        """
        stores = list(stores)
        if all(s == pod_level for s in stores):
            return pod_level
        any_enabled = pod_level.enabled or any(s.enabled for s in stores)
        return cls(enabled=any_enabled, max_records=0, max_size_bytes=0, max_delay_millis=0)

    @classmethod
    def from_block(cls, block: Mapping[str, Any], where: str = "batchedWrite") -> BatchSettings:
        """From a CR's (or the --config file's) batchedWrite block; a missing field takes its default.

        Strict (``parse_fields``); a fractional maxDelayMillis is rounded (the CRD allows integers only).
        """
        fields = parse_fields(block, None, where)
        if "max_delay_millis" in fields:
            fields["max_delay_millis"] = round(fields["max_delay_millis"])
        return cls(**fields)

    def to_block(self) -> dict[str, Any]:
        """As a CR's (or the --config file's) batchedWrite block."""
        block: dict[str, Any] = {
            "enabled": self.enabled,
            "maxRecords": self.max_records,
            "maxSizeBytes": self.max_size_bytes,
            "maxDelayMillis": self.max_delay_millis,
        }
        if self.flush_mode != DEFAULT_FLUSH_MODE:
            block["flushMode"] = self.flush_mode
        return block

    def to_stat(self) -> dict[str, Any]:
        """As Pulsar's TxnBufferedWriterStat (what a pod's admin API takes)."""
        return {
            "batchEnabled": self.enabled,
            "batchedWriteMaxRecords": self.max_records,
            "batchedWriteMaxSize": self.max_size_bytes,
            "batchedWriteMaxDelayInMillis": self.max_delay_millis,
        } | ({} if self.flush_mode == DEFAULT_FLUSH_MODE else {"batchedWriteFlushMode": self.flush_mode})

    def satisfies(self, wanted: BatchSettings) -> bool:
        """True when a store running with these settings is what ``wanted`` asks for.

        Limits only matter while batching is on: a disabled writer writes every record directly.
        """
        if self.enabled != wanted.enabled:
            return False
        if not wanted.enabled:
            return True
        return (
            self.max_records == wanted.max_records
            and self.max_size_bytes == wanted.max_size_bytes
            and self.max_delay_millis == wanted.max_delay_millis
        )
