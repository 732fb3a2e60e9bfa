"""The TransactionCoordinator's ``spec.transactions`` (the longest transaction timeout a coordinator
grants, per process, namespace and topic) in the CR's spelling and in the pod ``--config`` file's.

Why here: the CRD (its limits are generated from these constants), the operator (which renders the CR
into the config file and reports what a pod would refuse) and the runtime (``coordinator/timeouts.py``
holds the rule, ``server/txn_config.py`` reads the file) must agree on names and limits, as for batched
writes (``contract.batching``). The CR lists namespaces and topics as named entries (Kubernetes' lists
of named subobjects, validated per entry); the file keys them by name, as the runtime reads them.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from txnkeeper.contract.names import name_problem

TRANSACTIONS_SECTION = "transactions"
MAX_TIMEOUT_KEY = "maxTimeoutMs"
LIMITED_KINDS = ("namespaces", "topics")
# No transaction may ask for more than a day, whatever is configured (the coordinator's hard limit).
HARD_MAX_TIMEOUT_MS = 24 * 3600 * 1000
DEFAULT_MAX_TIMEOUT_MS = 15 * 60 * 1000  # Kafka's transaction.max.timeout.ms
# Entries a CR may list per kind: bounds the API server's cost estimate of the rules over them, and the
# config file (a ConfigMap holds 1 MiB; a topic name is at most 2 KiB).
MAX_LIMITED_NAMES = 256
# TENANT/NAMESPACE, as server/txn_config.py checks it.
NAMESPACE_PATTERN = r"^[^/]+/[^/]+$"
MAX_NAMESPACE_NAME = 512


def transactions_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config file's ``transactions`` section for a CR's ``spec.transactions`` (only what it sets)."""
    out: dict[str, Any] = {}
    if spec.get(MAX_TIMEOUT_KEY) is not None:
        out[MAX_TIMEOUT_KEY] = spec[MAX_TIMEOUT_KEY]
    for kind in LIMITED_KINDS:
        entries = spec.get(kind) or []
        if entries:
            out[kind] = {entry["name"]: {MAX_TIMEOUT_KEY: entry[MAX_TIMEOUT_KEY]} for entry in entries}
    return out


def _timeout_problem(value: object, what: str, high: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        return f"{what} must be an integer in 1..{high} (ms), got {value!r:.60}"
    return None


def transactions_problems(spec: object) -> list[str]:
    """What a coordinator pod would refuse in a CR's ``spec.transactions`` (empty: nothing), each naming
    the CR field (the CRD refuses it at admission; the operator checks what reaches it anyway)."""
    where = f"spec.{TRANSACTIONS_SECTION}"
    if not isinstance(spec, Mapping):
        return [f"{where} must be an object, got {type(spec).__name__}"]
    problems = []
    unknown = sorted(str(k) for k in spec if k not in (MAX_TIMEOUT_KEY, *LIMITED_KINDS))
    if unknown:
        problems.append(
            f"{where} has no field(s) {', '.join(unknown)}; the fields are maxTimeoutMs, namespaces, topics"
        )
    process_max = DEFAULT_MAX_TIMEOUT_MS
    if spec.get(MAX_TIMEOUT_KEY) is not None:
        problem = _timeout_problem(spec[MAX_TIMEOUT_KEY], f"{where}.{MAX_TIMEOUT_KEY}", HARD_MAX_TIMEOUT_MS)
        if problem is not None:
            problems.append(problem)
        else:
            process_max = spec[MAX_TIMEOUT_KEY]
    for kind in LIMITED_KINDS:
        entries = spec.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, list):
            problems.append(
                f"{where}.{kind} must be a list of {{name, maxTimeoutMs}}, got {type(entries).__name__}"
            )
            continue
        if len(entries) > MAX_LIMITED_NAMES:
            problems.append(f"{where}.{kind} lists {len(entries)} entries, more than {MAX_LIMITED_NAMES}")
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            at = f"{where}.{kind}[{index}]"
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                problems.append(f"{at} must be an object with a name and maxTimeoutMs")
                continue
            name = entry["name"]
            problem = _name_problem(kind, name)
            if problem is not None:
                problems.append(f"{at}.name: {problem}")
            elif name in seen:
                problems.append(f"{where}.{kind} names {name!r:.80} twice")
            seen.add(name)
            limit = entry.get(MAX_TIMEOUT_KEY)
            problem = _timeout_problem(limit, f"{at}.{MAX_TIMEOUT_KEY}", HARD_MAX_TIMEOUT_MS)
            if problem is not None:
                problems.append(problem)
            elif isinstance(limit, int) and limit > process_max:
                problems.append(
                    f"{at}.{MAX_TIMEOUT_KEY} {limit} ms is above {where}.{MAX_TIMEOUT_KEY}"
                    f" ({process_max} ms): a {kind[:-1]} may only lower the process maximum"
                )
    return problems


def _name_problem(kind: str, name: str) -> str | None:
    if kind == "topics":
        return name_problem("topic", name)
    if len(name) > MAX_NAMESPACE_NAME or re.fullmatch(NAMESPACE_PATTERN, name) is None:
        return f"namespace {name[:60]!r} is not TENANT/NAMESPACE (at most {MAX_NAMESPACE_NAME} characters)"
    return None
