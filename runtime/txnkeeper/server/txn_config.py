"""Settings of a coordinator pod's transaction timeouts: the config file's ``transactions`` section and
the ``--max-txn-timeout-ms`` serve flag (flag > environment > file > default).

```json
"transactions": {"maxTimeoutMs": 900000,
                 "namespaces": {"tenant/ns": {"maxTimeoutMs": 60000}},
                 "topics": {"persistent://tenant/ns/topic": {"maxTimeoutMs": 30000}}}
```
The settings, their bounds and their errors are the declaration's (``contract/settings/transactions.py``,
which the CRD's fields are generated from too); this module binds it to ``serve``'s flag and reads the
two name -> limit maps, checking each limit through the declaration. The rules themselves are
``coordinator/timeouts.py``'s. Store pods accept the section (one file may serve both roles) and use
none of it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.transactions import ENTRY_MAX_TIMEOUT, MAX_TIMEOUT, TRANSACTIONS
from txnkeeper.coordinator.timeouts import TxnTimeoutPolicy
from txnkeeper.server.config import ConfigError, file_section
from txnkeeper.topicnames import name_problem

SECTION = TRANSACTIONS.name  # TransactionCoordinator.spec.transactions renders into it
_LIMIT_KEY = MAX_TIMEOUT.key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    schema.add_flags(parser, TRANSACTIONS)


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
        try:
            limit: int = ENTRY_MAX_TIMEOUT.check(entry[_LIMIT_KEY], f"{at}.{_LIMIT_KEY}")
        except schema.SettingValueError as exc:
            raise ConfigError(str(exc)) from exc
        if limit > process_max:
            raise ConfigError(
                f"{at}.{_LIMIT_KEY} {limit} ms is above the process maximum of {process_max} ms: a"
                f" {kind} may only lower it (raise {MAX_TIMEOUT.flag} or {SECTION}.{_LIMIT_KEY})"
            )
        limits[name] = limit
    return limits


def txn_timeouts(ns: argparse.Namespace, path: Path | None) -> TxnTimeoutPolicy:
    """The policy from the config file's section, its process maximum overridden by env and flag."""
    where = f"{path}: {SECTION}"
    raw: dict[str, Any] = file_section(path, SECTION) or {}
    try:
        loaded = schema.load(TRANSACTIONS, flags=vars(ns), environ=os.environ, file=raw, file_where=where)
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc
    process_max: int = loaded.values[MAX_TIMEOUT.field]
    namespaces = _limits(raw.get("namespaces", {}), f"{where}.namespaces", "namespace", process_max)
    topics = _limits(raw.get("topics", {}), f"{where}.topics", "topic", process_max)
    return TxnTimeoutPolicy(process_max, namespaces, topics)
