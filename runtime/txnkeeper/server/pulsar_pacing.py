"""Pacing of Pulsar clients' begins: a coordinator pod holds a connection's NEW_TXN while too many of
the partitions and subscriptions that connection registered have not reached their store yet.

Why: Pulsar's clients need not wait for a transaction's sends and acks before beginning the next
one (``pulsar-perf transaction`` begins the next as soon as the commit is asked for, and the commit
itself waits for the sends). A coordinator answers a begin in one txn-log append, a store applies a
transactional send after a confirmation with the coordinator and its own append; whenever the store
falls behind for a moment (a busy two-core machine), begins went on at the coordinator's pace and the
client piled up hundreds of transactions whose sends had not landed. When those sends then landed
together, the client fired as many END_TXNs at once, and Apache's Java client, which allows 1,000
coordinator requests in flight and sends the commit from the I/O thread that reads the answers,
blocked that thread for a permit that only it could free: a client deadlock (seen at 16 threads in
six of eight 20-30 s runs, 2026-11-29).

What the coordinator knows of the store's progress: a store confirms each (transaction, partition)
and (transaction, subscription) with the coordinator before it applies the first send or ack of that
transaction there (server/pulsar_txns.py). So a registration the client made (ADD_PARTITION_TO_TXN,
ADD_SUBSCRIPTION_TO_TXN) and no store confirmed yet is a send or ack on its way: in the client's
queues, the sockets, or the store's. While a connection has ``limit`` of them, its NEW_TXN is
answered only once it has fewer, or after ``max_hold_s`` (so a store that is down, or a client that
registered and never sent, slows that client's begins and never stops them). A registration not
confirmed within ``stale_s`` stops counting: its transaction's coordinator id may have moved to
another pod (whose store confirmations come there), or the client gave up on it; the pile this guards
against is one of moments, not of seconds. Only begins are held:
what a client already began goes on at full speed, and other connections are not affected. Nothing is
refused; what Pulsar allows (any number of open transactions) stays allowed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from txnkeeper.txnid import TxnID

# Registrations a connection may have on their way to a store before its begins wait. At 16 threads
# and ~2,000 txn/s pulsar-perf keeps ~50-100 in flight; a pile worth pacing is several times that.
REGISTRATIONS_AHEAD = 256
MAX_HOLD_S = 1.0
STALE_S = 10.0
# Registrations remembered at most (a pod-wide bound on this bookkeeping; the oldest go first).
MAX_TRACKED = 100_000

_Key = tuple[TxnID, str, str]  # (transaction, topic, subscription or "" for a partition)


class BeginPacing:
    """Per coordinator pod: which connection registered what, and the begins held meanwhile."""

    def __init__(
        self,
        limit: int = REGISTRATIONS_AHEAD,
        max_hold_s: float = MAX_HOLD_S,
        max_tracked: int = MAX_TRACKED,
        stale_s: float = STALE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or max_hold_s <= 0 or max_tracked < 1 or stale_s <= 0:
            raise ValueError("pacing needs a positive limit, hold, tracking bound and staleness")
        self._limit = limit
        self._max_hold_s = max_hold_s
        self._max_tracked = max_tracked
        self._stale_s = stale_s
        self._clock = clock
        # registration -> (session id, when registered), oldest first
        self._owner: OrderedDict[_Key, tuple[int, float]] = OrderedDict()
        self._by_txn: dict[TxnID, list[_Key]] = {}
        self._ahead: Counter[int] = Counter()
        self._held: dict[int, list[asyncio.Future[None]]] = {}
        self.begins_held = 0  # NEW_TXNs that waited (metric)

    @property
    def unconfirmed(self) -> int:
        """Registrations no store confirmed yet, over every connection (metric)."""
        return len(self._owner)

    def admit(self, session_id: int) -> asyncio.Future[None] | None:
        """None: answer the begin now; else a future that resolves when it may be answered."""
        if self._ahead[session_id] < self._limit:
            return None
        self._drop_stale()
        if self._ahead[session_id] < self._limit:
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        # Those the hold's bound let go are dropped here: a connection kept over the limit for long
        # does not collect them.
        held = [w for w in self._held.get(session_id, ()) if not w.done()]
        held.append(waiter)
        self._held[session_id] = held
        timer = loop.call_later(self._max_hold_s, _release, waiter)
        waiter.add_done_callback(lambda _f: timer.cancel())
        self.begins_held += 1
        return waiter

    def registered(self, session_id: int, txn: TxnID, items: list[tuple[str, str]]) -> None:
        """The client on ``session_id`` registered these partitions ("" subscription) or subscriptions."""
        owner = self._owner
        now = self._clock()
        for topic, subscription in items:
            key = (txn, topic, subscription)
            if key in owner:
                continue
            owner[key] = (session_id, now)
            self._by_txn.setdefault(txn, []).append(key)
            self._ahead[session_id] += 1
        while len(owner) > self._max_tracked:
            key, (oldest, _) = owner.popitem(last=False)
            self._forget(key, oldest)

    def confirmed(self, txn: TxnID, topic: str, subscription: str) -> None:
        """A store confirmed this registration: its first send or ack reached the store."""
        found = self._owner.pop((txn, topic, subscription), None)
        if found is not None:
            self._forget((txn, topic, subscription), found[0])

    def ended(self, txn: TxnID) -> None:
        """The transaction's end was asked for: what it registered is no longer on its way."""
        for key in self._by_txn.pop(txn, ()):
            found = self._owner.pop(key, None)
            if found is not None:
                self._forget(key, found[0], from_txn=False)

    def session_closed(self, session_id: int) -> None:
        for waiter in self._held.pop(session_id, ()):
            _release(waiter)
        if self._ahead.pop(session_id, 0):
            for key in [k for k, (owner, _) in self._owner.items() if owner == session_id]:
                del self._owner[key]
                self._drop_from_txn(key)

    def _drop_stale(self) -> None:
        owner = self._owner
        horizon = self._clock() - self._stale_s
        while owner:
            key, (session_id, since) = next(iter(owner.items()))
            if since > horizon:
                return
            del owner[key]
            self._forget(key, session_id)

    def _forget(self, key: _Key, session_id: int, *, from_txn: bool = True) -> None:
        if from_txn:
            self._drop_from_txn(key)
        left = self._ahead[session_id] - 1
        if left > 0:
            self._ahead[session_id] = left
        else:
            del self._ahead[session_id]
        if left < self._limit and session_id in self._held:
            for waiter in self._held.pop(session_id):
                _release(waiter)

    def _drop_from_txn(self, key: _Key) -> None:
        keys = self._by_txn.get(key[0])
        if keys is None:
            return
        try:
            keys.remove(key)
        except ValueError:
            return
        if not keys:
            del self._by_txn[key[0]]


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
