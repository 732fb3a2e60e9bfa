"""Transactions a partition or subscription must keep refusing after it forgot how they ended.

Why: a store forgets ended transactions (a partition once the ledger with the marker is trimmed, a
subscription beyond a bounded memory), but a client may still hold a valid ticket for one until the
transaction's deadline. A message or ack accepted then would belong to a transaction that never ends
there again and hold back dispatch for good. So what is forgotten before its deadline (plus the ticket
grace) is remembered here, by id and deadline only, until then.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from txnkeeper.txnid import TxnID

# Longer than a store's ticket grace (protocol.auth.TICKET_GRACE_MS, 10 s): clock skew between pods.
FENCE_GRACE_MS = 20_000


def now_ms() -> int:
    return int(time.time() * 1000)


class LateFence:
    """txn -> until when (ms, this pod's clock); expired entries are dropped as they are met."""

    __slots__ = ("_clock", "_until")

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        self._until: dict[TxnID, int] = {}
        self._clock = clock

    def add(self, txn_id: TxnID, deadline_ms: int) -> None:
        """Fence ``txn_id`` until its deadline plus the grace (nothing if that has passed or is unknown)."""
        if not deadline_ms:
            return
        now = self._clock()
        until = deadline_ms + FENCE_GRACE_MS
        if until > now:
            self._until[txn_id] = until
        if len(self._until) >= 1024 and len(self._until) % 1024 == 0:
            self._until = {t: u for t, u in self._until.items() if u > now}

    def holds(self, txn_id: TxnID) -> bool:
        if not self._until:
            return False
        until = self._until.get(txn_id)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[txn_id]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)
