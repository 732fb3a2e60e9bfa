"""The runtime's garbage-collector policy: parsing of the override and its effect on the process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from txnkeeper import gcpolicy


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_default_is_the_runtime_policy() -> None:
    assert gcpolicy.parse_thresholds(None) == gcpolicy.RUNTIME_THRESHOLDS
    assert gcpolicy.parse_thresholds("  ") == gcpolicy.RUNTIME_THRESHOLDS


def test_cpython_defaults_and_explicit_values() -> None:
    assert gcpolicy.parse_thresholds("default") == (700, 10, 10)
    assert gcpolicy.parse_thresholds("1000, 5, 7") == (1000, 5, 7)


@pytest.mark.parametrize("text", ["50000,20", "a,b,c", "0,10,10", "1,2,3,4", "-5,10,10"])
def test_bad_thresholds_say_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match="three positive integers") as err:
        gcpolicy.parse_thresholds(text)
    assert "default" in str(err.value)


def test_apply_and_freeze_change_this_process(restore_gc: None) -> None:
    gcpolicy.apply((12_345, 6, 7))
    assert gc.get_threshold() == (12_345, 6, 7)
    survivor = [object() for _ in range(10)]
    gcpolicy.freeze_startup_state()
    assert gc.get_freeze_count() >= len(survivor)
