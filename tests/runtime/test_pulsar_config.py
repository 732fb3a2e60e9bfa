"""The Pulsar settings of `txnkeeper serve` (server/pulsar_config.py, server/pulsar_placement.py): bad
values are refused naming the setting; placement follows the own clients' rule."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from txnkeeper.server.config import ConfigError
from txnkeeper.server.pulsar_config import partitioned_topics, url_problem
from txnkeeper.server.pulsar_placement import TC_ASSIGN_TOPIC, PulsarPlacement, coordinator_partition


@pytest.mark.parametrize(
    ("section", "why"),
    [
        ({"partitionedTopics": {"persistent://t/n/a": 0}}, "partitions"),
        ({"partitionedTopics": {"persistent://t/n/a": True}}, "partitions"),
        ({"partitionedTopics": {"persistent://t/n/a": 10_001}}, "partitions"),
        ({"partitionedTopics": {"persistent://t/n/a-partition-1": 2}}, "partition's name"),
        ({"partitionedTopics": {"bad\x00name": 2}}, "topic"),
        ({"partitionedTopics": ["persistent://t/n/a"]}, "map topic names"),
        ({"partitions": {}}, "unknown key"),
    ],
)
def test_bad_partitioned_topics_are_refused(tmp_path: Path, section: object, why: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"pulsar": section}))
    with pytest.raises(ConfigError, match=why):
        partitioned_topics(config)


def test_partitioned_topics_and_placement(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"pulsar": {"partitionedTopics": {"persistent://t/n/orders": 4}}}))
    stores = ("pulsar://s-0:6650", "pulsar://s-1:6650", "pulsar://s-2:6650")
    placement = PulsarPlacement(stores, ("pulsar://c-0:6650",), 3, partitioned_topics(config))
    assert placement.partitions("persistent://t/n/orders") == 4
    assert placement.partitions("persistent://t/n/other") == 0
    assert placement.partitions(TC_ASSIGN_TOPIC) == 3
    topic = "persistent://t/n/orders-partition-2"
    assert placement.store_url(topic, "own") == stores[zlib.crc32(topic.encode()) % 3]
    assert placement.store_address(topic) == stores[zlib.crc32(topic.encode()) % 3][len("pulsar://") :]
    assert placement.coordinator_url(2, "own") == "pulsar://c-0:6650"
    assert PulsarPlacement().store_url(topic, "pulsar://me:1") == "pulsar://me:1"
    assert coordinator_partition(f"{TC_ASSIGN_TOPIC}-partition-7") == 7
    assert coordinator_partition(f"{TC_ASSIGN_TOPIC}-partition-x") is None
    assert coordinator_partition("persistent://t/n/orders") is None


@pytest.mark.parametrize(
    "url",
    ["http://h:1", "pulsar://h", "pulsar://:1", "pulsar://h:1/path", "pulsar://u@h:1", "pulsar://h:99999"],
)
def test_urls_that_are_not_one_pods_pulsar_address_are_refused(url: str) -> None:
    assert url_problem(url) is not None
    assert url_problem("pulsar://pas-0.pas.ns.svc:6650") is None
