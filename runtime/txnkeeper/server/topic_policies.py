"""Pulsar's topic policies on a store pod: retention, message TTL and backlog quotas.

Why its own module: the settings come from two places, the ``topicPolicies`` section of the pod's
``--config`` file (the store's defaults, rendered by the operator from the CR) and each topic's own
settings (``txnkeeper admin topics retention|message-ttl|backlog-quota set``, persisted in the store's
state directory so they survive restarts). Their keys, bounds and choices are declared once
(``contract/settings/topic_policies.py``, which the CRD's fragment and the docs' table come from too);
they are validated one way, with offload-policies' strict number rules
(``contract.store_settings.plain_number``), and merged one way (the topic's keys over
the pod's), into the ``topic.policies.TopicPolicies`` each partition applies at its checks. Keys are
Pulsar's: a block is exactly the body of its verb.

    {"topicPolicies": {"retention": {"retentionTimeInMinutes": 1440, "retentionSizeInMB": 10240},
                       "messageTTL": {"messageTTLInSeconds": 0},
                       "backlogQuota": {"limitSize": -1, "limitTime": -1, "policy": "producer_request_hold"},
                       "checkIntervalSeconds": 10}}
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from txnkeeper import statefile
from txnkeeper.admin.views import TopicRefusal
from txnkeeper.contract import store_settings as limits
from txnkeeper.contract.settings import topic_policies as declared
from txnkeeper.contract.settings.schema import Setting
from txnkeeper.contract.settings.topic_policies import TOPIC_POLICIES
from txnkeeper.ledger import ManagedLedgerFactory
from txnkeeper.ledger.retention import Retention
from txnkeeper.server import config
from txnkeeper.server.config import PodTopicPolicies
from txnkeeper.server.offload_topics import require_held_topic
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.policies import BacklogQuota, TopicPolicies

SECTION = TOPIC_POLICIES.name
POLICIES_FILE = "topic-policies.json"
_KIND = "topic-policies"
# admin verb -> the config section's block it sets
VERB_BLOCKS = {
    "retention": declared.RETENTION_BLOCK,
    "message-ttl": declared.MESSAGE_TTL_BLOCK,
    "backlog-quota": declared.BACKLOG_QUOTA_BLOCK,
}
_VERBS = {block: verb for verb, block in VERB_BLOCKS.items()}
# block -> its keys' declarations (contract/settings/topic_policies.py)
_BLOCK_KEYS: dict[str, dict[str, Setting]] = {b: declared.block_settings(b) for b in declared.BLOCKS}
_EXAMPLES = {
    declared.RETENTION_BLOCK: '{"retentionTimeInMinutes": 60, "retentionSizeInMB": 1024}',
    declared.MESSAGE_TTL_BLOCK: '{"messageTTLInSeconds": 3600}',
    declared.BACKLOG_QUOTA_BLOCK: (
        '{"limitSize": 10737418240, "limitTime": -1, "policy": "producer_request_hold"}'
    ),
}
_SECTION_KEYS = (*_BLOCK_KEYS, declared.CHECK_INTERVAL_KEY)


class TopicPolicySettingsError(limits.SettingError):
    """A topic policy setting is unknown, of the wrong type or out of range (the message names it)."""


def parse_block(block: str, raw: object, where: str) -> dict[str, Any]:
    """Check one block's keys and each value's type and range; returns it with values converted."""
    verb = _VERBS[block]
    if not isinstance(raw, Mapping):
        raise TopicPolicySettingsError(
            f"{where} must be an object of {verb} settings, got {type(raw).__name__}"
        )
    keys = _BLOCK_KEYS[block]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        setting = keys.get(key) if isinstance(key, str) else None
        if setting is None:
            known = ", ".join(sorted(keys))
            raise TopicPolicySettingsError(
                f"{where}: unknown {verb} setting {str(key)[:60]!r}; known settings: {known}"
            )
        out[key] = _value(setting, value, f"{where}: {key}")
    return out


def _value(setting: Setting, value: object, what: str) -> Any:
    """One value by its declaration; numbers strictly as Pulsar's properties files write them."""
    if setting.kind == "enum":
        if not isinstance(value, str):
            raise TopicPolicySettingsError(f"{what} must be a string, got {type(value).__name__}")
        if value not in setting.choices:
            raise TopicPolicySettingsError(
                f"{what} must be one of {', '.join(setting.choices)}, got {value[:40]!r}"
            )
        return value
    low, high, range_text = limits.topic_policy_bounds(setting.key.rpartition(".")[2])
    try:
        return limits.plain_number(value, int, what, low=low, high=high, range_text=range_text)
    except limits.SettingError as exc:
        raise TopicPolicySettingsError(str(exc)) from exc


