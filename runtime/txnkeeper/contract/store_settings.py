"""The PendingAckStore's store settings: ``spec.singleKeyTransactions``
(PDP-44) and ``spec.topicPolicies`` (Pulsar's retention, message TTL and backlog quotas), in the CR's
spelling and in the pod ``--config`` file's, and the one strict reading of a number in them.

Why here: the CRD (its limits and CEL rules are generated from these constants), the operator (which
renders a CR into the config file) and the runtime (which reads the file) must agree on names, limits
and defaults, as for batched writes (``contract.batching``). ``spec.offload`` is declared in
``contract/settings/offload.py``. Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from txnkeeper.contract.formats import Feature
from txnkeeper.contract.settings.single_key import (
    SRK_DEFAULT_MAX_BLOCK_BYTES,
    SRK_DEFAULT_MAX_WRITERS_PER_TOPIC,
    SRK_DEFAULT_WRITER_INACTIVITY_MINUTES,
    SRK_MAX_BLOCK_BYTES,
    SRK_MAX_MAX_WRITERS_PER_TOPIC,
    SRK_MAX_WRITER_INACTIVITY_MINUTES,
)
from txnkeeper.contract.settings.topic_policies import (
    BACKLOG_POLICIES,
    CHECK_INTERVAL_KEY,
    DEFAULT_BACKLOG_POLICY,
    DEFAULT_CHECK_INTERVAL_SECONDS,
    MAX_CHECK_INTERVAL_SECONDS,
    MIN_CHECK_INTERVAL_SECONDS,
    TOPIC_POLICIES,
    TOPIC_POLICIES_SECTION,
)

# Declared in contract/settings/; the operator, the runtime and the tests have long taken them from here.
__all__ = [
    "BACKLOG_POLICIES",
    "CHECK_INTERVAL_KEY",
    "DEFAULT_BACKLOG_POLICY",
    "DEFAULT_CHECK_INTERVAL_SECONDS",
    "MAX_CHECK_INTERVAL_SECONDS",
    "MIN_CHECK_INTERVAL_SECONDS",
    "SRK_DEFAULT_MAX_BLOCK_BYTES",
    "SRK_DEFAULT_MAX_WRITERS_PER_TOPIC",
    "SRK_DEFAULT_WRITER_INACTIVITY_MINUTES",
    "SRK_MAX_BLOCK_BYTES",
    "SRK_MAX_MAX_WRITERS_PER_TOPIC",
    "SRK_MAX_WRITER_INACTIVITY_MINUTES",
    "TOPIC_POLICIES_SECTION",
]

MIB = 1024 * 1024
JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1

# ---- numbers ------------------------------------------------------------------------------------------
# Decimal text as Pulsar's properties write numbers: ASCII digits only (int() would take "١٢٣", " 12 ",
# "1_0"), one optional leading '-', no '+', no exponent, no leading zeros.
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})(?:\.[0-9]{1,18})?")


class SettingError(ValueError):
    """A setting's value is of the wrong type, not plain decimal, or out of range (names it)."""


def plain_number(value: object, kind: type, what: str, *, low: float, high: float, range_text: str) -> Any:
    """``value`` (a JSON number, or decimal text as in Pulsar's properties files) as ``kind`` (int or
    float), within ``low..high``; else ``SettingError`` naming ``what``, the range and the value.

    Strict where ``int()``/``float()`` are lenient: no booleans, no non-ASCII digits, no spaces, no
    exponent or '+', no leading zeros, no negative zero, nothing beyond 64 bits.
    """
    if isinstance(value, bool):
        raise SettingError(f"{what} must be a number, got a boolean")
    if isinstance(value, str):
        if (_INT_TEXT if kind is int else _NUMBER_TEXT).fullmatch(value) is None:
            raise SettingError(
                f"{what}={value[:40]!r} is not {_a(kind)} in plain decimal (ASCII digits 0-9, an optional "
                "leading '-', no spaces" + (")" if kind is int else ", '.' for a fraction, no exponent)")
            )
        if value.startswith("-") and float(value) == 0:
            raise SettingError(f"{what}={value!r} is a negative zero; write 0")
        value = int(value) if kind is int else float(value)
    if kind is int:
        given = value  # what an error shows: 1e308 as written, not its 309 digits
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or abs(value) > JAVA_LONG_MAX:
            shown = type(given).__name__ if isinstance(given, list | dict) else repr(given)
            if not isinstance(value, int | float):
                raise SettingError(f"{what} must be a number, got {shown}")
            raise SettingError(f"{what} must be an integer that fits 64 bits, got {shown}")
    elif not isinstance(value, int | float) or not math.isfinite(value):
        shown = type(value).__name__ if isinstance(value, list | dict) else repr(value)
        raise SettingError(f"{what} must be a finite number, got {shown}")
    elif value == 0 and math.copysign(1.0, value) < 0:
        raise SettingError(f"{what} is a negative zero; write 0")
    else:
        value = float(value)
    if not low <= value <= high:
        raise SettingError(f"{what} must be {range_text}, got {value!r}")
    return value


