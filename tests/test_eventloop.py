"""The runtime's choice of event loop: names, refusal of unknown ones, and both loops really run."""

from __future__ import annotations

import asyncio
import sys

import pytest

from txnkeeper import eventloop


async def _loop_class() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_auto_prefers_uvloop_when_installed() -> None:
    expected = "uvloop" if eventloop.uvloop_available() else "asyncio"
    assert eventloop.resolve(None) == expected
    assert eventloop.resolve("auto") == expected
    assert eventloop.resolve(" AsyncIO ") == "asyncio"


def test_unknown_loop_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, uvloop, asyncio"):
        eventloop.resolve("trio")


def test_standard_loop_runs() -> None:
    assert eventloop.run(_loop_class(), "asyncio").startswith("asyncio")


@pytest.mark.skipif(not eventloop.uvloop_available(), reason="uvloop not installed")
def test_uvloop_runs() -> None:
    assert eventloop.run(_loop_class(), "uvloop").startswith("uvloop")


def test_run_applies_the_switch_interval() -> None:
    before = sys.getswitchinterval()
    try:
        eventloop.run(_loop_class(), "asyncio", switch_interval_s=0.002)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("seconds", [0.0, -0.001, 2.0])
def test_switch_interval_out_of_range_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="out of range"):
        eventloop.check_switch_interval(seconds)