def parse_section(raw: object, where: str) -> PodTopicPolicies:
    if not isinstance(raw, Mapping):
        raise TopicPolicySettingsError(f"{where} must be an object")
    blocks: dict[str, dict[str, Any]] = {}
    interval = declared.DEFAULT_CHECK_INTERVAL_SECONDS
    for key, value in raw.items():
        if key == declared.CHECK_INTERVAL_KEY:
            interval = _value(TOPIC_POLICIES.setting(key), value, f"{where}: {key}")
        elif isinstance(key, str) and key in _BLOCK_KEYS:
            blocks[key] = parse_block(key, value, f"{where}: {key}")
        else:
            raise TopicPolicySettingsError(
                f"{where}: unknown key {str(key)[:60]!r}; known keys: {', '.join(sorted(_SECTION_KEYS))}"
            )
    return PodTopicPolicies(blocks, interval)


def load(path: Path | None) -> PodTopicPolicies | None:
    """The ``topicPolicies`` section of the ``--config`` file (None: no file or no section), checked."""
    try:
        raw = config.file_section(path, SECTION)
    except config.ConfigError as exc:
        raise TopicPolicySettingsError(str(exc)) from exc
    if raw is None:
        return None
    return parse_section(raw, f"{path}: {SECTION}")


def topic_policies(blocks: Mapping[str, Mapping[str, Any]]) -> TopicPolicies:
    """What merged blocks mean for a partition (a key left out has Pulsar's default)."""
    retention = blocks.get(declared.RETENTION_BLOCK)
    ttl = blocks.get(declared.MESSAGE_TTL_BLOCK) or {}
    quota = blocks.get(declared.BACKLOG_QUOTA_BLOCK)
    return TopicPolicies(
        retention=(
            Retention(
                _scaled(retention.get("retentionTimeInMinutes", 0), 60_000),
                _scaled(retention.get("retentionSizeInMB", 0), declared.MIB),
            )
            if retention
            else None
        ),
        message_ttl_seconds=int(ttl.get("messageTTLInSeconds", 0)),
        backlog_quota=(
            BacklogQuota(
                int(quota.get("limitSize", -1)),
                int(quota.get("limitTime", -1)),
                str(quota.get("policy", declared.DEFAULT_BACKLOG_POLICY)),
            )
            if quota
            else None
        ),
    )


def _scaled(value: int, unit: int) -> int:
    return -1 if value < 0 else value * unit


