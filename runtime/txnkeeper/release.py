"""Map a release version to the highest storage format level it can read and write.

Format levels are how txnkeeper models the PIP-160 compatibility problem: a level-1 (1.x) runtime
cannot read batched entries, so nothing may ever hand it a live batched log. One codebase emulates
every release, which lets old and new pods run side by side in tests, the local fleet and the cluster.
"""

from __future__ import annotations

import re

UNBATCHED_LEVEL = 1
BATCHED_LEVEL = 2

_RELEASE = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?:[-+][0-9A-Za-z.-]+)?$")

# major release -> format level; keep in step with txnkeeper_operator's copy.
_LEVELS = {1: UNBATCHED_LEVEL, 2: BATCHED_LEVEL}


class UnknownReleaseError(ValueError):
    """A release string this build does not know how to emulate."""


def format_level(release: str) -> int:
    """Return the format level of ``release`` (e.g. ``"1.4.2"`` -> 1, ``"2.0.0"`` -> 2)."""
    match = _RELEASE.match(release.strip())
    if match is None:
        raise UnknownReleaseError(
            f"release {release!r} is not a semantic version like 2.0.0; pass --release MAJOR.MINOR.PATCH"
        )
    major = int(match["major"])
    if major not in _LEVELS:
        known = ", ".join(f"{m}.x" for m in sorted(_LEVELS))
        raise UnknownReleaseError(f"release {release!r} is unknown to this build (known: {known})")
    return _LEVELS[major]
