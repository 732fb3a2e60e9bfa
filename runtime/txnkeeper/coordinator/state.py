"""The coordinator's view of one transaction and the only transitions it may make (docs/reference.md).

Pure data and rules, no I/O: the coordinator service asks ``check_transition`` before writing an
UPDATE record so the log never holds a transition Pulsar would reject.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from txnkeeper.errors import InvalidTxnStatusError
from txnkeeper.txnid import TxnID


class TxnStatus(IntEnum):
    """Numbered as Pulsar's ``TxnStatus`` enum (the log stores these numbers)."""

    OPEN = 0
    COMMITTING = 1
    COMMITTED = 2
    ABORTING = 3
    ABORTED = 4


_ALLOWED: dict[TxnStatus, frozenset[TxnStatus]] = {
    TxnStatus.OPEN: frozenset({TxnStatus.COMMITTING, TxnStatus.ABORTING}),
    TxnStatus.COMMITTING: frozenset({TxnStatus.COMMITTED}),
    TxnStatus.ABORTING: frozenset({TxnStatus.ABORTED}),
    TxnStatus.COMMITTED: frozenset(),
    TxnStatus.ABORTED: frozenset(),
}

TERMINAL = frozenset({TxnStatus.COMMITTED, TxnStatus.ABORTED})


def check_transition(txn_id: TxnID, current: TxnStatus, new: TxnStatus) -> None:
    """Raise ``InvalidTxnStatusError`` unless ``current -> new`` is a legal transition."""
    if new not in _ALLOWED[current]:
        raise InvalidTxnStatusError(f"transaction {txn_id} is {current.name}; it cannot become {new.name}")


def ending_status(commit: bool) -> tuple[TxnStatus, TxnStatus]:
    """The intermediate and final status of an end: (COMMITTING, COMMITTED) or (ABORTING, ABORTED)."""
    if commit:
        return TxnStatus.COMMITTING, TxnStatus.COMMITTED
    return TxnStatus.ABORTING, TxnStatus.ABORTED


@dataclass(slots=True)
class TxnMeta:
    """One live transaction as the coordinator tracks it."""

    txn_id: TxnID
    status: TxnStatus
    timeout_ms: int
    start_time_ms: int
    last_modification_ms: int
    partitions: list[str] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def deadline_ms(self) -> int:
        return self.start_time_ms + self.timeout_ms

    def add_partitions(self, topics: list[str]) -> list[str]:
        """Record ``topics``; return those not seen before (only they need a log record)."""
        new = [t for t in dict.fromkeys(topics) if t not in self.partitions]
        self.partitions.extend(new)
        return new

    def add_subscriptions(self, subs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        new = [s for s in dict.fromkeys(subs) if s not in self.subscriptions]
        self.subscriptions.extend(new)
        return new
