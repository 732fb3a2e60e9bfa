from __future__ import annotations

import pytest

from txnkeeper.release import BATCHED_LEVEL, UNBATCHED_LEVEL, UnknownReleaseError, format_level


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
