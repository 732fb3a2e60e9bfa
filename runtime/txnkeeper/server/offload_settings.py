"""The ``offload`` section of a store pod's ``--config`` file, and per-topic overrides, under Pulsar's keys.

Why its own module: offload settings come from two places (the pod's config file and a topic's
``offload-policies set``) and must be validated the same way and merged one way (the topic's keys over
the pod's). Keys are Pulsar's broker.conf / OffloadPolicies names, plus ours where Pulsar has none
(``offloadMode``, ``offloadRetryIntervalSeconds``); values may be JSON numbers or, as in Pulsar's
properties files, decimal strings. Every mistake is an ``OffloadSettingsError`` naming the key.

    {"offload": {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "/offload",
                 "managedLedgerOffloadThresholdInBytes": 0, "offloadMode": "streaming"}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txnkeeper.contract import store_settings as limits
from txnkeeper.ledger.offload import OffloadConfig, OffloadConfigError
from txnkeeper.ledger.offload.offloader import OffloadPolicy
from txnkeeper.server import config

SECTION = "offload"

# key -> type, for the blob store (OffloadConfig) and for the policy (OffloadPolicy)
CONFIG_KEYS: dict[str, type] = {
    "managedLedgerOffloadDriver": str,
    "managedLedgerOffloadBucket": str,
    "managedLedgerOffloadRegion": str,
    "managedLedgerOffloadServiceEndpoint": str,
    "fileSystemURI": str,
    "managedLedgerOffloadMaxBlockSizeInBytes": int,
    "managedLedgerOffloadMinBlockSizeInBytes": int,
    "managedLedgerOffloadReadBufferSizeInBytes": int,
    "managedLedgerOffloadWriteBufferSizeInBytes": int,
}
POLICY_KEYS: dict[str, type] = {
    "managedLedgerOffloadThresholdInBytes": int,
    "managedLedgerOffloadDeletionLagMs": int,
    "maxOffloadSegmentSizeInBytes": int,
    "maxOffloadSegmentRolloverTimeInSeconds": float,
    "minOffloadSegmentRolloverTimeInSeconds": float,
    "managedLedgerDataReadPriority": str,
    "offloadRetryIntervalSeconds": float,
    "offloadMode": str,
}
KEYS = {**CONFIG_KEYS, **POLICY_KEYS}
_JAVA_LONG = 2**63 - 1
# key -> (lowest, highest) accepted; what a value outside says comes from _range_text.
BOUNDS: dict[str, tuple[float, float]] = {
    # -1 is Pulsar's "on demand only": the range -1..max is exactly {-1} and 0..max for an integer.
    "managedLedgerOffloadThresholdInBytes": (-1, _JAVA_LONG),
    "managedLedgerOffloadDeletionLagMs": (0, _JAVA_LONG),
    "maxOffloadSegmentSizeInBytes": (1, _JAVA_LONG),
    "maxOffloadSegmentRolloverTimeInSeconds": (
        limits.MIN_SEGMENT_ROLLOVER_SECONDS,
        limits.MAX_SEGMENT_ROLLOVER_SECONDS,
    ),
    "minOffloadSegmentRolloverTimeInSeconds": (0, limits.MAX_SEGMENT_ROLLOVER_SECONDS),
    "offloadRetryIntervalSeconds": (limits.MIN_RETRY_INTERVAL_SECONDS, limits.MAX_RETRY_INTERVAL_SECONDS),
    "managedLedgerOffloadMaxBlockSizeInBytes": (
        limits.MIN_MAX_BLOCK_SIZE_BYTES,
        limits.MAX_MAX_BLOCK_SIZE_BYTES,
    ),
    "managedLedgerOffloadMinBlockSizeInBytes": (
        limits.MIN_MAX_BLOCK_SIZE_BYTES,
        limits.MAX_MAX_BLOCK_SIZE_BYTES,
    ),
    "managedLedgerOffloadReadBufferSizeInBytes": (1, limits.MAX_OFFLOAD_BUFFER_BYTES),
    "managedLedgerOffloadWriteBufferSizeInBytes": (1, limits.MAX_OFFLOAD_BUFFER_BYTES),
}
MAX_TEXT = 1024  # a bucket, region, endpoint or directory; longer is a mistake
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class OffloadSettingsError(limits.SettingError):
    """An offload setting is unknown, of the wrong type or out of range (the message names it)."""


def parse(raw: object, where: str) -> dict[str, Any]:
    """Check an offload object's keys, value types and each value's range; returns it with values
    converted.

    Only each value on its own is checked here; whether the values make a working offloader together
    is ``policy``'s job (it needs the merged settings: a topic override alone may lack the driver).
    """
    if not isinstance(raw, Mapping):
        raise OffloadSettingsError(f"{where} must be an object of offload settings, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        kind = KEYS.get(key) if isinstance(key, str) else None
        if kind is None:
            raise OffloadSettingsError(
                f"{where}: unknown offload setting {str(key)[:60]!r}; "
                f"known settings: {', '.join(sorted(KEYS))}"
            )
        out[key] = _convert(value, kind, key, f"{where}: {key}")
    return out


def _convert(value: object, kind: type, key: str, what: str) -> Any:
    if kind is str:
        if not isinstance(value, str):
            raise OffloadSettingsError(f"{what} must be a string, got {type(value).__name__}")
        if len(value) > MAX_TEXT or _CONTROL.search(value):
            raise OffloadSettingsError(
                f"{what} must be at most {MAX_TEXT} characters without control characters"
            )
        return value
    low, high = BOUNDS[key]
    try:
        return limits.plain_number(
            value, kind, what, low=low, high=high, range_text=_range_text(key, low, high)
        )
    except limits.SettingError as exc:
        raise OffloadSettingsError(str(exc)) from exc


def _range_text(key: str, low: float, high: float) -> str:
    if key == "managedLedgerOffloadThresholdInBytes":
        return f"-1 (offload on demand only) or 0..{high}"
    return f"{low}..{high}"


def policy(settings: Mapping[str, Any], where: str) -> OffloadPolicy:
    """The OffloadPolicy of checked settings, or OffloadSettingsError saying what is missing or wrong."""
    config_part = {k: v for k, v in settings.items() if k in CONFIG_KEYS}
    policy_part = {k: v for k, v in settings.items() if k in POLICY_KEYS}
    low_block = settings.get("managedLedgerOffloadMinBlockSizeInBytes")
    high_block = settings.get(
        "managedLedgerOffloadMaxBlockSizeInBytes", OffloadConfig.managedLedgerOffloadMaxBlockSizeInBytes
    )
    # Only when set: the default min block (5 MiB) is capped at a smaller max block, as documented.
    if low_block is not None and low_block > high_block:
        raise OffloadSettingsError(
            f"{where}: managedLedgerOffloadMinBlockSizeInBytes={low_block} is larger than "
            f"managedLedgerOffloadMaxBlockSizeInBytes={high_block}; a block is never larger than the max, "
            "so set the min block size at most the max"
        )
    try:
        return OffloadPolicy(OffloadConfig(**config_part), **policy_part)
    except OffloadConfigError as exc:
        raise OffloadSettingsError(f"{where}: {exc}") from exc


def load(path: Path | None) -> dict[str, Any] | None:
    """The ``offload`` section of the ``--config`` file (None: no file or no section), checked.

    The file is read through server/config.py's ``load_document`` (the one JSON/YAML reader), so a
    bad file is refused the same way for every section.
    """
    try:
        raw = config.file_section(path, SECTION)
    except config.ConfigError as exc:
        raise OffloadSettingsError(str(exc)) from exc
    if raw is None:
        return None
    settings = parse(raw, f"{path}: {SECTION}")
    policy(settings, f"{path}: {SECTION}")  # a pod must not start with settings no ledger can use
    return settings
