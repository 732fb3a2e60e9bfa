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

The settings, their checks and their errors are the declaration's (``contract/settings/pulsar.py``);
this module binds them to ``serve``'s flags and reads the partitioned topics.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from txnkeeper.contract.settings import schema
from txnkeeper.contract.settings.pulsar import PARTITIONS, PULSAR
from txnkeeper.server.config import ConfigError, file_section
from txnkeeper.server.pulsar_placement import PulsarPlacement
from txnkeeper.topicnames import name_problem

SECTION = PULSAR.name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    schema.add_flags(parser, PULSAR)


def placement(ns: argparse.Namespace, config: Path | None = None) -> PulsarPlacement:
    raw = file_section(config, SECTION)
    try:
        loaded = schema.load(
            PULSAR, flags=vars(ns), environ=os.environ, file=raw, file_where=f"{config}: {SECTION}"
        )
    except schema.SettingValueError as exc:
        raise ConfigError(str(exc)) from exc
    return PulsarPlacement(
        _urls(loaded.values["store_urls"]),
        _urls(loaded.values["coordinator_urls"]),
        ns.coordinators if ns.coordinators is not None else 1,
        partitioned_topics(config),
    )


def partitioned_topics(config: Path | None) -> dict[str, int]:
    section = file_section(config, SECTION) or {}
    try:
        schema.parse(PULSAR, section, f"{config}: section {SECTION}")
    except schema.SettingValueError as exc:
        raise ConfigError(f"{exc} (the section holds partitionedTopics)") from exc
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
        try:
            out[topic] = PARTITIONS.check(count, f"{where}: {topic}: partitions")
        except schema.SettingValueError as exc:
            raise ConfigError(str(exc)) from exc
    return out


def _urls(text: str | None) -> tuple[str, ...]:
    # Checked by the declaration's format already: split only.
    if text is None or not text.strip():
        return ()
    return tuple(part.strip() for part in text.split(","))


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a Pulsar service URL of one pod (None: it is)."""
    return schema.pulsar_url_problem(url)