def _a(kind: type) -> str:
    return "an integer" if kind is int else "a number"


# ---- single-key transactions --------------------------------------------------------------------------

SRK_KEYS = ("enabled", "maxBlockBytes", "writerInactivityMinutes", "maxWritersPerTopic")


def single_key_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config file's ``singleKeyTransactions`` section (same key names as the CR)."""
    return {key: spec[key] for key in SRK_KEYS if key in spec and spec[key] is not None}


# ---- topic policies (Pulsar's retention, message TTL and backlog quotas) -----------------------------

# The section, its blocks and bounds are declared in contract/settings/topic_policies.py; these are the
# tables the operator's rendering and checks of a CR, and the pod's reader, take from it.
# numeric key (its name in its block) -> (lowest, highest, the range in words)
TOPIC_POLICY_BOUNDS: dict[str, tuple[int, int, str]] = {
    s.key.rpartition(".")[2]: (int(s.minimum or 0), int(s.maximum or 0), s.range_text or "")
    for s in TOPIC_POLICIES.settings
    if s.kind == "int"
}


def _target(key: str) -> tuple[str | None, str]:
    block, _, name = key.rpartition(".")
    return block or None, name


# CR field (spec.topicPolicies) -> config-file block (None: the section itself) and key. The CR spells
# units out; the file and the admin verbs use Pulsar's names.
TOPIC_POLICY_FIELDS: dict[str, tuple[str | None, str]] = {
    cr: _target(s.key) for cr, s in TOPIC_POLICIES.keys("cr").items()
}


def topic_policy_bounds(key: str) -> tuple[int, int, str]:
    """(lowest, highest, the range in words) of a numeric key of the ``topicPolicies`` section."""
    return TOPIC_POLICY_BOUNDS[key]


def topic_policy_problems(spec: object) -> list[str]:
    """What a store pod would refuse in a CR's ``spec.topicPolicies`` (empty: nothing), each naming the
    CR field: the CRD refuses all of it at admission; the operator checks again what reaches it anyway
    (an object admitted under an older CRD), because a pod refuses a bad config file and does not
    start."""
    where = f"spec.{TOPIC_POLICIES_SECTION}"
    if not isinstance(spec, Mapping):
        return [f"{where} must be an object, got {type(spec).__name__}"]
    problems = []
    for field, value in spec.items():
        what = f"{where}.{field}"
        target = TOPIC_POLICY_FIELDS.get(field) if isinstance(field, str) else None
        if target is None:
            problems.append(f"{what} is not a field; the fields are {', '.join(TOPIC_POLICY_FIELDS)}")
        elif value is None:
            continue
        elif target[1] == "policy":
            if value not in BACKLOG_POLICIES:
                problems.append(f"{what} must be one of {', '.join(BACKLOG_POLICIES)}, got {value!r:.60}")
        elif isinstance(value, str):
            problems.append(f"{what} must be an integer, got the string {value!r:.60}")
        else:
            low, high, text = topic_policy_bounds(target[1])
            try:
                plain_number(value, int, what, low=low, high=high, range_text=text)
            except SettingError as exc:
                problems.append(str(exc))
    return problems


def topic_policies_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config file's ``topicPolicies`` section for a CR's ``spec.topicPolicies`` (only the fields
    it sets; an empty section when it sets none)."""
    out: dict[str, Any] = {}
    for field, (block, key) in TOPIC_POLICY_FIELDS.items():
        value = spec.get(field)
        if value is None:
            continue
        if block is None:
            out[key] = value
        else:
            out.setdefault(block, {})[key] = value
    return out


# ---- release gating -----------------------------------------------------------------------------------

# spec field -> the feature it needs; a section counts as "used" per ``used``.
GATED_SECTIONS: dict[str, Feature] = {
    "offload": Feature.OFFLOAD_SEGMENTS,
    "singleKeyTransactions": Feature.SINGLE_KEY_TRANSACTIONS,
}


def used(section: str, spec: Mapping[str, Any]) -> bool:
    """Whether a gated section is switched on: ``offload`` by a driver and ``enabled`` (default
    true), ``singleKeyTransactions`` by ``enabled: true``."""
    value = spec.get(section)
    if not isinstance(value, Mapping):
        return False
    if section == "offload":
        return bool(value.get("driver")) and value.get("enabled", True) is not False
    return bool(value.get("enabled"))


def configured(section: str, spec: Mapping[str, Any]) -> bool:
    """Whether a section must reach pods that can use it: ``offload`` whenever it names a driver
    (disabled, it still says where offloaded data lives), others when used."""
    value = spec.get(section)
    if section == "offload":
        return isinstance(value, Mapping) and bool(value.get("driver"))
    return used(section, spec)
