"""The driver's side of a read: find the pod holding each topic, take its read state, plan the parts.

Why apart from the Spark classes: batch reads, each streaming micro-batch and the offload audit plan
the same way; only the bounds differ (options for a batch read, the offsets for a micro-batch).
"""

from __future__ import annotations

from typing import Any

from txnkeeper.ledger.position import Position
from txnkeeper.spark import store_http
from txnkeeper.spark.plan import (
    BEFORE_ALL,
    Part,
    ReadOptionError,
    ReadOptions,
    TopicView,
    plan_topic,
    topic_view,
    upper_bound,
)


def topic_state(options: ReadOptions, topic: str) -> tuple[TopicView, dict[str, Any]]:
    """The topic's read state from the first pod (in ``adminUrl`` order) that holds it."""
    missing = []
    for url in options.admin_urls:
        try:
            state = store_http.read_state(url, topic, options.timeout_s)
        except store_http.TopicNotHere as exc:
            missing.append(str(exc))
            continue
        return topic_view(topic, url, state), state
    raise ReadOptionError(
        f"no store pod of {list(options.admin_urls)} holds topic {topic!r}: {'; '.join(missing)}"
    )


def plan(
    options: ReadOptions, bounds: dict[str, tuple[Position, Position | None]] | None = None
) -> list[Part]:
    """The parts of every topic: from the options' bounds, or ``bounds`` (topic -> (low, high)
    inclusive, high None: up to what is readable now) for a micro-batch."""
    parts: list[Part] = []
    for topic in options.topics:
        view, state = topic_state(options, topic)
        readable = upper_bound(view, options.committed_only)
        if bounds is not None:
            low, high = bounds.get(topic, (BEFORE_ALL, None))
        else:
            low, high = options.start or BEFORE_ALL, options.end
        top = readable if high is None or (readable is not None and readable < high) else high
        parts.extend(plan_topic(view, state, low, top))
    return parts


def readable_offsets(options: ReadOptions) -> dict[str, str]:
    """Per topic, the last position readable now (the streaming source's latest offset)."""
    out = {}
    for topic in options.topics:
        view, _ = topic_state(options, topic)
        readable = upper_bound(view, options.committed_only)
        out[topic] = str(readable if readable is not None else BEFORE_ALL)
    return out
