"""Planning a read of topics: which ranges of which ledgers, one Spark partition per ledger or segment.

Why pure: what a read returns is decided here, from the store's read state (contracts §5, ``GET
/admin/v1/topics/read-state``), so it can be tested without Spark. A ledger whose local file the pod
still holds is read through the pod's admin API (``PodPart``, in bounded ranges); a ledger only the
tier holds is read from its Offloaded segments straight from the blob store (``TierPart``, one per
segment: a segment may hold parts of several ledgers). Nothing past the upper bound is planned: with
``committedOnly`` that is the max read position (just before the first message of any open
transaction), as for a consumer; without it, the last durable entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from txnkeeper.ledger.position import Position
from txnkeeper.txnid import TxnID

BEFORE_ALL = Position(-1, -1)
MAX_REQUEST_ENTRIES = 10_000
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class ReadOptionError(ValueError):
    """An option of ``spark.read.format("txnkeeper")`` is missing or wrong (names it)."""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    topics: tuple[str, ...]
    admin_urls: tuple[str, ...]
    offload: dict[str, Any] | None = None
    start: Position | None = None  # inclusive
    end: Position | None = None  # inclusive
    min_publish_ms: int | None = None
    max_publish_ms: int | None = None
    committed_only: bool = True
    request_entries: int = 1_000
    request_bytes: int = 4 * 1024 * 1024
    timeout_s: float = 30.0
    starting: str = "earliest"  # streaming: where a new query starts


OPTION_NAMES = (
    "topic", "topics", "adminUrl", "adminUrls", "offload", "startPosition", "endPosition",
    "startPublishTime", "endPublishTime", "committedOnly", "maxEntriesPerRequest",
    "maxBytesPerRequest", "timeout", "startingPosition", "path",
)  # fmt: skip


def parse_options(options: dict[str, str]) -> ReadOptions:
    """Options as Spark passes them (keys are case-insensitive there: compared lower-cased here)."""
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - {name.lower() for name in OPTION_NAMES})
    if unknown:
        raise ReadOptionError(f"unknown option(s) {unknown}; see README 'Reading topics from Spark'")
    topics = _list(opts.get("topics", "")) + _list(opts.get("topic", "")) + _list(opts.get("path", ""))
    if not topics:
        raise ReadOptionError("give the topic to read: .option('topic', 'persistent://public/default/t')")
    urls = _list(opts.get("adminurls", "")) + _list(opts.get("adminurl", ""))
    if not urls:
        raise ReadOptionError("give the store pods' admin API: .option('adminUrl', 'http://host:8081')")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ReadOptionError(f"adminUrl {url!r} is not an http:// or https:// URL")
    offload = None
    if opts.get("offload"):
        try:
            offload = json.loads(opts["offload"])
        except ValueError as exc:
            raise ReadOptionError(f"option 'offload' is not JSON: {exc}") from None
        if not isinstance(offload, dict):
            raise ReadOptionError("option 'offload' must be a JSON object of Pulsar offload keys")
    committed = opts.get("committedonly", "true").strip().lower()
    if committed not in ("true", "false"):
        raise ReadOptionError(f"option 'committedOnly' must be true or false, got {committed!r}")
    starting = opts.get("startingposition", "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise ReadOptionError(f"option 'startingPosition' must be earliest or latest, got {starting!r}")
    return ReadOptions(
        topics=tuple(dict.fromkeys(topics)),
        admin_urls=tuple(urls),
        offload=offload,
        start=_position(opts, "startPosition"),
        end=_position(opts, "endPosition"),
        min_publish_ms=_time(opts, "startPublishTime"),
        max_publish_ms=_time(opts, "endPublishTime"),
        committed_only=committed == "true",
        request_entries=_int(opts, "maxEntriesPerRequest", 1_000, MAX_REQUEST_ENTRIES),
        request_bytes=_int(opts, "maxBytesPerRequest", 4 * 1024 * 1024, MAX_REQUEST_BYTES),
        timeout_s=float(_int(opts, "timeout", 30, 3600)),
        starting=starting,
    )


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _position(opts: dict[str, str], key: str) -> Position | None:
    text = opts.get(key.lower())
    if text is None:
        return None
    try:
        position = Position.parse(text.strip())
    except ValueError as exc:
        raise ReadOptionError(f"option {key!r}: {exc}") from None
    if position.ledger_id < 0 or position.entry_id < 0:
        raise ReadOptionError(f"option {key!r}: ledger and entry ids are >= 0, got {text!r}")
    return position


def _time(opts: dict[str, str], key: str) -> int | None:
    """Milliseconds since the epoch, or an ISO-8601 time (with a zone)."""
    text = opts.get(key.lower())
    if text is None:
        return None
    text = text.strip()
    if text.isascii() and text.isdecimal():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ReadOptionError(
            f"option {key!r} must be milliseconds since the epoch or an ISO-8601 time, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise ReadOptionError(f"option {key!r}: give the time zone (e.g. {text}+00:00)")
    return int(moment.timestamp() * 1000)


def _int(opts: dict[str, str], key: str, default: int, most: int) -> int:
    text = opts.get(key.lower())
    if text is None:
        return default
    if not (text.isascii() and text.isdecimal()) or not 1 <= int(text) <= most:
        raise ReadOptionError(f"option {key!r} must be an integer in 1..{most}, got {text!r}")
    return int(text)


# ---- the plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicView:
    """What the executors need to judge a topic's entries (from its read state)."""

    topic: str
    admin_url: str
    aborted: frozenset[TxnID]
    open: frozenset[TxnID]
    max_read: Position | None
    last_confirmed: Position | None


