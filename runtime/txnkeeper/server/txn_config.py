"""Settings of a coordinator pod's transaction timeouts: the config file's ``transactions`` section and
the ``--max-txn-timeout-ms`` serve flag (flag > environment > file > default).

```json
"transactions": {"maxTimeoutMs": 900000,
                 "namespaces": {"tenant/ns": {"maxTimeoutMs": 60000}},
                 "topics": {"persistent://tenant/ns/topic": {"maxTimeoutMs": 30000}}}
```
Why its own module: like ``srk_config``, one self-contained block with its own validation; the rules
themselves are ``coordinator/timeouts.py``'s. Store pods accept the section (one file may serve both
roles) and use none of it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from txnkeeper.contract.coordinator_settings import MAX_TIMEOUT_KEY, TRANSACTIONS_SECTION
from txnkeeper.coordinator.timeouts import HARD_MAX_TIMEOUT_MS, TxnTimeoutPolicy
from txnkeeper.server.config import ConfigError, env, file_section
from txnkeeper.topicnames import name_problem

SECTION = TRANSACTIONS_SECTION  # TransactionCoordinator.spec.transactions renders into it
_LIMIT_KEY = MAX_TIMEOUT_KEY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-txn-timeout-ms",
        type=int,
        default=env("MAX_TXN_TIMEOUT_MS"),
        help=f"longest transaction timeout a begin may ask for (config {SECTION}.{_LIMIT_KEY};"
        " default 900000, 15 minutes); longer ones are refused",
    )


def _bounded(value: object, what: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigError(f"{what} must be an integer in 1..{high}, got {value!r}")
    return value


def _limits(raw: object, where: str, kind: str, process_max: int) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be an object of {kind} name -> {{{_LIMIT_KEY!r}: ms}}")
    limits: dict[str, int] = {}
    for name, entry in raw.items():
        problem = name_problem("topic", name) if kind == "topic" else None
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        if kind == "namespace":
            tenant, sep, namespace = name.partition("/")
            if not sep or not tenant or not namespace or "/" in namespace:
                raise ConfigError(f"{where}: namespace {name[:40]!r} is not TENANT/NAMESPACE")
        at = f"{where}.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be an object {{{_LIMIT_KEY!r}: ms}}")
        unknown = sorted(set(entry) - {_LIMIT_KEY})
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {unknown}; known: [{_LIMIT_KEY!r}]")
        if _LIMIT_KEY not in entry:
            raise ConfigError(f"{at} needs {_LIMIT_KEY!r}")
        limit = _bounded(entry[_LIMIT_KEY], f"{at}.{_LIMIT_KEY}", HARD_MAX_TIMEOUT_MS)
        if limit > process_max:
            raise ConfigError(
                f"{at}.{_LIMIT_KEY} {limit} ms is above the process maximum of {process_max} ms: a"
                f" {kind} may only lower it (raise --max-txn-timeout-ms or {SECTION}.{_LIMIT_KEY})"
            )
        limits[name] = limit
    return limits


def txn_timeouts(ns: argparse.Namespace, path: Path | None) -> TxnTimeoutPolicy:
    """The policy from the config file's section, its process maximum overridden by the flag."""
    where = f"{path}: {SECTION}"
    raw: dict[str, Any] = file_section(path, SECTION) or {}
    unknown = sorted(set(raw) - {_LIMIT_KEY, "namespaces", "topics"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {[_LIMIT_KEY, 'namespaces', 'topics']}")
    process_max = TxnTimeoutPolicy().max_timeout_ms
    if _LIMIT_KEY in raw:
        process_max = _bounded(raw[_LIMIT_KEY], f"{where}.{_LIMIT_KEY}", HARD_MAX_TIMEOUT_MS)
    if ns.max_txn_timeout_ms is not None:
        process_max = _bounded(ns.max_txn_timeout_ms, "--max-txn-timeout-ms", HARD_MAX_TIMEOUT_MS)
    namespaces = _limits(raw.get("namespaces", {}), f"{where}.namespaces", "namespace", process_max)
    topics = _limits(raw.get("topics", {}), f"{where}.topics", "topic", process_max)
    return TxnTimeoutPolicy(process_max, namespaces, topics)
