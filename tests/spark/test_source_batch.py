"""``spark.read.format("txnkeeper")`` on a real topic: exactly the committed messages, as a consumer sees
them, from a ledger only the tier holds and two the store pod holds; bounds; a damaged tier object and
an unreachable store fail the read with errors naming what to look at.

Real store and coordinator processes (topic_scenario.py), real Spark (local[2]), a real filesystem tier.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.spark.plan import ReadOptionError

from .topic_scenario import Scenario, build, tier_settings

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    started: list[Any] = []
    try:
        yield build(tmp_path_factory.mktemp("spark-batch"), started)
    finally:
        for pod in started:
            pod.stop()


def _read(spark: Any, options: dict[str, str]) -> Any:
    return spark.read.format("txnkeeper").options(**options).load()


def _seen(rows: list[Any]) -> list[tuple[str, str | None, str | None, bool]]:
    ordered = sorted(rows, key=lambda r: (r.ledgerId, r.entryId, r.batchIndex))
    return [(bytes(r.payload).decode(), r.key, r.producerName, r.txnId is not None) for r in ordered]


def test_exactly_the_committed_messages_in_topic_order(spark: Any, scenario: Scenario) -> None:
    frame = _read(spark, scenario.options())
    # One partition per ledger the pod holds (2) and per Offloaded segment (1).
    assert frame.rdd.getNumPartitions() == 3
    rows = frame.collect()
    assert _seen(rows) == scenario.expected
    assert {r.topic for r in rows} == {scenario.topic}
    assert {(r.partition, r.batchIndex, r.txnState or "plain") for r in rows} == {
        (-1, -1, "committed"),
        (-1, -1, "plain"),
    }
    assert all(r.properties == {} for r in rows)
    positions = [(r.ledgerId, r.entryId) for r in rows]
    assert len(set(positions)) == len(positions)
    seen_payloads = {bytes(r.payload).decode() for r in rows}
    assert not seen_payloads & set(scenario.aborted)
    assert not seen_payloads & set(scenario.open_payloads)


def test_bounds_by_position_and_publish_time(spark: Any, scenario: Scenario) -> None:
    rows = sorted(_read(spark, scenario.options()).collect(), key=lambda r: (r.ledgerId, r.entryId))
    middle = rows[3:7]
    start, end = middle[0], middle[-1]
    bounded = _read(
        spark,
        {
            **scenario.options(),
            "startPosition": f"{start.ledgerId}:{start.entryId}",
            "endPosition": f"{end.ledgerId}:{end.entryId}",
        },
    ).collect()
    assert _seen(bounded) == _seen(middle)
    low_ms = int(middle[0].publishTime.timestamp() * 1000)
    high = middle[-1].publishTime.astimezone(UTC).isoformat()
    by_time = _read(spark, {**scenario.options(), "startPublishTime": str(low_ms), "endPublishTime": high})
    times = [r.publishTime for r in by_time.collect()]
    assert times and all(middle[0].publishTime <= t <= middle[-1].publishTime for t in times)
    expected_count = sum(1 for r in rows if middle[0].publishTime <= r.publishTime <= middle[-1].publishTime)
    assert len(times) == expected_count


def test_committed_only_false_shows_every_message_with_its_state(spark: Any, scenario: Scenario) -> None:
    rows = _read(spark, {**scenario.options(), "committedOnly": "false"}).collect()
    states = {bytes(r.payload).decode(): r.txnState for r in rows}
    assert all(states[p] == "aborted" for p in scenario.aborted)
    assert all(states[p] == "open" for p in scenario.open_payloads)
    assert {p for p, _, _, _ in scenario.expected + scenario.held_back} <= states.keys()


def test_a_damaged_tier_object_fails_the_task_naming_object_and_position(
    spark: Any, scenario: Scenario, tmp_path: Path
) -> None:
    # A copy of the tier, damaged: the shared topic's own tier stays intact for the other tests.
    copy = tmp_path / "tier-copy"
    shutil.copytree(scenario.tier, copy)
    (index,) = sorted(copy.glob("*-index"))
    data = index.with_name(index.name.removesuffix("-index"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    import json

    options = {**scenario.options(), "offload": json.dumps(tier_settings(copy))}
    with pytest.raises(Exception) as failure:
        _read(spark, options).collect()
    text = str(failure.value)
    assert "PartReadError" in text and data.name in text, text[-3000:]
    assert "reading entries" in text and "from tier segment" in text and "corrupt" in text, text[-3000:]


def test_an_unreachable_store_is_a_clear_error(spark: Any, scenario: Scenario) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {**scenario.options(), "adminUrl": f"http://127.0.0.1:{port}", "timeout": "5"}
    with pytest.raises(Exception) as failure:
        _read(spark, options).collect()
    text = str(failure.value)
    assert f"127.0.0.1:{port} is unreachable" in text and "adminUrl" in text, text[-3000:]


def test_bad_options_are_refused_naming_them(spark: Any, scenario: Scenario) -> None:
    for options, fragment in [
        ({"adminUrl": scenario.store.admin_url()}, "give the topic"),
        ({**scenario.options(), "committedOnly": "maybe"}, "'committedOnly' must be true or false"),
        ({**scenario.options(), "startPosition": "x"}, "not of the form 'ledgerId:entryId'"),
        ({**scenario.options(), "endPublishTime": "2026-01-01T00:00:00"}, "give the time zone"),
        ({**scenario.options(), "offload": ""}, "ledgers only the tier holds"),
        ({**scenario.options(), "topics": "persistent://public/default/nowhere"}, "no store pod of"),
    ]:
        with pytest.raises(Exception) as failure:
            _read(spark, options).collect()
        assert fragment in str(failure.value), (options, str(failure.value)[-2000:])
    assert issubclass(ReadOptionError, ValueError)


def test_an_ended_transaction_releases_what_it_held_back(spark: Any, scenario: Scenario) -> None:
    """Last in this module: it changes the topic. The open transaction held back a plain message
    written after it; once it ends (aborted here), that message is read and its own one never is."""
    before = _seen(_read(spark, scenario.options()).collect())
    assert scenario.held_back and before == scenario.expected
    scenario.abort_open()
    deadline = datetime.now(UTC).timestamp() + 30
    while True:
        after = _seen(_read(spark, scenario.options()).collect())
        if after != before or datetime.now(UTC).timestamp() > deadline:
            break
    assert after == scenario.expected


def test_the_pod_serves_a_tier_only_ledger_bounded_and_as_the_tier_holds_it(scenario: Scenario) -> None:
    """The entries verb on a ledger only the tier holds: the byte bound holds (the pod reads a few
    entries at a time), and what it serves is what the data source reads from the tier itself."""
    from txnkeeper.ledger.position import Position
    from txnkeeper.spark import store_http
    from txnkeeper.spark.driver import topic_state
    from txnkeeper.spark.entries import tier_entries
    from txnkeeper.spark.plan import TierPart, parse_options, plan_topic

    options = parse_options(scenario.options())
    view, state = topic_state(options, scenario.topic)
    (tier_ledger,) = [item for item in state["ledgers"] if item["tierOnly"]]
    ledger_id, entries = tier_ledger["ledgerId"], tier_ledger["entries"]
    url = scenario.store.admin_url()
    one = store_http.read_entries(url, scenario.topic, (ledger_id, 0), (entries, 1), 30)
    assert len(one.entries) == 1 and one.durable_entries == entries
    served = store_http.read_entries(url, scenario.topic, (ledger_id, 0), (entries, 16 * 1024 * 1024), 30)
    parts = plan_topic(view, state, Position(ledger_id, 0), Position(ledger_id, entries - 1))
    assert parts and all(isinstance(part, TierPart) for part in parts)
    from_tier = [data for part in parts for _, _, data in tier_entries(part, options)]  # type: ignore[arg-type]
    assert from_tier == served.entries
