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

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
_MAX_DIGITS = 19  # fits a Java long; longer text is a mistake, not a size


class OffloadSettingsError(ValueError):
    """An offload setting is unknown, of the wrong type or out of range (the message names it)."""


def parse(raw: object, where: str) -> dict[str, Any]:
    """Check an offload object's keys and value types; returns it with values converted.

    Only the form is checked here; whether the values make a working offloader is ``policy``'s job
    (it needs the merged settings: a topic override alone may lack the driver).
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
        out[key] = _convert(value, kind, f"{where}: {key}")
    return out


def _convert(value: object, kind: type, what: str) -> Any:
    if kind is str:
        if not isinstance(value, str):
            raise OffloadSettingsError(f"{what} must be a string, got {type(value).__name__}")
        return value
    if isinstance(value, bool):
        raise OffloadSettingsError(f"{what} must be a number, got a boolean")
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > _MAX_DIGITS + 8:
            raise OffloadSettingsError(f"{what}={text[:40]!r} is not a number")
        try:
            value = int(text) if kind is int else float(text)
        except ValueError:
            raise OffloadSettingsError(f"{what}={text[:40]!r} is not {_a(kind)}") from None
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or abs(value) >= 2**63:
            raise OffloadSettingsError(f"{what} must be an integer that fits 64 bits, got {value!r}")
        return value
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise OffloadSettingsError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _a(kind: type) -> str:
    return "an integer" if kind is int else "a number"


def policy(settings: Mapping[str, Any], where: str) -> OffloadPolicy:
    """The OffloadPolicy of checked settings, or OffloadSettingsError saying what is missing or wrong."""
    config_part = {k: v for k, v in settings.items() if k in CONFIG_KEYS}
    policy_part = {k: v for k, v in settings.items() if k in POLICY_KEYS}
    try:
        return OffloadPolicy(OffloadConfig(**config_part), **policy_part)
    except OffloadConfigError as exc:
        raise OffloadSettingsError(f"{where}: {exc}") from exc


def load(path: Path | None) -> dict[str, Any] | None:
    """The ``offload`` section of the ``--config`` file (None: no file or no section), checked.

    The file is read through server/config.py's ``load_document`` (the one JSON/YAML reader), so a
    bad file is refused the same way for every section.
    """
    if path is None:
        return None
    try:
        raw = config.section(config.load_document(path), SECTION, path)
    except config.ConfigError as exc:
        raise OffloadSettingsError(str(exc)) from exc
    if raw is None:
        return None
    settings = parse(raw, f"{path}: {SECTION}")
    policy(settings, f"{path}: {SECTION}")  # a pod must not start with settings no ledger can use
    return settings
