"""Which placement a store pod starts with (server/shard_moves.py ``initial_placement``): none without
--replicas and without a record (it serves every topic, as before placement), the first record of its
flags, or the record it was given, which wins over flags that no longer describe it after scaling."""

from __future__ import annotations

from pathlib import Path

import pytest

from txnkeeper.contract.placement import Placement
from txnkeeper.server.placement_state import PodPlacement
from txnkeeper.server.shard_moves import initial_placement
from txnkeeper.statefile import StateFileError


def _start(data: Path, replicas: int | None, shards: int | None) -> PodPlacement | None:
    return initial_placement(data, "store-shards", ordinal=1, replicas=replicas, shards=shards)


def test_no_replicas_and_no_record_means_no_placement(tmp_path: Path) -> None:
    assert _start(tmp_path, None, None) is None
    assert not (tmp_path / "placement.json").exists()


def test_the_first_record_comes_from_the_flags_and_is_not_written(tmp_path: Path) -> None:
    placement = _start(tmp_path, 2, 4)
    assert placement is not None
    assert placement.record == Placement.initial("store-shards", 2, 4)
    assert placement.serves(1) and not placement.serves(0)
    assert not (tmp_path / "placement.json").exists()
    with pytest.raises(StateFileError, match="multiple"):
        _start(tmp_path, 2, 3)


def test_a_given_record_wins_over_flags_after_scaling(tmp_path: Path) -> None:
    placement = _start(tmp_path, 2, 4)
    assert placement is not None
    moved = placement.record.with_owner(0, 2)
    placement.put(moved)
    for replicas in (None, 2, 3):  # 4 shards over 3 pods: no longer a first record, still this one
        again = _start(tmp_path, replicas, None)
        assert again is not None and again.record == moved
    with pytest.raises(StateFileError, match="--shards 8"):
        _start(tmp_path, 3, 8)
