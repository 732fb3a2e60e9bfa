"""Settings of single-routing-key transactions (PDP-44): the config file's ``singleKeyTransactions``
section and the ``--srk-*`` serve flags (flag > environment > file > default).

Why its own module: the section is one self-contained block the operator renders from
``PendingAckStore.spec.singleKeyTransactions``; keeping its parsing apart lets the rest of the runtime
configuration evolve without touching it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from txnkeeper.contract import store_settings
from txnkeeper.server.config import ConfigError, env, file_section
from txnkeeper.topic.writers import SingleKeySettings

SECTION = "singleKeyTransactions"
# section key -> (SingleKeySettings field, minimum, maximum)
_KEYS: dict[str, tuple[str, int, int]] = {
    "maxBlockBytes": ("max_block_bytes", 1, store_settings.SRK_MAX_BLOCK_BYTES),  # PDP-44: at most 16 MiB
    "writerInactivityMinutes": (
        "writer_inactivity_minutes",
        1,
        store_settings.SRK_MAX_WRITER_INACTIVITY_MINUTES,
    ),
    "maxWritersPerTopic": ("max_writers_per_topic", 1, store_settings.SRK_MAX_MAX_WRITERS_PER_TOPIC),
}
_FLAGS = {
    "maxBlockBytes": "srk_max_block_bytes",
    "writerInactivityMinutes": "srk_writer_inactivity_minutes",
    "maxWritersPerTopic": "srk_max_writers_per_topic",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--srk-enabled",
        choices=("true", "false"),
        default=env("SRK_ENABLED"),
        help=f"serve single-routing-key transactions (config {SECTION}.enabled; default false)",
    )
    parser.add_argument(
        "--srk-max-block-bytes",
        type=int,
        default=env("SRK_MAX_BLOCK_BYTES"),
        help="largest block a writer may append (default 16 MiB)",
    )
    parser.add_argument(
        "--srk-writer-inactivity-minutes",
        type=int,
        default=env("SRK_WRITER_INACTIVITY_MINUTES"),
        help="a writer idle this long is forgotten (default 10080, 7 days)",
    )
    parser.add_argument(
        "--srk-max-writers-per-topic",
        type=int,
        default=env("SRK_MAX_WRITERS_PER_TOPIC"),
        help="writers (and idempotent producers) a topic remembers, per principal when clients"
        " authenticate (default 10000)",
    )


def section_settings(section: object, where: str) -> dict[str, Any]:
    """The section's values as SingleKeySettings keyword arguments (validated)."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be an object with keys enabled, {', '.join(_KEYS)}")
    unknown = sorted(set(section) - {"enabled", *_KEYS})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {['enabled', *_KEYS]}")
    values: dict[str, Any] = {}
    if "enabled" in section:
        if not isinstance(section["enabled"], bool):
            raise ConfigError(f"{where}.enabled must be true or false, got {section['enabled']!r}")
        values["enabled"] = section["enabled"]
    for key, (name, low, high) in _KEYS.items():
        if key in section:
            values[name] = _bounded(section[key], f"{where}.{key}", low, high)
    return values


def _bounded(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{what} must be an integer in {low}..{high}, got {value!r}")
    return value


def single_key_settings(ns: argparse.Namespace, path: Path | None) -> SingleKeySettings:
    """Settings from the config file's section, overridden by the flags (or their environment)."""
    values: dict[str, Any] = {}
    raw = file_section(path, SECTION)
    if raw is not None:
        values = section_settings(raw, f"{path}: {SECTION}")
    if ns.srk_enabled is not None:
        if ns.srk_enabled not in ("true", "false"):
            raise ConfigError(f"--srk-enabled must be true or false, got {ns.srk_enabled!r}")
        values["enabled"] = ns.srk_enabled == "true"
    for key, attribute in _FLAGS.items():
        flag = getattr(ns, attribute)
        if flag is not None:
            name, low, high = _KEYS[key]
            values[name] = _bounded(flag, "--" + attribute.replace("_", "-"), low, high)
    return SingleKeySettings(**values)
