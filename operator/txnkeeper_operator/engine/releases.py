"""The operator's own copy of the release -> storage format level table (docs/contracts.md §4).

The operator never imports the runtime, yet every safety decision it makes hinges on which releases can
read batched entries; this copy is checked against the runtime's table by a test so the two cannot drift.
"""

from __future__ import annotations

import re

UNBATCHED_LEVEL = 1
BATCHED_LEVEL = 2

RELEASE_PATTERN = r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?:[-+][0-9A-Za-z.-]+)?$"
_RELEASE = re.compile(RELEASE_PATTERN)

# major release -> highest format level it can read; keep in step with txnkeeper.release.
_LEVELS = {1: UNBATCHED_LEVEL, 2: BATCHED_LEVEL}


class UnknownReleaseError(ValueError):
    """A release string the operator cannot place on the format-level table."""


def format_level(release: str) -> int:
    """Return the format level of ``release`` (``"1.4.2"`` -> 1, ``"2.0.0"`` -> 2)."""
    match = _RELEASE.match(release.strip())
    if match is None:
        raise UnknownReleaseError(f"version {release!r} is not a semantic version like 2.0.0")
    major = int(match["major"])
    if major not in _LEVELS:
        known = ", ".join(f"{m}.x" for m in sorted(_LEVELS))
        raise UnknownReleaseError(f"version {release!r} is unknown to this operator (known: {known})")
    return _LEVELS[major]


def known_majors() -> tuple[int, ...]:
    """Major releases this operator can manage (used by the CRD's CEL rule and its test)."""
    return tuple(sorted(_LEVELS))
