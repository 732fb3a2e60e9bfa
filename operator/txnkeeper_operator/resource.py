"""A custom resource as the operator reads it: the spec with its defaults, and the engine's view of it.

The API server applies the CRD's defaults, but the operator must not misbehave on an object stored
before a default existed, so every read goes through here with the same defaults as crds/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txnkeeper_operator import naming
from txnkeeper_operator.engine import BatchSettings, Desired
from txnkeeper_operator.naming import KINDS, PAUSE_ANNOTATION, Kind


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Kind
    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    annotations: Mapping[str, str]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Resource:
        kind = next(k for k in KINDS if k.kind == body["kind"])
        meta = body["metadata"]
        return cls(
            kind=kind,
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=int(meta.get("generation") or 0),
            spec=body.get("spec") or {},
            annotations=meta.get("annotations") or {},
        )

    @property
    def replicas(self) -> int:
        return int(self.spec.get("replicas", 3))

    @property
    def version(self) -> str:
        return str(self.spec["version"])

    @property
    def coordinators(self) -> int:
        return int(self.spec.get("coordinators", 16))

    @property
    def paused(self) -> bool:
        return str(self.annotations.get(PAUSE_ANNOTATION, "")).lower() == "true"

    @property
    def batch(self) -> BatchSettings:
        return BatchSettings.from_block(self.spec.get("batchedWrite") or {})

    @property
    def pulsar_peer(self) -> str | None:
        """The resource of the other kind whose pods Pulsar's clients are sent to from this one's
        (``spec.pulsar.transactionCoordinator`` of a store, ``spec.pulsar.pendingAckStore`` of a
        coordinator), in the same namespace; None when not set."""
        key = "pendingAckStore" if self.kind is naming.TRANSACTION_COORDINATOR else "transactionCoordinator"
        value = self.section("pulsar").get(key)
        return str(value) if value else None

    @property
    def pulsar_peer_kind(self) -> Kind:
        return (
            naming.PENDING_ACK_STORE
            if self.kind is naming.TRANSACTION_COORDINATOR
            else naming.TRANSACTION_COORDINATOR
        )

    def section(self, key: str) -> Mapping[str, Any]:
        value = self.spec.get(key) or {}
        return value if isinstance(value, Mapping) else {}

    @property
    def maintenance_windows(self) -> tuple[str, ...]:
        raw = self.spec.get("maintenanceWindows") or []
        return tuple(str(w) for w in raw) if isinstance(raw, list) else ()

    def desired(self) -> Desired:
        return Desired(self.version, self.replicas, self.batch, self.maintenance_windows)

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{naming.GROUP}/{naming.API_VERSION}",
            "kind": self.kind.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
