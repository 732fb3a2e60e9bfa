"""Which ledgers a trim deletes: every cursor's rule, and Pulsar's retention rule on top of it.

Why its own module: the decision is pure (ledger facts in, ledger ids out), so every case of Pulsar's
rule is a table row (``tests/ledger/test_retention_rule.py``), and ``ManagedLedger.trim`` only takes it
again under the metadata lock.

Pulsar's rule (``ManagedLedgerImpl.internalTrimLedgers``): going from the oldest ledger, a ledger that
every cursor is done with (all of them when there is no cursor), that is closed and not the current
one, is deleted when it is outside retention: with it deleted the managed ledger still holds at least
the retention size (``-1``: infinite, never), or it was closed longer ago than the retention time
(``-1``: infinite). The first ledger inside retention stops the walk, so only a prefix is deleted.
``keep_from`` stops it too: nothing from that ledger on is deleted (a transaction buffer's open
transactions live there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Retention:
    """Pulsar's RetentionPolicies in milliseconds and bytes (-1: infinite, 0: none)."""

    time_ms: int
    size_bytes: int


class LedgerFacts(NamedTuple):
    """One live ledger as a trim sees it."""

    ledger_id: int
    entries: int
    size: int  # payload bytes
    closed: bool
    # When it was closed at the latest (unix time: when the next ledger was created), None if unknown
    # or still open: a ledger of unknown age is never expired by time.
    closed_at: float | None


def ledgers_to_trim(
    ledgers: Sequence[LedgerFacts],
    consumed_before: float,
    retention: Retention | None,
    now: float,
    keep_from: int | None = None,
) -> list[int]:
    """The ids to delete, a prefix of ``ledgers`` (ascending): closed ledgers below ``consumed_before``
    (the lowest ledger a cursor still needs; ``inf`` when none does) and below ``keep_from``; with
    ``retention``, only those outside it (Pulsar's rule above)."""
    total = sum(info.size for info in ledgers)
    deleting = 0
    victims: list[int] = []
    for info in ledgers:
        if not info.closed or info.ledger_id >= consumed_before:
            break
        if keep_from is not None and info.ledger_id >= keep_from:
            break
        if retention is not None:
            deleting += info.size
            over_size = retention.size_bytes >= 0 and total - deleting >= retention.size_bytes
            expired = (
                retention.time_ms >= 0
                and info.closed_at is not None
                and (now - info.closed_at) * 1000 > retention.time_ms
            )
            if not (over_size or expired):
                break
        victims.append(info.ledger_id)
    return victims
