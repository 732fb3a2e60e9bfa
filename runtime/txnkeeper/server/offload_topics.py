"""PIP-76 offload of a store pod's topic ledgers: settings per topic, the admin verbs, the metrics.

Why its own module: the pod's ``offload`` settings and each topic's overrides (``offload-policies
set``, persisted in the store's state directory so they survive restarts) meet here, merged one way
(the topic's keys over the pod's), and the admin verbs reach a topic's Offloader through it, keeping
pod.py to wiring. Only topic ledgers offload; pending-ack and transaction logs never do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from txnkeeper import statefile
from txnkeeper.admin.views import OffloadRefusal, TopicRefusal
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.ledger.managed_ledger import ManagedLedger
from txnkeeper.ledger.offload import OffloadConfig, OffloadConfigError, OffloadError
from txnkeeper.ledger.offload.offloader import Offloader, OffloadPolicy
from txnkeeper.server import offload_settings
from txnkeeper.server.offload_settings import OffloadSettingsError
from txnkeeper.topicnames import name_problem

POLICIES_FILE = "offload-policies.json"
_KIND = "offload-policies"


class TopicOffloads:
    """Implements admin.views.TopicOffloadView for one store pod."""

    def __init__(
        self,
        pod_settings: dict[str, Any] | None,
        state_dir: Path,
        factory: ManagedLedgerFactory,
        topic_exists: Callable[[str], bool],
    ) -> None:
        self._pod = dict(pod_settings or {})
        self._path = state_dir / POLICIES_FILE
        self._factory = factory
        self._exists = topic_exists
        self._overrides: dict[str, dict[str, Any]] = self._load()
        self._lock = asyncio.Lock()

    # --- settings -----------------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        doc = statefile.read(self._path, _KIND, frozenset({1}))
        if doc is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        try:
            topics = statefile.obj(statefile.obj(doc.body, "body", {"topics"})["topics"], "topics")
            for topic, raw in topics.items():
                out[topic] = offload_settings.parse(raw, f"topics[{topic!r}]")
        except (statefile.StateShapeError, OffloadSettingsError) as exc:
            raise statefile.StateFileError(self._path, str(exc)) from exc
        return out

    def _save(self) -> None:
        statefile.write(self._path, _KIND, 1, {"topics": self._overrides})

    def effective(self, topic: str) -> dict[str, Any] | None:
        override = self._overrides.get(topic)
        if not self._pod and not override:
            return None
        return {**self._pod, **(override or {})}

    def tier_of(self, override: dict[str, Any] | None) -> OffloadConfig | None:
        """The tier a topic with these overrides would read from on this pod (None: no offload
        settings here; OffloadSettingsError: settings that cannot be used)."""
        settings = {**self._pod, **(override or {})}
        if not settings:
            return None
        return offload_settings.policy(settings, "offload").config

    def tiers(self) -> list[OffloadConfig]:
        """The tiers this pod's settings name (its own and any topic override's): where its data
        can have been offloaded, so the only ones a restore may name."""
        found = []
        for settings in [self._pod, *(self.effective(t) for t in self._overrides)]:
            if settings:
                with contextlib.suppress(OffloadSettingsError):  # an unusable override holds no data
                    found.append(offload_settings.policy(settings, "offload").config)
        return found

    def ledger_config(self, topic: str) -> ManagedLedgerConfig:
        """The config a topic's managed ledger opens with (offload per the merged settings)."""
        settings = self.effective(topic)
        if settings is None:
            return ManagedLedgerConfig()
        try:
            return ManagedLedgerConfig(offload=offload_settings.policy(settings, f"offload of {topic}"))
        except OffloadSettingsError:
            # Checked when set; a pod config changed since may not fit an old override: the override
            # goes unused (logged by the admin verbs' answers), the topic stays writable.
            return ManagedLedgerConfig()

    # --- admin verbs -------------------------------------------------------------------------------

    def _require_topic(self, topic: str) -> None:
        require_held_topic(topic, self._factory, self._exists)

    async def _ledger(self, topic: str) -> ManagedLedger:
        self._require_topic(topic)
        ledger = self._factory.opened(topic)
        if ledger is not None:
            return ledger
        return await self._factory.open(topic, self.ledger_config(topic))

    async def _offloader(self, topic: str) -> Offloader:
        off = (await self._ledger(topic)).offloader
        if off is None:
            raise OffloadRefusal(
                409,
                f"offload is not configured for topic {topic!r}: give the pod an 'offload' section in its "
                "--config, or set a driver and location with `txnkeeper admin topics offload-policies set`",
            )
        return off

    async def offload(self, topic: str) -> dict[str, Any]:
        off = await self._offloader(topic)
        try:
            done = await off.offload()
        except (OffloadError, OSError) as exc:
            raise OffloadRefusal(
                503,
                f"offload of {topic!r} failed: {exc}; the segment is recorded Failed and retried "
                f"every {off.policy.offloadRetryIntervalSeconds:g} s; nothing acknowledged is lost",
            ) from exc
        return {"topic": topic, "offloaded": [s.to_json() for s in done], **off.status()}

    async def status(self, topic: str) -> dict[str, Any]:
        off = await self._offloader(topic)
        return {"topic": topic, **off.status()}

    async def segments(self, topic: str) -> dict[str, Any]:
        off = await self._offloader(topic)
        return {"topic": topic, "segments": [s.to_json() for s in off.segments()]}

    async def internal_stats(self, topic: str) -> dict[str, Any]:
        ledger = await self._ledger(topic)
        return {"managedLedgerName": topic, "managedLedgerInternalStats": ledger.internal_stats()}

    def policies(self, topic: str) -> dict[str, Any]:
        if topic not in self._overrides:
            self._require_topic(topic)
        return {
            "topic": topic,
            "pod": dict(self._pod),
            "override": dict(self._overrides.get(topic, {})),
            "effective": self.effective(topic) or {},
        }

    # --- a shard's rows, moved with it (server/shard_moves.py) ----------------------------------------
    def rows(self, topics: set[str]) -> dict[str, dict[str, Any]]:
        return {t: dict(o) for t, o in self._overrides.items() if t in topics}

    async def merge_rows(self, rows: dict[str, Any]) -> None:
        """Take the overrides of topics moved here (checked as the state file is)."""
        parsed = {t: offload_settings.parse(raw, f"offload overrides of {t!r}") for t, raw in rows.items()}
        async with self._lock:
            if all(self._overrides.get(t) == o for t, o in parsed.items()):
                return
            self._overrides.update(parsed)
            await asyncio.get_running_loop().run_in_executor(None, self._save)

    async def drop_rows(self, topics: set[str]) -> None:
        async with self._lock:
            if not any(t in self._overrides for t in topics):
                return
            self._overrides = {t: o for t, o in self._overrides.items() if t not in topics}
            await asyncio.get_running_loop().run_in_executor(None, self._save)

    async def set_policies(self, topic: str, settings: dict[str, Any]) -> dict[str, Any]:
        self._require_topic(topic)
        try:
            given = offload_settings.parse(settings, "body")
        except OffloadSettingsError as exc:
            raise OffloadRefusal(400, str(exc)) from exc
        if not given:
            raise OffloadRefusal(400, 'body has no offload setting; send e.g. {"offloadMode": "ledger"}')
        async with self._lock:
            override = {**self._overrides.get(topic, {}), **given}
            merged = {**self._pod, **override}
            try:
                pol = offload_settings.policy(merged, f"offload of {topic}")
            except OffloadSettingsError as exc:
                raise OffloadRefusal(400, str(exc)) from exc
            await self._apply(topic, pol)
            self._overrides[topic] = override
            await asyncio.get_running_loop().run_in_executor(None, self._save)
        return self.policies(topic)

    async def remove_policies(self, topic: str) -> dict[str, Any]:
        if not topic:
            raise OffloadRefusal(400, "query parameter 'topic' is required")
        async with self._lock:
            if topic not in self._overrides:
                # (An override of a topic the pod does not hold, persisted by an earlier release that
                # did not check, can still be removed.)
                self._require_topic(topic)
                raise OffloadRefusal(404, f"topic {topic!r} has no offload-policies override to remove")
            ledger = self._factory.opened(topic)
            if ledger is not None and ledger.offloader is not None:
                if self._pod:
                    pol = offload_settings.policy(self._pod, "the pod's offload settings")
                else:
                    # Segments stay readable: the store is kept, automatic offload stops (Pulsar's -1).
                    pol = OffloadPolicy(ledger.offloader.policy.config)
                await self._apply(topic, pol)
            del self._overrides[topic]
            await asyncio.get_running_loop().run_in_executor(None, self._save)
        return self.policies(topic)

    async def _apply(self, topic: str, pol: OffloadPolicy) -> None:
        ledger = self._factory.opened(topic)
        if ledger is None:
            return  # applied when the topic opens
        try:
            ledger.set_offload_policy(pol)
        except OffloadConfigError as exc:
            raise OffloadRefusal(409, str(exc)) from exc

    # --- metrics -----------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Pulsar's brk_ledgeroffloader_* families (labels namespace, topic) and txnkeeper's gauges."""
        labels = ["namespace", "topic"]
        counters = {
            name: CounterMetricFamily(f"brk_ledgeroffloader_{name}", help_text, labels=labels)
            for name, help_text in (
                ("offload_error", "Segment uploads that failed"),
                ("read_offload_error", "Reads from the tier that failed"),
                ("write_storage_error", "Blob-store writes and deletes that failed"),
                ("delete_offload_ops", "Segments whose objects were deleted"),
            )
        }
        rates = {
            name: GaugeMetricFamily(f"brk_ledgeroffloader_{name}", help_text, labels=labels)
            for name, help_text in (
                ("offload_rate", "Bytes offloaded per second since the previous scrape"),
                ("read_offload_rate", "Bytes read from the tier per second since the previous scrape"),
            )
        }
        summaries = {
            name: SummaryMetricFamily(f"brk_ledgeroffloader_{name}", help_text, labels=labels)
            for name, help_text in (
                ("read_ledger_latency", "Reads of offloaded entries, microseconds"),
                ("read_offload_index_latency", "Index fetches of a read (cached or not), microseconds"),
                ("read_offload_data_latency", "Block reads of a read, microseconds"),
            )
        }
        lag = GaugeMetricFamily(
            "txnkeeper_offload_lag_bytes", "Local bytes no Offloaded segment holds yet", labels=labels
        )
        segments = GaugeMetricFamily(
            "txnkeeper_offload_segments", "Offload segments by status", labels=[*labels, "status"]
        )
        unreadable = GaugeMetricFamily(
            "txnkeeper_offload_unreadable_segments",
            "Segments (or ranges no segment holds) whose tier data the last read could not read",
            labels=labels,
        )
        for ledger in self._factory.open_ledgers():
            off = ledger.offloader
            if off is None:
                continue
            label = [_namespace(ledger.name), ledger.name]
            stats = off.stats
            for name, family in counters.items():
                family.add_metric(label, getattr(stats, name))
            offload_rate, read_rate = stats.rates()
            rates["offload_rate"].add_metric(label, offload_rate)
            rates["read_offload_rate"].add_metric(label, read_rate)
            for name, summary_family in summaries.items():
                summary = getattr(stats, name)
                summary_family.add_metric(label, summary.count, summary.sum_us)
            unreadable.add_metric(label, len(off.unreadable))
            with contextlib.suppress(Exception):  # a scrape never fails because one ledger is closing
                lag.add_metric(label, off.lag_bytes())
                for status, count in off.segment_counts().items():
                    segments.add_metric([*label, status], count)
        yield from counters.values()
        yield from rates.values()
        yield from summaries.values()
        yield from (lag, segments, unreadable)

    def unreadable(self) -> list[dict[str, Any]]:
        """Tier data the open topics' offloaders could not read (the pod's offload summary)."""
        return [
            {"topic": ledger.name, **failure.to_json()}
            for ledger in self._factory.open_ledgers()
            if ledger.offloader is not None
            for failure in ledger.offloader.unreadable.failures()
        ]


def require_held_topic(topic: str, factory: ManagedLedgerFactory, exists: Callable[[str], bool]) -> None:
    """Refuse (404) a name that is not a topic this pod holds: nothing is opened, created or persisted
    for it, whatever it is (a path, a name with NUL or newline, a pending-ack log's). The one rule of
    every topic verb (offload and topic policies)."""
    if not topic:
        raise TopicRefusal(400, "query parameter 'topic' is required (e.g. persistent://public/default/t)")
    problem = name_problem("topic", topic)
    if problem is not None:
        raise TopicRefusal(404, f"{problem}; no topic of this pod has such a name")
    if factory.opened(topic) is None and not exists(topic):
        raise TopicRefusal(404, f"topic {topic[:200]!r} is not on this pod; ask the pod that holds it")


def _namespace(topic: str) -> str:
    """persistent://tenant/ns/topic -> tenant/ns (Pulsar's namespace label)."""
    rest = topic.split("://", 1)[-1]
    parts = rest.split("/")
    return "/".join(parts[:2]) if len(parts) >= 3 else "unknown"
