"""Asyncio plumbing every layer shares: callback-resolved futures and deferred, batched housekeeping.

Why a module of its own, in the shared low layer: coordinator, topics and the client all complete
requests by future callbacks and batch housekeeping the same way; kept here, none of them imports
another just for this plumbing.

Futures: on the hot path of every transaction a coroutine per step costs a task (or at least a frame
and an extra wake-up) in the pod's event loop; a log append already returns a future, so a request
whose only wait is that append can hand back a future resolved from the append's done callback.

Single flight: opening a partition or subscription (or a ledger) takes disk I/O and must happen once even
when several requests ask for it at the same time; the first caller does it, the others share its outcome.

Deferred batches: deleting an ended transaction's records and applying committed acks to a cursor each
end in a metadata persist (a small file rewritten and fsync'd twice). Done per transaction they compete
with the log appends for the disk's fsyncs; done in one go every few tens of milliseconds they cost
almost nothing, and nothing is lost meanwhile: the durable log still says what must be done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
log = logging.getLogger(__name__)


def resolved(value: T) -> asyncio.Future[T]:
    """A future that is already done with ``value``."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def failure_of(future: asyncio.Future[Any]) -> BaseException | None:
    """The exception a done future ended with (cancellation included), or None."""
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()


def settle(done: asyncio.Future[T], failure: BaseException | None, value: T) -> None:
    """Resolve ``done`` with ``failure`` or ``value`` unless its waiter gave up (cancelled it)."""
    if done.done():
        return
    if failure is None:
        done.set_result(value)
    else:
        done.set_exception(failure)
        done.exception()  # the waiter may be gone: never "exception was never retrieved"


class DeferredBatch(Generic[T]):
    """``add`` queues an item; ``flush(items)`` runs at most every ``interval`` seconds, one at a time."""

    def __init__(self, name: str, flush: Callable[[list[T]], Awaitable[None]], interval: float) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        self._name = name
        self._flush = flush
        self._interval = interval
        self._items: list[T] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None

    def add(self, item: T) -> None:
        self._items.append(item)
        if self._timer is None and self._running is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._running is None and self._items:
            self._running = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._items:
                items, self._items = self._items, []
                try:
                    await self._flush(items)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: deferred work on %d item(s) failed", self._name, len(items))
                if self._items and self._interval:
                    await asyncio.sleep(self._interval)
        finally:
            self._running = None

    async def drain(self) -> None:
        """Handle everything queued now (graceful close)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        if self._items:
            self._running = asyncio.get_running_loop().create_task(self._run())
            await asyncio.gather(self._running, return_exceptions=True)

    @property
    def queued(self) -> int:
        return len(self._items)


class SingleFlight(Generic[K, V]):
    """``run(key, make)``: concurrent callers with the same key share one ``make()`` and its outcome.

    Only while it runs: once ``make()`` ends the key is free again (the caller keeps what it made).
    """

    def __init__(self) -> None:
        self._pending: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, make: Callable[[], Awaitable[V]]) -> V:
        pending = self._pending.get(key)
        if pending is not None:
            # Shielded: one waiter giving up must not cancel the work the others wait for.
            return await asyncio.shield(pending)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            value = await make()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: concurrent callers (if any) re-raise it themselves
            raise
        finally:
            del self._pending[key]
        future.set_result(value)
        return value
