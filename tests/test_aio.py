"""txnkeeper.aio.SingleFlight: concurrent callers of one key share one run and its outcome, a waiter that
gives up does not cancel it, and the key is free again once the run ended."""

from __future__ import annotations

import asyncio

import pytest

from txnkeeper.aio import SingleFlight


async def test_concurrent_callers_share_one_run_and_its_value() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    release = asyncio.Event()
    both_started = asyncio.Event()
    runs = 0

    async def make() -> int:
        nonlocal runs
        runs += 1
        mine = runs
        if runs == 2:
            both_started.set()
        await release.wait()
        return mine

    first = asyncio.ensure_future(flight.run("p", make))
    second = asyncio.ensure_future(flight.run("p", make))
    other = asyncio.ensure_future(flight.run("q", make))
    await asyncio.wait_for(both_started.wait(), 30)  # "q" started too: "p"'s second caller has joined
    release.set()
    values = await asyncio.wait_for(asyncio.gather(first, second, other), 30)
    assert runs == 2
    assert values[0] == values[1]
    assert values[2] != values[0]


async def test_a_failure_reaches_every_waiter_and_frees_the_key() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    release = asyncio.Event()

    async def failing() -> int:
        await release.wait()
        raise OSError("disk full")

    first = asyncio.ensure_future(flight.run("p", failing))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(flight.run("p", failing))
    await asyncio.sleep(0)
    release.set()
    for waiter in (first, second):
        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(waiter, 30)

    async def working() -> int:
        return 7

    assert await flight.run("p", working) == 7


async def test_a_waiter_giving_up_does_not_cancel_the_shared_run() -> None:
    flight: SingleFlight[str, str] = SingleFlight()
    release = asyncio.Event()
    started = asyncio.Event()

    async def make() -> str:
        started.set()
        await release.wait()
        return "opened"

    owner = asyncio.ensure_future(flight.run("p", make))
    await asyncio.wait_for(started.wait(), 30)
    impatient = asyncio.ensure_future(flight.run("p", make))
    await asyncio.sleep(0)
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    release.set()
    assert await asyncio.wait_for(owner, 30) == "opened"
