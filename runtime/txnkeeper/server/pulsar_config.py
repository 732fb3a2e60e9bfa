"""Where Pulsar's clients are sent: the ``--pulsar-urls`` and ``--pulsar-coordinator-urls`` serve flags,
and the placement rules that answer lookups from them.

Pulsar's clients find the pod that holds a topic by asking any pod (LOOKUP), and find transaction
coordinator ``c`` by looking up partition ``c`` of ``persistent://pulsar/system/
transaction_coordinator_assign``. So every pod must know the pods' addresses as clients reach them:
``pulsar://<host>:<port>`` of each store pod and of each coordinator pod, in ordinal order (the
operator fills them with the pods' DNS names behind their headless Services). A topic is held by the
store pod txnkeeper's own clients place it on (crc32 of its name over the store pods), so both
protocols meet on the same pod; coordinator ``c`` lives on coordinator pod ``c mod pods`` (the
``--coordinator-ids auto`` rule). The port of those URLs serves txnkeeper's own protocol too, so the
same addresses reach the pods over it (a store pod asking a coordinator to register a partition).
Without the flags a pod answers lookups with its own address (one pod of each role, a local run).

Partitioned topics come from the config file's ``pulsar`` section, the same on every pod (the
operator renders it from the CR): ``{"pulsar": {"partitionedTopics": {"persistent://t/ns/orders": 4}}}``.
Pulsar's clients then use ``persistent://t/ns/orders-partition-0`` .. ``-partition-3``, each a topic of
its own placed like any other; the base name itself is refused for producers and consumers, as a
Pulsar broker refuses it.

Why its own module: like ``txn_config``, self-contained settings with their own validation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit

from txnkeeper.server.config import ConfigError, env, file_section
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.topicnames import name_problem

SECTION = "pulsar"
MAX_PARTITIONS = 10_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pulsar-urls",
        default=env("PULSAR_URLS"),
        help="comma-separated pulsar://host:port of every store pod in ordinal order: what Pulsar"
        " lookups of topics answer (default: this pod's own address)",
    )
    parser.add_argument(
        "--pulsar-coordinator-urls",
        default=env("PULSAR_COORDINATOR_URLS"),
        help="comma-separated pulsar://host:port of every coordinator pod in ordinal order: where Pulsar"
        " clients find transaction coordinators, and store pods register their transactions",
    )


def placement(ns: argparse.Namespace, config: Path | None = None) -> PulsarPlacement:
    return PulsarPlacement(
        _urls(ns.pulsar_urls, "--pulsar-urls (or TXNKEEPER_PULSAR_URLS)"),
        _urls(ns.pulsar_coordinator_urls, "--pulsar-coordinator-urls (or TXNKEEPER_PULSAR_COORDINATOR_URLS)"),
        ns.coordinators if ns.coordinators is not None else 1,
        partitioned_topics(config),
    )


def partitioned_topics(config: Path | None) -> dict[str, int]:
    section = file_section(config, SECTION) or {}
    unknown = sorted(set(section) - {"partitionedTopics"})
    if unknown:
        raise ConfigError(
            f"{config}: section {SECTION}: unknown key(s) {unknown}; it holds partitionedTopics"
        )
    topics = section.get("partitionedTopics", {})
    where = f"{config}: {SECTION}.partitionedTopics"
    if not isinstance(topics, dict):
        raise ConfigError(f"{where} must map topic names to partition counts")
    out: dict[str, int] = {}
    for topic, count in topics.items():
        problem = name_problem("topic", topic)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        if "-partition-" in topic:
            raise ConfigError(f"{where}: {topic!r} is itself a partition's name; give the base name")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
            raise ConfigError(
                f"{where}: {topic} has {count!r} partitions; give an integer 1..{MAX_PARTITIONS}"
            )
        out[topic] = count
    return out


def _urls(text: str | None, flag: str) -> tuple[str, ...]:
    if text is None or not text.strip():
        return ()
    urls = tuple(part.strip() for part in text.split(","))
    for url in urls:
        problem = url_problem(url)
        if problem is not None:
            raise ConfigError(f"{flag}: {problem}")
    return urls


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a Pulsar service URL of one pod (None: it is)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc}); give pulsar://host:port"
    if parts.scheme != "pulsar" or not parts.hostname or port is None:
        return f"{url!r} is not pulsar://host:port"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"{url!r} has more than pulsar://host:port"
    return None
