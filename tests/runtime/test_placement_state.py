"""server/placement_state.py: a pod judges requests by its own copy of the placement record, which
survives restarts, never goes back an epoch, and is refused whole when damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkeeper import statefile
from txnkeeper.contract.placement import Member, Placement
from txnkeeper.errors import NotServedHereError
from txnkeeper.server.placement_state import PlacementRefusal, PodPlacement, pod_ordinal

MEMBERS = {0: Member("pas-0:6650"), 1: Member("pas-1:6650")}


def _initial() -> Placement:
    return Placement.initial("store-shards", 2, members=MEMBERS)


def test_redirects_name_the_owner_and_a_fenced_shard_says_retry(tmp_path: Path) -> None:
    pod = PodPlacement.load(tmp_path, "store-shards", 0, _initial())
    assert pod.serves(0) and not pod.serves(1)
    topic = next(f"t{i}" for i in range(100) if pod.shard_of_topic(f"t{i}") == 1)
    pod.check_topic(f"t{next(i for i in range(100) if pod.shard_of_topic(f't{i}') == 0)}")
    with pytest.raises(NotServedHereError) as caught:
        pod.check_topic(topic)
    assert caught.value.owner_address == "pas-1:6650" and caught.value.placement_epoch == 1
    pod.mark(2, "m1", "fenced")
    with pytest.raises(NotServedHereError, match="being moved") as moving:
        pod.check(2, "topic 'y'")
    assert moving.value.owner_address == ""
    with pytest.raises(PlacementRefusal, match="move 'm1'"):
        pod.mark(2, "m2", "fenced")


def test_record_and_markers_survive_a_restart_and_epochs_only_move_forward(tmp_path: Path) -> None:
    pod = PodPlacement.load(tmp_path, "store-shards", 0, _initial())
    seen: list[int] = []
    pod.on_change(lambda record: seen.append(record.epoch))
    moved = _initial().with_owner(1, 0)
    assert pod.put(moved) and not pod.put(moved) and seen == [2]
    pod.mark(4, "m9", "received")
    again = PodPlacement.load(tmp_path, "store-shards", 0, _initial())
    assert again.record == moved and again.serves(1) and again.markers[4].move == "m9"
    with pytest.raises(PlacementRefusal) as older:
        again.put(_initial())
    assert older.value.status == 409
    with pytest.raises(PlacementRefusal) as other:
        again.put(Placement.initial("store-shards", 1))
    assert other.value.status == 400
    again.clear(4, "m9")
    assert PodPlacement.load(tmp_path, "store-shards", 0, _initial()).markers == {}


def test_a_damaged_or_foreign_copy_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    pod = PodPlacement.load(tmp_path, "store-shards", 0, _initial())
    pod.put(_initial().with_owner(0, 1))
    raw = bytearray(pod.path.read_bytes())
    raw[-3] ^= 0x01
    pod.path.write_bytes(bytes(raw))
    with pytest.raises(statefile.StateFileError, match=r"placement\.json"):
        PodPlacement.load(tmp_path, "store-shards", 0, _initial())
    pod.path.unlink()
    PodPlacement(pod.path, 0, _initial()).put(_initial().with_owner(0, 1))
    with pytest.raises(statefile.StateFileError, match="--shards"):
        PodPlacement.load(tmp_path, "store-shards", 0, Placement.initial("store-shards", 1))


def test_pod_ordinal() -> None:
    assert [pod_ordinal(n) for n in ("pas-2", "tc-10", "store", "x-\u0661")] == [2, 10, 0, 0]
