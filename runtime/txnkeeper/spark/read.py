"""The rows of one planned part (what a Spark task returns): its entries (entries.py) judged as a
consumer would see the topic (rows.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from txnkeeper.spark.entries import pod_entries, tier_entries
from txnkeeper.spark.plan import PodPart, ReadOptions, TierPart
from txnkeeper.spark.rows import Row, Visibility, entry_rows


def visibility(options: ReadOptions, part: PodPart | TierPart) -> Visibility:
    return Visibility(
        part.view.aborted,
        part.view.open,
        options.committed_only,
        options.min_publish_ms,
        options.max_publish_ms,
    )


def read_part(part: PodPart | TierPart, options: ReadOptions) -> Iterator[Row]:
    """The rows of one planned part (what a Spark task returns)."""
    vis = visibility(options, part)
    topic = part.view.topic
    if isinstance(part, PodPart):
        for entry_id, data in pod_entries(part, options):
            yield from entry_rows(topic, part.ledger_id, entry_id, data, vis)
        return
    for ledger_id, entry_id, data in tier_entries(part, options):
        yield from entry_rows(topic, ledger_id, entry_id, data, vis)
