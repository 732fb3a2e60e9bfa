"""The tail cache is bounded for the whole store process, not per topic: a client writing to many topics
cannot make a pod keep what it wrote in memory (it was 20,000 entries or 32 MiB per topic, so 100
topics could hold 3.2 GB), and a consumer whose entries were evicted reads them from disk, intact.

The budget's rules are checked on the pure object (oldest first across topics, closing gives bytes
back, what does not fit is not kept); the bound and the reads through it on a real ``txnkeeper serve``
store pod over real sockets.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_pods import ServePod, pod_gauge

from txnkeeper.client import Client, MessageId
from txnkeeper.ledger.position import Position
from txnkeeper.server.config import ConfigError
from txnkeeper.server.serve import build_config, register
from txnkeeper.topic import tailcache
from txnkeeper.topic.tailcache import ENTRY_OVERHEAD, TailCacheBudget

pytestmark = pytest.mark.timeout(300)


def cost(payload: int) -> int:
    return payload + ENTRY_OVERHEAD


def test_the_oldest_entries_go_first_whichever_topic_wrote_them() -> None:
    budget = TailCacheBudget(max_bytes=3 * cost(100))
    a, b = budget.cache(), budget.cache()
    a.remember(Position(1, 0), b"a" * 100)
    b.remember(Position(7, 0), b"b" * 100)
    a.remember(Position(1, 1), b"a" * 100)
    assert (budget.entries, budget.bytes, budget.evicted) == (3, 3 * cost(100), 0)
    b.remember(Position(7, 1), b"b" * 100)  # over the budget: a's first entry was the oldest
    assert a.get(Position(1, 0)) is None and a.get(Position(1, 1)) == b"a" * 100
    assert [b.get(Position(7, i)) for i in range(2)] == [b"b" * 100] * 2
    assert (budget.entries, budget.bytes, budget.evicted) == (3, 3 * cost(100), 1)
    assert a.bytes + b.bytes == budget.bytes


def test_a_closed_cache_gives_its_bytes_back_and_its_records_are_compacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tailcache, "_COMPACT_AT", 8)
    budget = TailCacheBudget(max_bytes=10**9)
    kept = budget.cache()
    kept.remember(Position(1, 0), b"kept")
    for round_ in range(20):  # topics opened and closed without the budget ever filling
        cache = budget.cache()
        for entry in range(5):
            cache.remember(Position(round_ + 2, entry), b"x" * 10)
        cache.close()
        assert cache.get(Position(round_ + 2, 0)) is None
        cache.remember(Position(round_ + 2, 9), b"after close")  # ignored: nothing is kept any more
    assert (budget.entries, budget.bytes) == (1, cost(4))
    assert len(budget._order) <= 1 + 8 + 5  # not 101 records: closed caches' were dropped
    tiny = TailCacheBudget(max_bytes=cost(4))
    survivor = tiny.cache()
    survivor.remember(Position(1, 0), b"one!")
    closing = tiny.cache()
    closing.close()
    survivor.remember(Position(1, 1), b"two!")  # evicts the survivor's first, skipping nothing closed
    assert survivor.get(Position(1, 0)) is None and survivor.get(Position(1, 1)) == b"two!"


def test_what_cannot_fit_is_not_kept_and_an_entry_is_counted_once() -> None:
    budget = TailCacheBudget(max_bytes=cost(10))
    cache = budget.cache()
    cache.remember(Position(1, 0), b"y" * 10)
    cache.remember(Position(1, 1), b"z" * 11)  # larger than the whole budget: not kept, nothing evicted
    assert cache.get(Position(1, 0)) == b"y" * 10 and cache.get(Position(1, 1)) is None
    cache.remember(Position(1, 0), b"y" * 10)  # a second notice of the same entry
    assert (budget.entries, budget.bytes, len(budget._order)) == (1, cost(10), 1)
    none = TailCacheBudget(max_bytes=0).cache()
    none.remember(Position(1, 0), b"")
    assert len(none) == 0


_TAIL_CACHE_RANGE = "an integer of bytes in 0..1099511627776 (0: no tail cache, consumers read from disk)"


@pytest.mark.parametrize("value", ["-1", "1.5", "lots", "1099511627777"])
def test_a_bad_tail_cache_budget_is_refused_with_what_to_give(value: str, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    argv = ["serve", "--role", "store", "--data-dir", str(tmp_path), "--tail-cache-bytes", value]
    with pytest.raises(ConfigError) as refused:
        build_config(parser.parse_args(argv))
    shown = value if value in ("-1", "1099511627777") else repr(value)
    assert str(refused.value) == (
        f"--tail-cache-bytes must be {_TAIL_CACHE_RANGE}, got {shown} (default 67108864)"
    )


TOPICS = 24
PER_TOPIC = 40
PAYLOAD = 16_000  # 24 topics x 40 x 16 kB: 15 MB written, 8 times the pod's budget
BUDGET = 2 * 1024 * 1024


def _payload(topic: int, index: int) -> bytes:
    return topic.to_bytes(2, "big") + index.to_bytes(2, "big") + bytes([topic % 251]) * (PAYLOAD - 4)


async def test_many_topics_written_stay_within_the_pods_budget_and_read_intact(
    pods: Callable[..., ServePod],
) -> None:
    store = pods("pas-0", "store", extra=["--tail-cache-bytes", str(BUDGET)])
    topics = [f"persistent://t/ns/tail-{n}" for n in range(TOPICS)]
    written: dict[str, dict[MessageId, int]] = {}
    async with Client(coordinators=[], stores=[store.listen]) as client:
        for n, topic in enumerate(topics):
            producer = await client.create_producer(topic)
            ids = await asyncio.gather(*(producer.send(_payload(n, i)) for i in range(PER_TOPIC)))
            written[topic] = dict(zip(ids, range(PER_TOPIC), strict=True))
            held = pod_gauge(store, "txnkeeper_store_tail_cache_bytes")
            assert 0 < held <= BUDGET, f"the tail cache holds {held:.0f} bytes after topic {n}"
        assert pod_gauge(store, "txnkeeper_store_tail_cache_evicted_entries_total") > 0
        # The first topic's entries left memory long ago; the last topic's are still there. Both read
        # back every message, in order, with its own payload.
        for n in (0, TOPICS - 1):
            consumer = await client.subscribe(topics[n], "reader")  # a new subscription starts at the first
            for message_id in sorted(written[topics[n]]):
                message = await consumer.receive(timeout=30)
                assert message.message_id == message_id
                assert message.data == _payload(n, written[topics[n]][message_id])
    assert pod_gauge(store, "txnkeeper_process_heap_bytes", 'state="in_use"') > 0
