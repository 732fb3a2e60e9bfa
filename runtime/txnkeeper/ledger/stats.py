"""Pulsar's ManagedLedgerInternalStats shape, built from plain values (see docs/reference.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .position import Position


@dataclass(frozen=True)
class LedgerStat:
    ledger_id: int
    entries: int
    size: int
    offloaded: bool = False  # every entry is in Offloaded segments (PIP-76)


def internal_stats(
    *,
    entries_added: int,
    ledgers: Iterable[LedgerStat],
    current: LedgerStat,
    last_confirmed: Position | None,
    state: str,
    pending_adds: int,
    last_ledger_created: str,
    cursors: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    ledger_list = list(ledgers)
    lac = str(last_confirmed) if last_confirmed is not None else f"{current.ledger_id}:-1"
    return {
        "entriesAddedCounter": entries_added,
        "numberOfEntries": sum(stat.entries for stat in ledger_list),
        "totalSize": sum(stat.size for stat in ledger_list),
        "currentLedgerEntries": current.entries,
        "currentLedgerSize": current.size,
        "lastLedgerCreatedTimestamp": last_ledger_created,
        "pendingAddEntriesCount": pending_adds,
        "lastConfirmedEntry": lac,
        "state": state,
        "ledgers": [
            {
                "ledgerId": stat.ledger_id,
                "entries": stat.entries,
                "size": stat.size,
                "offloaded": stat.offloaded,
                "underReplicated": False,
            }
            for stat in ledger_list
        ],
        "cursors": dict(cursors),
    }
