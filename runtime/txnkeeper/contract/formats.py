"""Storage format levels and the release table: which release can read which on-disk format.

Why a module of its own: the runtime (which refuses to start a pod at a level below its data) and the
operator (which must never roll a pod below what its volumes hold) used to keep two hand-copied tables
kept equal by a drift test. This is now the only table. Like pebble's FormatMajorVersion, every level
is named and documented, ``FormatLevel.newest()`` is what this build writes at most, and an unknown
release is refused with a message saying what is known. Standard library only, so the operator may
import it (docs/contracts.md §0).
"""

from __future__ import annotations

import enum
import re


class FormatLevel(enum.IntEnum):
    """The highest storage format a release can read and write; levels only ever grow."""

    # 1.x: every transaction-log and pending-ack entry holds exactly one record. A level-1 pod that
    # meets a batched entry cannot decode it, so nothing may hand one a live batched log.
    UNBATCHED = 1
    # 2.x: PIP-160 batched entries (magic 0x0e01 header, several records per entry) may be written and
    # are always readable, whatever the batch log's current setting.
    BATCHED = 2

    @classmethod
    def newest(cls) -> FormatLevel:
        """The highest level this build knows."""
        return max(cls)


UNBATCHED_LEVEL = FormatLevel.UNBATCHED
BATCHED_LEVEL = FormatLevel.BATCHED

RELEASE_PATTERN = r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?:[-+][0-9A-Za-z.-]+)?$"
_RELEASE = re.compile(RELEASE_PATTERN)

# The release table: major release line -> highest format level it can read.
RELEASE_LEVELS: dict[int, FormatLevel] = {1: FormatLevel.UNBATCHED, 2: FormatLevel.BATCHED}


class UnknownReleaseError(ValueError):
    """A release string this build cannot place on the release table."""


def known_majors() -> tuple[int, ...]:
    """Major release lines this build knows (the CRD's CEL rule on spec.version is built from it)."""
    return tuple(sorted(RELEASE_LEVELS))


def format_level(release: str) -> FormatLevel:
    """Return the format level of ``release`` (``"1.4.2"`` -> UNBATCHED, ``"2.0.0"`` -> BATCHED)."""
    match = _RELEASE.match(release.strip())
    if match is None:
        raise UnknownReleaseError(
            f"release {release!r} is not a semantic version like 2.0.0; give MAJOR.MINOR.PATCH"
        )
    major = int(match["major"])
    if major not in RELEASE_LEVELS:
        known = ", ".join(f"{m}.x" for m in known_majors())
        raise UnknownReleaseError(f"release {release!r} is unknown to this build (known: {known})")
    return RELEASE_LEVELS[major]
