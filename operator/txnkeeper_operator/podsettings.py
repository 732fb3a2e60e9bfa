"""Pod settings every release reads, as the operator renders and reports them: a PendingAckStore's
``spec.topicPolicies`` and a TransactionCoordinator's ``spec.transactions`` (sections of the pod config
file), both kinds' ``spec.connectionLimits`` and a PendingAckStore's ``spec.memory`` (the pod's
environment).

Why a module: the ConfigMap, the StatefulSet's env and the SettingsValid condition must ask the same
question of the same rules (``txnkeeper.contract``: the runtime's own limits). The CRD refuses every
value a pod would refuse at admission; what reaches the operator anyway (an object stored under an
older CRD, a field written around the schema) is left out of the pods, since a pod handed a value it
refuses exits at start and would stay down, and reported by a False condition naming the field. Pods
read these settings when they start: a change reaches a pod at its next restart. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txnkeeper.contract import connections, coordinator_settings, memory, store_settings
from txnkeeper_operator import naming, tlsspec
from txnkeeper_operator.engine import Condition, ConditionStatus
from txnkeeper_operator.resource import Resource

# spec field -> (the kind whose pods read it, what a pod would refuse in it)
_CHECKS: dict[str, tuple[naming.Kind | None, Callable[[object], list[str]]]] = {
    store_settings.TOPIC_POLICIES_SECTION: (naming.PENDING_ACK_STORE, store_settings.topic_policy_problems),
    coordinator_settings.TRANSACTIONS_SECTION: (
        naming.TRANSACTION_COORDINATOR,
        coordinator_settings.transactions_problems,
    ),
    "connectionLimits": (None, connections.connection_limit_problems),
    memory.MEMORY_SECTION: (naming.PENDING_ACK_STORE, memory.memory_problems),
    "tls": (None, tlsspec.problems),
}


def _problems(cr: Resource) -> dict[str, list[str]]:
    """The sections this kind reads that the spec sets, and what is wrong with each."""
    out = {}
    for field, (kind, check) in _CHECKS.items():
        if (kind is None or cr.kind is kind) and cr.spec.get(field) is not None:
            out[field] = check(cr.spec[field])
    return out


def _valid(cr: Resource, field: str) -> bool:
    return _problems(cr).get(field) == []


def config_sections(cr: Resource) -> dict[str, Any]:
    """The pod config file's sections for the settings the spec sets and a pod would accept."""
    out: dict[str, Any] = {}
    if _valid(cr, store_settings.TOPIC_POLICIES_SECTION):
        section = store_settings.topic_policies_config(cr.section(store_settings.TOPIC_POLICIES_SECTION))
        if section:
            out[store_settings.TOPIC_POLICIES_SECTION] = section
    if _valid(cr, coordinator_settings.TRANSACTIONS_SECTION):
        section = coordinator_settings.transactions_config(
            cr.section(coordinator_settings.TRANSACTIONS_SECTION)
        )
        if section:
            out[coordinator_settings.TRANSACTIONS_SECTION] = section
    return out


def connection_env(cr: Resource) -> list[dict[str, Any]]:
    """The pod's environment for the connection limits the spec sets (all or none: see the module)."""
    if not _valid(cr, "connectionLimits"):
        return []
    return [
        {"name": name, "value": value}
        for name, value in connections.connection_env(cr.section("connectionLimits"))
    ]


def memory_env(cr: Resource) -> list[dict[str, Any]]:
    """A store pod's environment for the memory settings the spec sets (all or none, as above)."""
    if cr.kind is not naming.PENDING_ACK_STORE or not _valid(cr, memory.MEMORY_SECTION):
        return []
    return [
        {"name": name, "value": value} for name, value in memory.memory_env(cr.section(memory.MEMORY_SECTION))
    ]


def settings_condition(cr: Resource) -> Condition:
    """SettingsValid: False (InvalidSettings) while a section holds a value its pods would refuse."""
    problems = [p for found in _problems(cr).values() for p in found]
    if problems:
        return Condition(
            "SettingsValid",
            ConditionStatus.FALSE,
            "InvalidSettings",
            "; ".join(problems[:10])
            + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
            + " (the section is left out of the pods' config until it is fixed)",
        )
    return Condition(
        "SettingsValid", ConditionStatus.TRUE, "Valid", "every pod setting of the spec is one the pods accept"
    )
