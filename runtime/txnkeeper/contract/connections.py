"""The client protocol server's connection limits as both CRs name them (``spec.connectionLimits``) and as
a pod reads them (``TXNKEEPER_*`` environment, the defaults of ``txnkeeper serve``'s flags).

Why here: the CRD (its types, floors and the defaults it documents come from this table), the operator
(which renders the CR into the pods' environment and reports what a pod would refuse) and the runtime
(``protocol/limits.py``'s ``ConnectionLimits``, whose defaults and floors these are; a test holds them
equal) must agree. The settings themselves are declared in ``contract/settings/connections.py`` (serve
reads its flags, env and config file through that declaration); this is the table the CRD and the
operator's checks take from it. Coordinator and store pods both serve the client protocol, so both CRs
have it.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from txnkeeper.contract.settings.connections import CONNECTIONS, MAX_TIMEOUT_SECONDS
from txnkeeper.contract.settings.schema import Section

__all__ = ["MAX_TIMEOUT_SECONDS"]  # the CRD tests' ceiling of the timeouts


@dataclass(frozen=True)
class ConnectionLimit:
    """One limit: the pod's environment variable, int or float, the floor, the CR's ceiling (None:
    none), the runtime's default and what it bounds."""

    env: str
    kind: type
    minimum: float
    maximum: float | None
    default: float
    description: str

    @property
    def default_text(self) -> str:
        return number_text(self.default)


def number_text(value: float) -> str:
    """A limit as written in a message or a variable: whole numbers without a fraction."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def table(section: Section) -> dict[str, ConnectionLimit]:
    """CR field -> the limit, from a declared section of numbers (contract/settings/connections.py)."""
    return {
        s.key: ConnectionLimit(
            s.env_name or "",
            int if s.kind == "int" else float,
            s.minimum if s.minimum is not None else 0,
            s.maximum,
            s.default,
            s.description,
        )
        for s in section.settings
    }


# CR field -> the limit (serve's flag is the env name without TXNKEEPER_, lower case, dashes).
CONNECTION_LIMITS: dict[str, ConnectionLimit] = table(CONNECTIONS)


def _problem(section: str, table: Mapping[str, ConnectionLimit], field: str, value: object) -> str | None:
    limit = table[field]
    what = f"spec.{section}.{field}"
    ceiling = "" if limit.maximum is None else f"..{number_text(limit.maximum)}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{what} must be a number, got {value!r:.60}"
    if limit.kind is int and (isinstance(value, float) and not value.is_integer()):
        return f"{what} must be an integer, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{what} must be a finite number, got {value!r}"
    if value < limit.minimum or (limit.maximum is not None and value > limit.maximum):
        return f"{what} must be in {number_text(limit.minimum)}{ceiling}, got {value!r}"
    return None


def section_problems(section: str, table: Mapping[str, ConnectionLimit], spec: object) -> list[str]:
    """What a pod would refuse in a CR's ``spec.<section>``, a section of numbers rendered as the
    pods' environment by ``table`` (empty: nothing), naming the field."""
    if not isinstance(spec, Mapping):
        return [f"spec.{section} must be an object, got {type(spec).__name__}"]
    problems = []
    for field, value in spec.items():
        if field not in table:
            problems.append(f"spec.{section}.{field} is not a field; the fields are {', '.join(table)}")
        elif value is not None and (problem := _problem(section, table, field, value)) is not None:
            problems.append(problem)
    return problems


def section_env(table: Mapping[str, ConnectionLimit], spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """(environment variable, value) for each field of ``table`` the CR sets, in the table's order
    (checked first with ``section_problems``)."""
    out = []
    for field, limit in table.items():
        value = spec.get(field)
        if value is None:
            continue
        assert isinstance(value, int | float)
        out.append((limit.env, number_text(value)))
    return out


def connection_limit_problems(spec: object) -> list[str]:
    """What a pod would refuse in a CR's ``spec.connectionLimits`` (empty: nothing), naming the field."""
    return section_problems("connectionLimits", CONNECTION_LIMITS, spec)


def connection_env(spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """(environment variable, value) for each limit the CR sets (checked first with
    ``connection_limit_problems``)."""
    return section_env(CONNECTION_LIMITS, spec)
