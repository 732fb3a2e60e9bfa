"""Turning a response future into the value an application awaits, without a coroutine per call.

Why: sends and acks are the client's hot path; returning a future chained by a callback lets an
application start several of them at once (or gather them) without a task each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar, cast

from txnkeeper.aio import failure_of, settle
from txnkeeper.pb import txnkeeper_api_pb2 as api

T = TypeVar("T")


def then(response: Awaitable[api.Command], convert: Callable[[api.Command], T]) -> asyncio.Future[T]:
    """A future resolved with ``convert(response)``, or failed as ``response`` (or ``convert``) fails."""
    result: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    asyncio.ensure_future(response).add_done_callback(partial(_converted, convert, result))
    return result


def converted(
    convert: Callable[[api.Command], T], response: asyncio.Future[api.Command]
) -> tuple[BaseException | None, T | None]:
    """(failure, value) of a done response: its own failure, ``convert``'s, or the converted value."""
    failure = failure_of(response)
    if failure is not None:
        return failure, None
    try:
        return None, convert(response.result())
    except Exception as exc:
        return exc, None


def _converted(
    convert: Callable[[api.Command], T], result: asyncio.Future[T], response: asyncio.Future[api.Command]
) -> None:
    failure, value = converted(convert, response)
    settle(result, failure, cast(T, value))
