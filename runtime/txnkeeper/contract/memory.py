"""A PendingAckStore's memory settings (``spec.memory``) as the CR names them and as a store pod reads
them (``TXNKEEPER_*`` environment, the defaults of ``txnkeeper serve``'s flags).

Why here: as for the connection limits (``contract.connections``), the CRD (types, floors, the defaults
it documents), the operator (which renders the CR into the store pods' environment and reports what a
pod would refuse) and the runtime (``topic.tailcache``, whose default this is; a test holds them equal)
must agree. Only store pods keep a tail cache, so only the PendingAckStore has the section.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

from collections.abc import Mapping

from txnkeeper.contract.connections import ConnectionLimit, section_env, section_problems, table
from txnkeeper.contract.settings.connections import MEMORY

MEMORY_SECTION = MEMORY.name

MEMORY_SETTINGS: dict[str, ConnectionLimit] = table(MEMORY)  # contract/settings/connections.py


def memory_problems(spec: object) -> list[str]:
    """What a store pod would refuse in a CR's ``spec.memory`` (empty: nothing), naming the field."""
    return section_problems(MEMORY_SECTION, MEMORY_SETTINGS, spec)


def memory_env(spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """(environment variable, value) for each setting the CR sets (checked first)."""
    return section_env(MEMORY_SETTINGS, spec)
