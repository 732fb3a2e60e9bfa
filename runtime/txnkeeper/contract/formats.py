"""Storage format levels, the features each level brings, and the release table.

Why a module of its own: the runtime (which refuses to start a pod whose data needs something its
release cannot read) and the operator (which must never roll a pod below what its volumes hold, and
must refuse settings a release does not have) used to keep two hand-copied tables kept equal by a drift
test. This is now the only table. Like pebble's FormatMajorVersion, every level is named and documented
and ``FormatLevel.newest()`` is what this build writes at most; unlike a single number, each level lists
the named features it adds (``Feature``), so a downgrade knows exactly which features it takes away and
therefore which gates it must pass (the batch log off for ``batched-log``, tier-only ledgers restored for
``offload-segments``, ...). An unknown release is refused with a message saying what is known. Standard
library only, so the operator may import it (docs/contracts.md §0).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable


class Feature(enum.StrEnum):
    """One capability that changes what may be on disk; named as the CRD and messages spell it."""

    # PIP-160 batched entries (magic 0x0e01 header) in transaction and pending-ack logs.
    BATCHED_LOG = "batched-log"
    # PIP-76 offload: managed-ledger metadata version 2 (segments, ledgers whose local file is gone).
    OFFLOAD_SEGMENTS = "offload-segments"
    # PDP-44 single-routing-key transactions: writer state (last event numbers) kept by store pods.
    SINGLE_KEY_TRANSACTIONS = "single-key-transactions"


class FormatLevel(enum.IntEnum):
    """The highest storage format a release can read and write; levels only ever grow, and each level
    can read everything every lower level wrote."""

    # 1.x: every transaction-log and pending-ack entry holds exactly one record. A level-1 pod that
    # meets a batched entry cannot decode it, so nothing may hand one a live batched log.
    UNBATCHED = 1
    # 2.x: PIP-160 batched entries (magic 0x0e01 header, several records per entry) may be written and
    # are always readable, whatever the batch log's current setting.
    BATCHED = 2
    # 3.x: ledgers may be offloaded (metadata version 2 with segments; a ledger's entries may exist only
    # in the blob store) and store pods may keep single-key writer state.
    OFFLOAD_AND_WRITER_STATE = 3

    @classmethod
    def newest(cls) -> FormatLevel:
        """The highest level this build knows."""
        return max(cls)

    @property
    def features(self) -> frozenset[Feature]:
        """Every feature a release at this level has (its own and all lower levels')."""
        return frozenset(f for f in Feature if FEATURE_LEVELS[f] <= self)


UNBATCHED_LEVEL = FormatLevel.UNBATCHED
BATCHED_LEVEL = FormatLevel.BATCHED
OFFLOAD_LEVEL = FormatLevel.OFFLOAD_AND_WRITER_STATE

# The level that introduced each feature: a release has a feature iff its level is at least this.
FEATURE_LEVELS: dict[Feature, FormatLevel] = {
    Feature.BATCHED_LOG: FormatLevel.BATCHED,
    Feature.OFFLOAD_SEGMENTS: FormatLevel.OFFLOAD_AND_WRITER_STATE,
    Feature.SINGLE_KEY_TRANSACTIONS: FormatLevel.OFFLOAD_AND_WRITER_STATE,
}

RELEASE_PATTERN = r"^(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?:[-+][0-9A-Za-z.-]+)?$"
_RELEASE = re.compile(RELEASE_PATTERN)

# The release table: major release line -> highest format level it can read.
RELEASE_LEVELS: dict[int, FormatLevel] = {
    1: FormatLevel.UNBATCHED,
    2: FormatLevel.BATCHED,
    3: FormatLevel.OFFLOAD_AND_WRITER_STATE,
}


class UnknownReleaseError(ValueError):
    """A release string this build cannot place on the release table."""


class FeatureUnavailableError(ValueError):
    """Something needs a feature the release in question does not have."""

    def __init__(self, release: str, feature: Feature, needed_for: str) -> None:
        self.release = release
        self.feature = feature
        lines = ", ".join(f"{m}.x" for m in majors_with(feature))
        super().__init__(
            f"{needed_for} needs the {feature.value!r} feature (format level {int(FEATURE_LEVELS[feature])}),"
            f" which release {release} lacks; run a release that has it ({lines})"
        )


def known_majors() -> tuple[int, ...]:
    """Major release lines this build knows (the CRD's CEL rule on spec.version is built from it)."""
    return tuple(sorted(RELEASE_LEVELS))


def majors_with(feature: Feature) -> tuple[int, ...]:
    """Major release lines that have ``feature`` (the CRD's gating CEL rules are built from it)."""
    return tuple(m for m in known_majors() if RELEASE_LEVELS[m] >= FEATURE_LEVELS[feature])


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


def release_features(release: str) -> frozenset[Feature]:
    """The features ``release`` has; raises UnknownReleaseError like ``format_level``."""
    return format_level(release).features


def has_feature(release: str, feature: Feature) -> bool:
    return feature in release_features(release)


def require_feature(release: str, feature: Feature, needed_for: str) -> None:
    """Raise FeatureUnavailableError (saying what needed it and which lines have it) unless ``release``
    has ``feature``."""
    if not has_feature(release, feature):
        raise FeatureUnavailableError(release, feature, needed_for)


def lost_features(data_level: int, target_level: int) -> frozenset[Feature]:
    """What a move from ``data_level`` to ``target_level`` takes away: the gates a downgrade must pass."""
    return FormatLevel(data_level).features - FormatLevel(target_level).features


def feature_names(features: Iterable[Feature]) -> list[str]:
    """Sorted by the level that introduced them, then by name: how status and messages list them."""
    return [f.value for f in sorted(features, key=lambda f: (FEATURE_LEVELS[f], f.value))]
