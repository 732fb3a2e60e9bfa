"""Positions and entries: the addresses and units of a managed ledger (Pulsar's PositionImpl/Entry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Position(NamedTuple):
    """(ledgerId, entryId), ordered; entry id -1 means "before the first entry of that ledger".

    A named tuple, not a dataclass: positions are built and hashed for every entry written, read,
    acknowledged and deleted, and a tuple's construction and hash run in C (a frozen dataclass's
    generated ``__init__``/``__hash__`` were ~4% of a store pod's CPU). It compares equal to the plain
    ``(ledger_id, entry_id)`` tuple.
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse Pulsar's "ledgerId:entryId" form, with a clear error for anything else."""
        ledger, sep, entry = text.partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(int(ledger), int(entry))
        except ValueError:
            raise ValueError(f"position {text!r} is not of the form 'ledgerId:entryId'") from None


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored entry and where it lives."""

    position: Position
    data: bytes
