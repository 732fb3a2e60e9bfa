"""The coordinator's transaction-timeout rules as pure logic (coordinator/timeouts.py): which maximum
applies to a topic, and what a refusal says. The real pods' behaviour is test_txn_timeout_bounds.py."""

from __future__ import annotations

import re

import pytest

from txnkeeper.coordinator.timeouts import HARD_MAX_TIMEOUT_MS, TxnTimeoutPolicy, namespace_of
from txnkeeper.errors import BadRequestError


@pytest.mark.parametrize(
    ("topic", "namespace"),
    [
        ("persistent://t/ns/x", "t/ns"),
        ("non-persistent://tenant/space/a/b", "tenant/space"),
        ("persistent://t/ns/", "t/ns"),
        ("persistent://t//x", None),
        ("persistent:///ns/x", None),
        ("persistent://t/ns", None),
        ("t/ns/x", None),
        ("", None),
    ],
)
def test_namespace_of_a_topic_name(topic: str, namespace: str | None) -> None:
    assert namespace_of(topic) == namespace


POLICY = TxnTimeoutPolicy(
    600_000,
    namespaces={"t/slow": 60_000, "t/both": 50_000},
    topics={"persistent://t/both/x": 30_000, "odd-name": 10_000},
)


@pytest.mark.parametrize(
    ("timeout_ms", "topics", "refused"),
    [
        (600_000, ["persistent://t/other/x"], None),  # no own maximum: only the process one applies
        (60_000, ["persistent://t/slow/a"], None),
        (
            60_001,
            ["persistent://t/slow/a"],
            "maximum of 60000 ms for persistent://t/slow/a (set for namespace t/slow",
        ),
        (30_000, ["persistent://t/both/x"], None),
        (30_001, ["persistent://t/both/x"], "maximum of 30000 ms for persistent://t/both/x (set for topic"),
        (40_000, ["persistent://t/both/y"], None),  # the namespace's 50 s, not the other topic's 30 s
        (10_001, ["persistent://t/ns/a", "odd-name"], "maximum of 10000 ms for odd-name"),
    ],
)
def test_the_most_specific_maximum_applies(timeout_ms: int, topics: list[str], refused: str | None) -> None:
    if refused is None:
        POLICY.check_topics(timeout_ms, topics)
        return
    with pytest.raises(BadRequestError) as caught:
        POLICY.check_topics(timeout_ms, topics)
    assert refused in str(caught.value), caught.value
    assert "shorter timeout" in str(caught.value)


@pytest.mark.parametrize(
    ("timeout_ms", "fragment"),
    [
        (0, "at least 1 ms, got 0"),
        (-5, "at least 1 ms"),
        (600_001, "600001 ms is over this coordinator's maximum of 600000 ms"),
        (HARD_MAX_TIMEOUT_MS, "--max-txn-timeout-ms"),
    ],
)
def test_begins_out_of_range_are_refused_naming_the_setting(timeout_ms: int, fragment: str) -> None:
    with pytest.raises(BadRequestError, match=fragment):
        POLICY.check_begin(timeout_ms)


def test_a_policy_cannot_raise_a_namespace_or_topic_above_the_process_maximum() -> None:
    with pytest.raises(ValueError, match=re.escape("not in 1..600000 ms")):
        TxnTimeoutPolicy(600_000, namespaces={"t/ns": 600_001})
    with pytest.raises(ValueError, match=re.escape("1..86400000")):
        TxnTimeoutPolicy(HARD_MAX_TIMEOUT_MS + 1)