class TopicPolicyStore:
    """The pod's defaults and every topic's overrides; implements admin.views.TopicPolicyView."""

    def __init__(
        self,
        pod: PodTopicPolicies | None,
        state_dir: Path,
        factory: ManagedLedgerFactory,
        topic_exists: Callable[[str], bool],
        partitions: Callable[[], Mapping[str, Partition]],
    ) -> None:
        self.pod = pod or PodTopicPolicies()
        self._path = state_dir / POLICIES_FILE
        self._factory = factory
        self._exists = topic_exists
        self._partitions = partitions
        self._overrides: dict[str, dict[str, dict[str, Any]]] = self._load()
        self._effective: dict[str, TopicPolicies] = {}
        self._lock = asyncio.Lock()

    def _load(self) -> dict[str, dict[str, dict[str, Any]]]:
        doc = statefile.read(self._path, _KIND, frozenset({1}))
        if doc is None:
            return {}
        out: dict[str, dict[str, dict[str, Any]]] = {}
        try:
            topics = statefile.obj(statefile.obj(doc.body, "body", {"topics"})["topics"], "topics")
            for topic, raw in topics.items():
                blocks = statefile.obj(raw, f"topics[{topic!r}]")
                out[topic] = {}
                for block, settings in blocks.items():
                    if block not in _BLOCK_KEYS:
                        raise statefile.StateShapeError(f"topics[{topic!r}] has an unknown block {block!r}")
                    out[topic][block] = parse_block(block, settings, f"topics[{topic!r}]: {block}")
        except (statefile.StateShapeError, TopicPolicySettingsError) as exc:
            raise statefile.StateFileError(self._path, str(exc)) from exc
        return out

    def _save(self) -> None:
        statefile.write(self._path, _KIND, 1, {"topics": self._overrides})

    def policies_of(self, topic: str) -> TopicPolicies:
        """What ``topic``'s partition applies now (cached until a verb changes it)."""
        found = self._effective.get(topic)
        if found is None:
            override = self._overrides.get(topic, {})
            merged = {
                block: {**self.pod.blocks.get(block, {}), **override.get(block, {})}
                for block in _BLOCK_KEYS
                if block in self.pod.blocks or block in override
            }
            found = self._effective[topic] = topic_policies(merged)
        return found

    # --- a shard's rows, moved with it (server/shard_moves.py) ----------------------------------------
    def rows(self, topics: set[str]) -> dict[str, dict[str, dict[str, Any]]]:
        return {t: {b: dict(v) for b, v in o.items()} for t, o in self._overrides.items() if t in topics}

    async def merge_rows(self, rows: dict[str, Any]) -> None:
        """Take the overrides of topics moved here (checked as the state file is)."""
        parsed: dict[str, dict[str, dict[str, Any]]] = {}
        for topic, raw in rows.items():
            blocks = statefile.obj(raw, f"topic policies of {topic!r}")
            parsed[topic] = {}
            for block, settings in blocks.items():
                if block not in _BLOCK_KEYS:
                    raise TopicPolicySettingsError(f"topic policies of {topic!r}: unknown block {block!r}")
                parsed[topic][block] = parse_block(block, settings, f"topic policies of {topic!r}: {block}")
        async with self._lock:
            if all(self._overrides.get(t) == o for t, o in parsed.items()):
                return
            self._overrides.update(parsed)
            for topic in parsed:
                self._effective.pop(topic, None)
            await asyncio.get_running_loop().run_in_executor(None, self._save)

    async def drop_rows(self, topics: set[str]) -> None:
        async with self._lock:
            if not any(t in self._overrides for t in topics):
                return
            self._overrides = {t: o for t, o in self._overrides.items() if t not in topics}
            for topic in topics:
                self._effective.pop(topic, None)
            await asyncio.get_running_loop().run_in_executor(None, self._save)

    # --- admin verbs -------------------------------------------------------------------------------

    def _require_topic(self, topic: str) -> None:
        require_held_topic(topic, self._factory, self._exists)

    def get(self, verb: str, topic: str) -> dict[str, Any]:
        block = VERB_BLOCKS[verb]
        if block not in self._overrides.get(topic, {}):
            self._require_topic(topic)
        pod = dict(self.pod.blocks.get(block, {}))
        override = dict(self._overrides.get(topic, {}).get(block, {}))
        answer: dict[str, Any] = {
            "topic": topic,
            "pod": pod,
            "override": override,
            "effective": {**pod, **override},
        }
        if block == declared.BACKLOG_QUOTA_BLOCK:
            partition = self._partitions().get(topic)
            answer["backlog"] = (
                {
                    "exceeded": partition.checks.backlog_exceeded is not None,
                    "reason": partition.checks.backlog_exceeded,
                    "backlogBytes": partition.policy_stats.backlog_bytes,
                    "heldSends": partition.quota.held,
                }
                if partition is not None
                else None
            )
        return answer

    async def set(self, verb: str, topic: str, settings: dict[str, Any]) -> dict[str, Any]:
        self._require_topic(topic)
        block = VERB_BLOCKS[verb]
        try:
            given = parse_block(block, settings, "body")
        except TopicPolicySettingsError as exc:
            raise TopicRefusal(400, str(exc)) from exc
        if not given:
            raise TopicRefusal(400, f"body has no {verb} setting; send e.g. {_EXAMPLES[block]}")
        async with self._lock:
            blocks = {b: dict(s) for b, s in self._overrides.get(topic, {}).items()}
            blocks[block] = {**blocks.get(block, {}), **given}
            previous = self._overrides.get(topic)
            self._overrides[topic] = blocks
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._save)
            except BaseException:
                if previous is None:
                    del self._overrides[topic]
                else:
                    self._overrides[topic] = previous
                raise
            self._effective.pop(topic, None)
        return self.get(verb, topic)

    async def remove(self, verb: str, topic: str) -> dict[str, Any]:
        block = VERB_BLOCKS[verb]
        async with self._lock:
            if block not in self._overrides.get(topic, {}):
                self._require_topic(topic)
                raise TopicRefusal(404, f"topic {topic[:200]!r} has no {verb} override to remove")
            previous = self._overrides[topic]
            remaining = {b: s for b, s in previous.items() if b != block}
            if remaining:
                self._overrides[topic] = remaining
            else:
                del self._overrides[topic]
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._save)
            except BaseException:
                self._overrides[topic] = previous
                raise
            self._effective.pop(topic, None)
        return self.get(verb, topic)


