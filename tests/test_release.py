from __future__ import annotations

import itertools

import pytest

from txnkeeper.contract import formats
from txnkeeper.contract.formats import (
    Feature,
    FeatureUnavailableError,
    known_majors,
    lost_features,
    majors_with,
    release_features,
    require_feature,
)
from txnkeeper.release import BATCHED_LEVEL, UNBATCHED_LEVEL, FormatLevel, UnknownReleaseError, format_level


@pytest.mark.parametrize(
    ("release", "level"),
    [
        ("1.0.0", UNBATCHED_LEVEL),
        ("1.9.12", UNBATCHED_LEVEL),
        ("2.0.0", BATCHED_LEVEL),
        ("2.3.1-rc1", 2),
        ("3.0.0", 3),
    ],
)
def test_levels(release: str, level: int) -> None:
    assert format_level(release) == level


@pytest.mark.parametrize("release", ["", "2", "v2.0.0", "9.0.0", "latest"])
def test_unknown_release_is_a_clear_error(release: str) -> None:
    with pytest.raises(UnknownReleaseError, match="release"):
        format_level(release)


def test_format_levels_are_named_ordered_and_newest_is_offload() -> None:
    assert FormatLevel.UNBATCHED < FormatLevel.BATCHED < FormatLevel.OFFLOAD_AND_WRITER_STATE
    assert FormatLevel.newest() is FormatLevel.OFFLOAD_AND_WRITER_STATE
    assert formats.format_level("1.4.2") is FormatLevel.UNBATCHED
    assert formats.format_level("2.0.0") is FormatLevel.BATCHED
    assert formats.format_level("3.1.0") is FormatLevel.OFFLOAD_AND_WRITER_STATE
    assert known_majors() == (1, 2, 3)


def test_features_accumulate_with_the_level() -> None:
    assert release_features("1.0.0") == frozenset()
    assert release_features("2.0.0") == {Feature.BATCHED_LOG}
    assert release_features("3.0.0") == {
        Feature.BATCHED_LOG,
        Feature.OFFLOAD_SEGMENTS,
        Feature.SINGLE_KEY_TRANSACTIONS,
    }
    # Levels only grow: every level has every lower level's features.
    levels = sorted(FormatLevel)
    for lower, higher in itertools.pairwise(levels):
        assert lower.features < higher.features
    assert majors_with(Feature.BATCHED_LOG) == (2, 3)
    assert majors_with(Feature.OFFLOAD_SEGMENTS) == (3,)


def test_a_downgrade_names_the_features_it_takes_away() -> None:
    assert lost_features(3, 2) == {Feature.OFFLOAD_SEGMENTS, Feature.SINGLE_KEY_TRANSACTIONS}
    assert lost_features(2, 1) == {Feature.BATCHED_LOG}
    assert lost_features(3, 1) == set(Feature)
    assert lost_features(2, 3) == frozenset()
    assert formats.feature_names(lost_features(3, 1)) == [
        "batched-log",
        "offload-segments",
        "single-key-transactions",
    ]


def test_a_missing_feature_is_refused_naming_release_feature_and_lines() -> None:
    require_feature("3.0.0", Feature.OFFLOAD_SEGMENTS, "offload")
    with pytest.raises(FeatureUnavailableError) as info:
        require_feature("2.4.0", Feature.OFFLOAD_SEGMENTS, "spec.offload")
    message = str(info.value)
    assert "spec.offload" in message and "'offload-segments'" in message
    assert "release 2.4.0 lacks" in message and "(3.x)" in message


def test_refusal_names_the_known_release_lines() -> None:
    with pytest.raises(UnknownReleaseError, match=r"known: 1\.x, 2\.x, 3\.x"):
        format_level("9.0.0")
