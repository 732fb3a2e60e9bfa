"""Waiting for several futures without a task: ``when_all`` calls back once every one has settled.

Why it exists: a store ends a transaction on a partition and a subscription at once, and answers a
coordinator's batch of ends once each end settled (each with its own outcome). ``asyncio.gather``
wraps every coroutine in a task and fails fast on the first error; the store wants neither: it waits
for all of them (a failed end must not hide the others still being written) and its ends are
futures already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from txnkeeper.aio import failure_of, settle


class _Countdown:
    __slots__ = ("_finish", "_futures", "_left")

    def __init__(
        self, futures: Sequence[asyncio.Future[Any]], finish: Callable[[Sequence[asyncio.Future[Any]]], None]
    ) -> None:
        self._futures = futures
        self._finish = finish
        self._left = len(futures)

    def one_done(self, _: asyncio.Future[Any]) -> None:
        self._left -= 1
        if self._left == 0:
            self._finish(self._futures)


def when_all(
    futures: Sequence[asyncio.Future[Any]], finish: Callable[[Sequence[asyncio.Future[Any]]], None]
) -> None:
    """Call ``finish(futures)`` once every future in ``futures`` is done (at once if none)."""
    if not futures:
        finish(futures)
        return
    countdown = _Countdown(futures, finish)
    for future in futures:
        future.add_done_callback(countdown.one_done)


def first_failure(
    futures: Sequence[asyncio.Future[Any]], failure: BaseException | None = None
) -> asyncio.Future[None]:
    """A future that resolves once all ``futures`` settled: with ``failure`` if given, else with the
    first of them (in order) that failed, else with None."""
    if failure is None and len(futures) == 1:
        only = futures[0]
        result: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        only.add_done_callback(lambda done: settle(result, failure_of(done), None))
        return result
    result = asyncio.get_running_loop().create_future()

    def finish(settled: Sequence[asyncio.Future[Any]]) -> None:
        first = failure
        for future in settled:
            if first is not None:
                break
            first = failure_of(future)
        for future in settled:
            failure_of(future)  # retrieved: no "exception was never retrieved" for the others
        settle(result, first, None)

    when_all(futures, finish)
    return result
