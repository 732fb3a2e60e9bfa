"""Which pod serves what, as Pulsar's clients are told (server/pulsar_config.py says where the URLs
come from): a topic's store pod by the own clients' rule (crc32 of its name over the store pods),
coordinator ``c`` on coordinator pod ``c mod pods``. A module of its own so that ``ServeConfig`` can
hold it without importing the flag parsing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

TC_ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
_PARTITION = "-partition-"


@dataclass(frozen=True)
class PulsarPlacement:
    """Which pod serves what, as Pulsar's clients are told (module docstring)."""

    store_urls: tuple[str, ...] = ()
    coordinator_urls: tuple[str, ...] = ()
    coordinators: int = 1  # coordinator ids 0..coordinators-1 exist
    # Partitioned topics (Pulsar's): base name -> partitions, each "<base>-partition-<i>" a topic of
    # its own, placed like any other.
    partitioned: dict[str, int] = field(default_factory=dict)

    def partitions(self, topic: str) -> int:
        """What PARTITIONED_METADATA answers for ``topic``: its partitions, 0 if not partitioned."""
        if topic == TC_ASSIGN_TOPIC:
            return self.coordinators
        return self.partitioned.get(topic, 0)

    def store_url(self, topic: str, own: str) -> str:
        urls = self.store_urls
        return urls[zlib.crc32(topic.encode()) % len(urls)] if urls else own

    def coordinator_url(self, coordinator: int, own: str) -> str:
        urls = self.coordinator_urls
        return urls[coordinator % len(urls)] if urls else own

    def store_address(self, topic: str) -> str | None:
        """host:port of the store pod holding ``topic`` (None: no --pulsar-urls)."""
        return address_of(self.store_url(topic, "")) if self.store_urls else None

    def coordinator_address(self, coordinator: int) -> str | None:
        return address_of(self.coordinator_url(coordinator, "")) if self.coordinator_urls else None


def coordinator_partition(topic: str) -> int | None:
    """The coordinator id a lookup of the coordinator-assign topic's partition names (None: another
    topic). The bare assign topic (not a partition) reads as coordinator 0."""
    if topic == TC_ASSIGN_TOPIC:
        return 0
    if not topic.startswith(TC_ASSIGN_TOPIC + _PARTITION):
        return None
    suffix = topic[len(TC_ASSIGN_TOPIC + _PARTITION) :]
    if not suffix.isascii() or not suffix.isdigit() or len(suffix) > 9:
        return None
    return int(suffix)


def address_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def tls_url(url: str) -> str:
    """``url`` as a Pulsar client on TLS names it: pulsar+ssl:// on the same host and port."""
    scheme, sep, rest = url.partition("://")
    return f"pulsar+ssl://{rest}" if sep and scheme == "pulsar" else url
