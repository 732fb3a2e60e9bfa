"""The longest transaction timeout a coordinator grants: per process, per namespace, per topic.

Why: a transaction's first message on a topic holds back everything after it, for every
subscription, until the transaction ends (the transaction buffer's order rule, Pulsar's too), and an
open transaction ends at the latest at its timeout. So the timeout a client may ask for is how long
any client may stall a topic. Pulsar's coordinator grants whatever a client asks; Kafka's broker
refuses a transaction timeout above ``transaction.max.timeout.ms`` (15 minutes by default) and so do
we: a begin asking for more than the process maximum, or a registration of a topic whose namespace or
topic maximum is lower than the transaction's timeout, is refused with BAD_REQUEST naming the limit.
Refused rather than clamped: a client that asked for an hour and silently got fifteen minutes would
see its transaction aborted under it, later and for a reason it cannot see.

Pure: no I/O. The pod builds it from ``--max-txn-timeout-ms`` and the config file's ``transactions``
section (``server/txn_config.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from txnkeeper.contract.coordinator_settings import DEFAULT_MAX_TIMEOUT_MS, HARD_MAX_TIMEOUT_MS
from txnkeeper.errors import BadRequestError

__all__ = ["DEFAULT_MAX_TIMEOUT_MS", "HARD_MAX_TIMEOUT_MS", "TxnTimeoutPolicy", "namespace_of"]
PROCESS_SETTING = "--max-txn-timeout-ms, or transactions.maxTimeoutMs in the coordinator pod's --config"


def namespace_of(topic: str) -> str | None:
    """``tenant/namespace`` of a Pulsar topic name (``persistent://tenant/namespace/topic``); None for
    a name without one."""
    _, sep, rest = topic.partition("://")
    if not sep:
        return None
    parts = rest.split("/")
    if len(parts) < 3 or not parts[0] or not parts[1]:
        return None
    return f"{parts[0]}/{parts[1]}"


@dataclass(frozen=True)
class TxnTimeoutPolicy:
    """``max_timeout_ms`` bounds every begin; a namespace's or topic's own maximum (the topic's when
    both are set; never above the process maximum) bounds transactions that register it."""

    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS
    namespaces: Mapping[str, int] = field(default_factory=dict)
    topics: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.max_timeout_ms <= HARD_MAX_TIMEOUT_MS:
            raise ValueError(f"maximum transaction timeout must be in 1..{HARD_MAX_TIMEOUT_MS} ms")
        for kind, limits in (("namespace", self.namespaces), ("topic", self.topics)):
            for name, limit in limits.items():
                if not 1 <= limit <= self.max_timeout_ms:
                    raise ValueError(
                        f"{kind} {name!r}: maximum {limit} ms is not in 1..{self.max_timeout_ms} ms"
                        " (the process maximum)"
                    )

    def check_begin(self, timeout_ms: int) -> None:
        """Refuse a begin whose timeout is out of range or above the process maximum."""
        if timeout_ms < 1:
            raise BadRequestError(f"transaction timeout must be at least 1 ms, got {timeout_ms}")
        if timeout_ms > self.max_timeout_ms:
            raise BadRequestError(
                f"transaction timeout {timeout_ms} ms is over this coordinator's maximum of"
                f" {self.max_timeout_ms} ms ({PROCESS_SETTING}): a transaction holds back every later"
                " message of its topics until it ends; ask for a shorter timeout"
            )

    def limit_for(self, topic: str) -> tuple[int, str] | None:
        """The topic's own maximum and where it comes from, if it has one."""
        limit = self.topics.get(topic)
        if limit is not None:
            return limit, f"topic {topic}"
        namespace = namespace_of(topic) if self.namespaces else None
        if namespace is not None:
            limit = self.namespaces.get(namespace)
            if limit is not None:
                return limit, f"namespace {namespace}"
        return None

    def check_topics(self, timeout_ms: int, topics: Iterable[str]) -> None:
        """Refuse registering ``topics`` (partitions or subscriptions' topics) in a transaction whose
        timeout is above one of their maximums."""
        if not self.topics and not self.namespaces:
            return
        for topic in topics:
            found = self.limit_for(topic)
            if found is not None and timeout_ms > found[0]:
                limit, source = found
                raise BadRequestError(
                    f"transaction timeout {timeout_ms} ms is over the maximum of {limit} ms for {topic}"
                    f" (set for {source} in transactions of the coordinator pod's --config); begin a"
                    " transaction with a shorter timeout to use it"
                )