# --- metrics ---------------------------------------------------------------------------------------------


def collect(partitions: Iterable[tuple[str, Partition]]) -> Iterator[Metric]:
    """txnkeeper_topic_* families of the policies (label ``topic``)."""
    labels = ["topic"]
    checks = CounterMetricFamily("txnkeeper_topic_policy_checks", "Policy checks run", labels=labels)
    trimmed = CounterMetricFamily(
        "txnkeeper_topic_trimmed_ledgers",
        "Ledgers deleted by trimming (consumed, outside retention)",
        labels=labels,
    )
    storage = GaugeMetricFamily(
        "txnkeeper_topic_storage_bytes", "Payload bytes of the topic's live ledgers", labels=labels
    )
    backlog = GaugeMetricFamily(
        "txnkeeper_topic_backlog_bytes",
        "The largest subscription backlog (estimated payload bytes)",
        labels=labels,
    )
    exceeded = GaugeMetricFamily(
        "txnkeeper_topic_backlog_quota_exceeded",
        "1 while a subscription is over the backlog quota",
        labels=labels,
    )
    held = GaugeMetricFamily(
        "txnkeeper_topic_backlog_quota_held_sends", "Sends held by producer_request_hold", labels=labels
    )
    refused = CounterMetricFamily(
        "txnkeeper_topic_backlog_quota_refused_sends",
        "Sends refused by the backlog quota (producer_exception, or held too long)",
        labels=labels,
    )
    skips = CounterMetricFamily(
        "txnkeeper_topic_cursor_skips",
        "Cursor moves made for a subscription (message TTL, backlog eviction)",
        labels=[*labels, "reason"],
    )
    for topic, partition in partitions:
        stats = partition.policy_stats
        label = [topic]
        checks.add_metric(label, stats.checks)
        trimmed.add_metric(label, stats.trimmed_ledgers)
        storage.add_metric(label, stats.storage_bytes)
        backlog.add_metric(label, stats.backlog_bytes)
        exceeded.add_metric(label, 1 if partition.checks.backlog_exceeded is not None else 0)
        held.add_metric(label, partition.quota.held)
        refused.add_metric(label, partition.quota.refused)
        skips.add_metric([topic, "ttl"], stats.ttl_skips)
        skips.add_metric([topic, "backlog_eviction"], stats.eviction_skips)
    yield from (checks, trimmed, storage, backlog, exceeded, held, refused, skips)
