"""Tier data a managed ledger's offloader could not read, kept while it lasts, for everyone to see.

Why: a read of damaged or unreachable tier data is refused (nothing wrong is ever served), but the
refusal used to reach only the read that failed: a consumer stalled at that position, while the
offload status said SUCCESS, no metric moved and the operator's OffloadHealthy stayed true. Each
failed read is recorded here per segment (the entries it asked for, the object and the problem), and
the record stays until a read of those entries succeeds (the object was restored, the tier is back)
or the segment is gone (trimmed). ``Offloader.status()``, the pod's metrics and its offload summary
(what the operator's condition reads) report these records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import (
    BlobNotFound,
    BlobStoreError,
    BlobStoreUnavailable,
    OffloadCorruptionError,
    OffloadRangeError,
)
from .writer import data_key


@dataclass
class TierReadFailure:
    """The last failed read of one segment's entries (``segment`` "": entries no segment holds)."""

    segment: str
    object: str  # the object the error names (data or index), "" when none
    ledger_id: int
    first: int
    last: int  # the entries the failed read asked for, first..last of ledger_id
    kind: str  # corrupt | missing | unavailable | error
    error: str
    since: float  # wall clock of the first failure of this segment (seconds)
    last_failure: float
    failed_reads: int

    @property
    def entries(self) -> str:
        return f"{self.ledger_id}:{self.first}..{self.ledger_id}:{self.last}"

    def describe(self) -> str:
        where = f"segment {self.segment}, object {self.object!r}" if self.segment else "no segment"
        return (
            f"tier data unreadable: entries {self.entries} ({where}; {self.failed_reads} failed read(s)): "
            f"{self.error}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "object": self.object,
            "entries": self.entries,
            "kind": self.kind,
            "error": self.error,
            "since": self.since,
            "lastFailure": self.last_failure,
            "failedReads": self.failed_reads,
        }


def kind_of(exc: BaseException) -> str:
    """corrupt: the bytes are damaged; missing: an object or the entries are gone; unavailable: the
    tier could not be reached (retrying may succeed); error: the tier refused (e.g. credentials)."""
    if isinstance(exc, OffloadCorruptionError):
        return "corrupt"
    if isinstance(exc, BlobNotFound | OffloadRangeError):
        return "missing"
    if isinstance(exc, BlobStoreUnavailable | OSError):
        return "unavailable"
    return "error"


def _object_of(segment: str, exc: BaseException) -> str:
    key = exc.key if isinstance(exc, OffloadCorruptionError | BlobStoreError) else None
    if key is not None:
        return key
    return data_key(segment) if segment else ""


class UnreadableTier:
    """The read failures of one offloader's segments (module docstring)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._failures: dict[str, TierReadFailure] = {}

    def __len__(self) -> int:
        return len(self._failures)

    def failures(self) -> list[TierReadFailure]:
        """Oldest first."""
        return sorted(self._failures.values(), key=lambda f: f.since)

    def failed(self, segment: str, ledger_id: int, first: int, last: int, exc: BaseException) -> None:
        now = self._clock()
        old = self._failures.get(segment)
        self._failures[segment] = TierReadFailure(
            segment,
            _object_of(segment, exc),
            ledger_id,
            first,
            last,
            kind_of(exc),
            str(exc),
            old.since if old is not None else now,
            now,
            (old.failed_reads if old is not None else 0) + 1,
        )

    def read(self, segment: str, ledger_id: int, first: int, last: int) -> None:
        """A read of ``first..last`` succeeded: a failure of entries within them is over. (A read of
        other entries of the segment says nothing about the damaged ones.)"""
        old = self._failures.get(segment)
        if old is not None and old.ledger_id == ledger_id and first <= old.first and old.last <= last:
            del self._failures[segment]

    def forget(self, segment: str) -> None:
        """The segment's objects were deleted (its ledgers trimmed): nothing left to read."""
        self._failures.pop(segment, None)
