"""PIP-160 batched-write limits and defaults: the one set the runtime, its ``--config`` file, the admin API
and the CRDs all enforce.

Why a module of its own: before it, the CRD accepted a maxSizeBytes the runtime refused (up to 64 MiB
against the runtime's 16 MiB cap) and the runtime accepted a maxDelayMillis of 10^12 that stalls every
transaction. Every layer now reads its bounds from here. It imports only the standard library so the
operator (which never imports runtime internals, docs/contracts.md §0) can import it too; the
``BatchSettings`` value every layer passes around lives here for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

# Defaults are Pulsar's (transactionLogBatchedWriteEnabled=false, 512 records, 4 MiB, 1 ms).
DEFAULT_ENABLED = False
DEFAULT_MAX_RECORDS = 512
DEFAULT_MAX_SIZE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_DELAY_MILLIS = 1
# How a batch leaves (ours, not Pulsar's): "adaptive" hands it to the ledger at once while no batch
# entry is in flight and accumulates while one is; "delay" is Pulsar's pure timer, for parity.
FLUSH_MODES = ("adaptive", "delay")
DEFAULT_FLUSH_MODE = "adaptive"

# maxRecords 1 means "every record is its own (plain) entry", as in Pulsar. The upper bound keeps a
# batch's ack set (one bit per record, kept per entry by every cursor) small.
MIN_MAX_RECORDS = 1
MAX_MAX_RECORDS = 65536
# A batch that batches at all holds at least two records (the CRD refuses enabled with maxRecords 1).
MIN_MAX_RECORDS_WHEN_ENABLED = 2

# The smallest batch is its 4-byte header plus one framed empty record (tag + length byte); the
# bufferedwriter's tests check that this still matches the codec's format.
MIN_MAX_SIZE_BYTES = 6
# A batch can reach about twice maxSize (it flushes after the record that crosses the limit); this
# bound keeps every batch well inside the managed ledger's 64 MiB entry limit.
MAX_MAX_SIZE_BYTES = 16 * 1024 * 1024

# 0 flushes on the next event-loop turn. A transaction's operation waits for its batch to be written,
# so the delay is added to every transactional call: past a minute, every client times out first.
MIN_MAX_DELAY_MILLIS = 0
MAX_MAX_DELAY_MILLIS = 60_000

# The two spellings of the settings, key -> BatchSettings field: the CRD's and the --config file's
# batchedWrite block, and Pulsar's TxnBufferedWriterStat (the admin API's; the flush mode is our extra).
BLOCK_FIELDS = {
    "enabled": "enabled",
    "maxRecords": "max_records",
    "maxSizeBytes": "max_size_bytes",
    "maxDelayMillis": "max_delay_millis",
    "flushMode": "flush_mode",
}
STAT_FIELDS = {
    "batchEnabled": "enabled",
    "batchedWriteMaxRecords": "max_records",
    "batchedWriteMaxSize": "max_size_bytes",
    "batchedWriteMaxDelayInMillis": "max_delay_millis",
    "batchedWriteFlushMode": "flush_mode",
}


class InvalidBatchSettingsError(ValueError):
    """A batchedWrite block or TxnBufferedWriterStat has an unknown key or a value of the wrong type."""


def parse_fields(spelled: Mapping[str, Any], spelling: Mapping[str, str], where: str) -> dict[str, Any]:
    """The BatchSettings fields a (possibly partial) block or stat sets, keyed by field name.

    Strict: an unknown key, or a value of the wrong JSON type, is refused naming it (``where`` says
    which block). Ranges are checked where the settings are used (the runtime's BatchedWriteConfig,
    the CRD), against the limits above. ``maxDelayMillis`` may be fractional (sub-millisecond delays).
    """
    if not isinstance(spelled, Mapping):
        raise InvalidBatchSettingsError(f"{where} must be an object, got {type(spelled).__name__}")
    unknown = sorted(str(k) for k in spelled if k not in spelling)
    if unknown:
        raise InvalidBatchSettingsError(f"{where}: unknown key(s) {unknown}; known: {sorted(spelling)}")
    fields: dict[str, Any] = {}
    for key, value in spelled.items():
        name = spelling[key]
        if name == "enabled":
            ok = isinstance(value, bool)
        elif name == "flush_mode":
            ok = value in FLUSH_MODES
        elif name == "max_delay_millis":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            wanted = {
                "enabled": "true or false",
                "flush_mode": f"one of {list(FLUSH_MODES)}",
                "max_delay_millis": "a number of milliseconds",
            }.get(name, "an integer")
            raise InvalidBatchSettingsError(f"{where}.{key} must be {wanted}, got {_shown(value)}")
        fields[name] = value
    return fields


def _shown(value: object, limit: int = 40) -> str:
    # A request's 10^5-digit integer or deep array must not become a huge message (or hit the
    # int-to-text limit, which raises).
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        fields = parse_fields(block, BLOCK_FIELDS, where)
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