@dataclass(frozen=True, slots=True)
class PodPart:
    """Entries ``first..last`` of one ledger, read through the pod's admin API."""

    view: TopicView
    ledger_id: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class TierPart:
    """The ranges one Offloaded segment holds of tier-only ledgers: (ledger, first, last) each."""

    view: TopicView
    uuid: str
    ranges: tuple[tuple[int, int, int], ...] = field(default=())


Part = PodPart | TierPart


def topic_view(topic: str, admin_url: str, state: dict[str, Any]) -> TopicView:
    def position(text: object) -> Position | None:
        return Position.parse(str(text)) if text is not None else None

    return TopicView(
        topic,
        admin_url,
        frozenset(TxnID(int(m), int(s)) for m, s in state["abortedTxns"]),
        frozenset(TxnID(int(m), int(s)) for m, s in state.get("openTxns", [])),
        position(state["maxReadPosition"]),
        position(state.get("lastConfirmedEntry")),
    )


def upper_bound(view: TopicView, committed_only: bool) -> Position | None:
    return view.max_read if committed_only else view.last_confirmed


def plan_topic(view: TopicView, state: dict[str, Any], low: Position, high: Position | None) -> list[Part]:
    """The parts reading entries ``low..high`` (inclusive; None: nothing) of the topic."""
    if high is None or high < low:
        return []
    segments = [s for s in state.get("segments", []) if s.get("status") == "Offloaded" and s.get("end")]
    parts: list[Part] = []
    tier: dict[str, list[tuple[int, int, int]]] = {}
    for item in state["ledgers"]:
        ledger_id, entries = int(item["ledgerId"]), int(item["entries"])
        first = max(0, low.entry_id) if ledger_id == low.ledger_id else 0
        last = min(entries - 1, high.entry_id) if ledger_id == high.ledger_id else entries - 1
        if ledger_id < low.ledger_id or ledger_id > high.ledger_id or first > last:
            continue
        if not item.get("tierOnly"):
            parts.append(PodPart(view, ledger_id, first, last))
            continue
        covered = first
        for seg in sorted(segments, key=lambda s: Position.parse(s["begin"])):
            begin, end = Position.parse(seg["begin"]), Position.parse(seg["end"])
            seg_first = (
                begin.entry_id if begin.ledger_id == ledger_id else 0 if begin.ledger_id < ledger_id else None
            )
            seg_last = (
                end.entry_id if end.ledger_id == ledger_id else last if end.ledger_id > ledger_id else None
            )
            if seg_first is None or seg_last is None:
                continue
            a, b = max(first, seg_first, covered), min(last, seg_last)
            if a > b:
                continue
            if a != covered:
                break
            tier.setdefault(str(seg["uuid"]), []).append((ledger_id, a, b))
            covered = b + 1
        if covered <= last:
            raise ReadOptionError(
                f"entries {ledger_id}:{covered}..{last} of topic {view.topic!r} are in no Offloaded segment "
                "and the pod holds no local file of that ledger: the tier is missing data; run "
                "`txnkeeper verify-offload` and restore the ledger"
            )
    parts.extend(TierPart(view, uuid, tuple(ranges)) for uuid, ranges in tier.items())
    return sorted(parts, key=_first_position)


def _first_position(part: Part) -> tuple[int, int]:
    if isinstance(part, PodPart):
        return (part.ledger_id, part.first)
    return (part.ranges[0][0], part.ranges[0][1])
