"""Future plumbing for request paths that complete by callback instead of by a coroutine.

Why: on the hot path of every transaction a coroutine per step costs a task (or at least a frame
and an extra wake-up) in the pod's event loop; a log append already returns a future, so a request
whose only wait is that append can hand back a future resolved from the append's done callback.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

T = TypeVar("T")


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
