"""Operator-wide settings, read once from the environment (the chart's Deployment sets them).

Kept apart from the handlers so tests and the local control plane can build them explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if env is None else env
        default = cls()
        namespaces = tuple(n.strip() for n in env.get("TXNKEEPER_NAMESPACES", "").split(",") if n.strip())
        return cls(
            image=env.get("TXNKEEPER_IMAGE", default.image),
            verifier_image=env.get("TXNKEEPER_VERIFIER_IMAGE", default.verifier_image),
            image_pull_policy=env.get("TXNKEEPER_IMAGE_PULL_POLICY", default.image_pull_policy),
            reconcile_seconds=float(env.get("TXNKEEPER_RECONCILE_SECONDS", default.reconcile_seconds)),
            admin_timeout_seconds=float(
                env.get("TXNKEEPER_ADMIN_TIMEOUT_SECONDS", default.admin_timeout_seconds)
            ),
            namespaces=namespaces,
        )
