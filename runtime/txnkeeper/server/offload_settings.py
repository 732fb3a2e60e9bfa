"""The ``offload`` section of a store pod's ``--config`` file, and per-topic overrides, under Pulsar's keys.

Why its own module: offload settings come from two places (the pod's config file and a topic's
``offload-policies set``) and must be validated the same way and merged one way (the topic's keys over
the pod's). Keys are Pulsar's broker.conf / OffloadPolicies names, plus ours where Pulsar has none
(``offloadMode``, ``offloadRetryIntervalSeconds``); values may be JSON numbers or, as in Pulsar's
properties files, decimal strings. Every mistake is an ``OffloadSettingsError`` naming the key. The
keys, their types, bounds and defaults are declared once in ``contract/settings/offload.py`` (which
the CRD's fields and the docs' table come from too); this module reads values strictly and checks them
together.

    {"offload": {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "/offload",
                 "managedLedgerOffloadThresholdInBytes": 0, "offloadMode": "streaming"}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txnkeeper.contract import store_settings as limits
from txnkeeper.contract.settings import offload as declared
from txnkeeper.contract.settings.offload import OFFLOAD
from txnkeeper.contract.settings.schema import Setting
from txnkeeper.ledger.offload import OffloadConfig, OffloadConfigError
from txnkeeper.ledger.offload.offloader import OffloadPolicy
from txnkeeper.server import config

SECTION = OFFLOAD.name
# The keys, their types and bounds are the declaration's (contract/settings/offload.py).
KEYS: dict[str, Setting] = OFFLOAD.keys()
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
        setting = KEYS.get(key) if isinstance(key, str) else None
        if setting is None:
            raise OffloadSettingsError(
                f"{where}: unknown offload setting {str(key)[:60]!r}; "
                f"known settings: {', '.join(sorted(KEYS))}"
            )
        out[key] = _convert(value, setting, f"{where}: {key}")
    return out


def _convert(value: object, setting: Setting, what: str) -> Any:
    if setting.kind == "text":
        if not isinstance(value, str):
            raise OffloadSettingsError(f"{what} must be a string, got {type(value).__name__}")
        if len(value) > declared.MAX_TEXT or _CONTROL.search(value):
            raise OffloadSettingsError(
                f"{what} must be at most {declared.MAX_TEXT} characters without control characters"
            )
        return value
    low, high = declared.bounds(setting)
    kind = int if setting.kind == "int" else float
    try:
        return limits.plain_number(
            value, kind, what, low=low, high=high, range_text=declared.range_text(setting)
        )
    except limits.SettingError as exc:
        raise OffloadSettingsError(str(exc)) from exc


def policy(settings: Mapping[str, Any], where: str) -> OffloadPolicy:
    """The OffloadPolicy of checked settings, or OffloadSettingsError saying what is missing or wrong."""
    config_part = {k: v for k, v in settings.items() if k not in declared.POLICY_KEYS}
    policy_part = {k: v for k, v in settings.items() if k in declared.POLICY_KEYS}
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
