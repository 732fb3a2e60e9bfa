"""contract/placement.py: the first record keeps every topic where the arithmetic rule put it, epochs
only move forward, and a damaged record is refused naming the field."""

from __future__ import annotations

import zlib

import pytest

from txnkeeper.contract.placement import Member, Placement, PlacementError, shard_of


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_first_record_keeps_every_topic_on_its_arithmetic_pod(replicas: int) -> None:
    placement = Placement.initial("store-shards", replicas)
    assert placement.shards == 16 * replicas
    for i in range(2000):
        topic = f"persistent://t/ns/topic-{i}"
        assert placement.owner_of_topic(topic) == zlib.crc32(topic.encode()) % replicas


def test_store_shard_count_must_be_a_multiple_of_the_replicas() -> None:
    with pytest.raises(PlacementError, match="multiple"):
        Placement.initial("store-shards", 3, shards=16)
    ids = Placement.initial("coordinator-ids", 3, shards=4)
    assert ids.owners == (0, 1, 2, 0)


def test_a_move_is_a_new_epoch_and_an_older_one_never_supersedes() -> None:
    first = Placement.initial("store-shards", 2, members={0: Member("a:1"), 1: Member("b:1")})
    moved = first.with_owner(3, 0)
    assert moved.epoch == 2 and moved.owner_of(3) == 0 and first.owner_of(3) == 1
    assert moved.supersedes(first) and not first.supersedes(moved) and not moved.supersedes(moved)
    other_kind = Placement.initial("coordinator-ids", 2, shards=32)
    assert not other_kind.with_owner(0, 1).with_owner(0, 0).supersedes(first)
    assert moved.shards_of(0) == tuple(s for s in range(32) if s % 2 == 0 or s == 3)


def test_json_round_trip() -> None:
    record = Placement.initial(
        "store-shards", 2, members={1: Member("b:6650", "pulsar://b:6650", "http://b")}
    )
    assert Placement.loads(record.dumps()) == record
    assert shard_of("x", record.shards) == zlib.crc32(b"x") % 32


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("[]", "must be a JSON object"),
        ("{", "not JSON"),
        ('{"kind": "x", "epoch": 1, "owners": [0]}', "kind must be one of"),
        ('{"kind": "store-shards", "epoch": 0, "owners": [0]}', "epoch must be"),
        ('{"kind": "store-shards", "epoch": true, "owners": [0]}', "epoch must be"),
        ('{"kind": "store-shards", "epoch": 1, "owners": []}', "1..4096 owners"),
        ('{"kind": "store-shards", "epoch": 1, "owners": [-1]}', "ordinal -1"),
        ('{"kind": "store-shards", "epoch": 1, "owners": ["0"]}', "list of pod ordinals"),
        ('{"kind": "store-shards", "epoch": 1, "owners": [0], "extra": 1}', "unknown keys"),
        ('{"kind": "store-shards", "epoch": 1, "owners": [0], "members": {"x": {}}}', "not a pod ordinal"),
        ('{"kind": "store-shards", "epoch": 1, "owners": [0], "members": {"0": {}}}', "address is required"),
        (
            '{"kind": "store-shards", "epoch": 1, "owners": [0], "members": {"0": {"address": "a\\n"}}}',
            "printable",
        ),
    ],
)
def test_damaged_records_are_refused_naming_the_field(raw: str, problem: str) -> None:
    with pytest.raises(PlacementError, match=problem) as caught:
        Placement.loads(raw, where="cm/placement.json")
    assert "cm/placement.json" in str(caught.value)
