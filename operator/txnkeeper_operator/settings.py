"""Operator-wide settings, read once from the environment (the chart's Deployment sets them).

Kept apart from the handlers so tests and the local fleet can build them explicitly. A wrong
value stops the operator at start with a message naming the variable, rather than pods failing later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

_PULL_POLICIES = ("Always", "IfNotPresent", "Never")


class OperatorSettingsError(ValueError):
    """An operator environment variable is wrong (the message names it and what it accepts)."""


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    # Image of the runtime pods when a resource does not name one.
    image: str = "ghcr.io/txnkeeper/txnkeeper:2.0.0"
    # Image of the verifier Job (the Dockerfile's verifier target: the runtime plus Java and PySpark).
    verifier_image: str = "ghcr.io/txnkeeper/txnkeeper-verifier:2.0.0"
    image_pull_policy: str = "IfNotPresent"
    # Level-based reconcile period; every decision is recomputed from scratch, so this only bounds
    # how soon the operator notices a pod becoming ready.
    reconcile_seconds: float = 3.0
    admin_timeout_seconds: float = 5.0
    # Namespaces to watch; empty: the whole cluster.
    namespaces: tuple[str, ...] = ()
    # Whether a resource without spec.tls.enabled serves TLS: the chart sets it from its value
    # tls.enabled (default true); unset (an operator run by hand, tests, the local fleet): false.
    tls_default: bool = False

    def __post_init__(self) -> None:
        for name, image in (
            ("TXNKEEPER_IMAGE", self.image),
            ("TXNKEEPER_VERIFIER_IMAGE", self.verifier_image),
        ):
            if not image or any(c.isspace() for c in image):
                raise OperatorSettingsError(f"{name} must be a container image reference, got {image!r}")
        if self.image_pull_policy not in _PULL_POLICIES:
            raise OperatorSettingsError(
                f"TXNKEEPER_IMAGE_PULL_POLICY must be one of {', '.join(_PULL_POLICIES)},"
                f" got {self.image_pull_policy!r}"
            )
        for name, seconds in (
            ("TXNKEEPER_RECONCILE_SECONDS", self.reconcile_seconds),
            ("TXNKEEPER_ADMIN_TIMEOUT_SECONDS", self.admin_timeout_seconds),
        ):
            if not math.isfinite(seconds) or not 0 < seconds <= 300:
                raise OperatorSettingsError(f"{name} must be a number of seconds in (0, 300], got {seconds}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        default = cls()
        namespaces = tuple(n.strip() for n in env.get("TXNKEEPER_NAMESPACES", "").split(",") if n.strip())
        return cls(
            image=env.get("TXNKEEPER_IMAGE", default.image),
            verifier_image=env.get("TXNKEEPER_VERIFIER_IMAGE", default.verifier_image),
            image_pull_policy=env.get("TXNKEEPER_IMAGE_PULL_POLICY", default.image_pull_policy),
            reconcile_seconds=_seconds(env, "TXNKEEPER_RECONCILE_SECONDS", default.reconcile_seconds),
            admin_timeout_seconds=_seconds(
                env, "TXNKEEPER_ADMIN_TIMEOUT_SECONDS", default.admin_timeout_seconds
            ),
            namespaces=namespaces,
            tls_default=_flag(env, "TXNKEEPER_OPERATOR_TLS_DEFAULT", default.tls_default),
        )


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise OperatorSettingsError(f"{name} must be true or false, got {text!r}")
    return value == "true"


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise OperatorSettingsError(f"{name} must be a number of seconds, got {text!r}") from None
