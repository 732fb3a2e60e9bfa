"""when_all / first_failure: the store's task-free waits on several ends (topic/settled.py)."""

from __future__ import annotations

import asyncio

import pytest

from txnkeeper.topic.settled import first_failure, when_all


async def test_first_failure_waits_for_every_future_and_reports_the_first_failed() -> None:
    loop = asyncio.get_running_loop()
    a, b, c = loop.create_future(), loop.create_future(), loop.create_future()
    combined = first_failure([a, b, c])
    b.set_exception(OSError("b failed"))
    c.set_exception(ValueError("c failed"))
    await asyncio.sleep(0)
    assert not combined.done()  # a is still being written: the end is not over
    a.set_result(1)
    with pytest.raises(OSError, match="b failed"):
        await combined


async def test_first_failure_prefers_a_refusal_given_at_the_call_and_resolves_without_futures() -> None:
    loop = asyncio.get_running_loop()
    ok = loop.create_future()
    ok.set_result(None)
    with pytest.raises(KeyError):
        await first_failure([ok], KeyError("refused at the call"))
    empty = first_failure([])
    await empty
    assert empty.done() and empty.exception() is None
    single = loop.create_future()
    combined = first_failure([single])
    assert not combined.done()
    single.set_result("x")
    await combined
    assert combined.exception() is None


async def test_when_all_calls_back_once_with_every_future_in_order() -> None:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    calls: list[list[object]] = []
    when_all(futures, lambda done: calls.append([f.result() for f in done]))
    for value, future in zip((2, 0, 1), reversed(futures), strict=True):
        future.set_result(value)
    await asyncio.sleep(0)
    assert calls == [[1, 0, 2]]
    when_all([], lambda done: calls.append(list(done)))
    assert calls[-1] == []
