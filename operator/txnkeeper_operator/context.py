"""What a reconcile works with: the Kubernetes API, the pods' admin API, settings, Events, a clock.

Its own module because both reconcile.py (the rollout) and scaling.py (placement) take it, and
scaling must not import reconcile (reconcile calls scaling).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from txnkeeper.contract.admin import AdminClient
from txnkeeper_operator.kube import KubeApi
from txnkeeper_operator.podtls import ClientTlsCache
from txnkeeper_operator.settings import OperatorSettings


class EventSink(Protocol):
    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


@dataclass
class Context:
    kube: KubeApi
    admin: AdminClient
    settings: OperatorSettings
    events: EventSink
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    # The operator's client certificates, per namespace (podtls.py).
    client_tls: ClientTlsCache = field(default_factory=ClientTlsCache)
