from __future__ import annotations

import pytest

from txnkeeper.contract import formats
from txnkeeper.contract.formats import known_majors
from txnkeeper.release import BATCHED_LEVEL, UNBATCHED_LEVEL, FormatLevel, UnknownReleaseError, format_level


@pytest.mark.parametrize(
    ("release", "level"),
    [("1.0.0", UNBATCHED_LEVEL), ("1.9.12", UNBATCHED_LEVEL), ("2.0.0", BATCHED_LEVEL), ("2.3.1-rc1", 2)],
)
def test_levels(release: str, level: int) -> None:
    assert format_level(release) == level


@pytest.mark.parametrize("release", ["", "2", "v2.0.0", "3.0.0", "latest"])
def test_unknown_release_is_a_clear_error(release: str) -> None:
    with pytest.raises(UnknownReleaseError, match="release"):
        format_level(release)


def test_format_levels_are_named_ordered_and_newest_is_batched() -> None:
    assert FormatLevel.UNBATCHED < FormatLevel.BATCHED == FormatLevel.newest()
    assert formats.format_level("1.4.2") is FormatLevel.UNBATCHED
    assert formats.format_level("2.0.0") is FormatLevel.BATCHED
    assert known_majors() == (1, 2)


def test_refusal_names_the_known_release_lines() -> None:
    with pytest.raises(UnknownReleaseError, match=r"known: 1\.x, 2\.x"):
        format_level("3.0.0")
