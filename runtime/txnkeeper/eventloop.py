"""Which asyncio event loop a runtime process runs on.

Why it exists: every log record, frame and acknowledgement costs a few event-loop callbacks, and at
the rates a pod serves (100,000+ records/s) the loop's own bookkeeping is a quarter of the CPU. uvloop
(libuv, in C) does that bookkeeping for about half the cost and is what large asyncio services run
on; the standard loop stays available (``--event-loop asyncio``) for debugging and for platforms
without uvloop. The code never depends on which loop runs it: the test suite runs on the standard one.

The loop thread shares the interpreter with the ledger's I/O threads (group-commit writes and fsyncs
run on an executor). A thread coming back from an fsync needs the GIL, and a busy loop thread gives it
up only every ``sys.getswitchinterval()``: 5 ms by default, which put up to 5 ms on every durable step
under load (the batched writer's p99 at 256 writers went from 3 to 25 ms in the same run). The runtime
runs with 0.5 ms.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from txnkeeper.contract.settings.interpreter import EVENT_LOOPS

T = TypeVar("T")

CHOICES = EVENT_LOOPS  # declared with the flag (contract/settings/interpreter.py)
IO_SWITCH_INTERVAL_S = 0.0005


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str | None) -> str:
    """``auto`` (or nothing) -> uvloop when installed, else asyncio; refuses unknown names."""
    name = (choice or "auto").strip().lower()
    if name not in CHOICES:
        raise ValueError(f"event loop {choice!r} is unknown; use one of {', '.join(CHOICES)}")
    if name == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if name == "uvloop" and not uvloop_available():
        raise ValueError("event loop 'uvloop' was asked for but uvloop is not installed; pip install uvloop")
    return name


def check_switch_interval(seconds: float) -> float:
    """Refuse a GIL switch interval that is not a positive number of seconds (at most 1 s)."""
    if not 0 < seconds <= 1:
        raise ValueError(
            f"switch interval {seconds * 1000:g} ms is out of range; use a value above 0 and at most"
            f" 1000 ms (the runtime's default is {IO_SWITCH_INTERVAL_S * 1000:g} ms)"
        )
    return seconds


def run(
    main: Coroutine[Any, Any, T],
    choice: str | None = "auto",
    *,
    switch_interval_s: float = IO_SWITCH_INTERVAL_S,
) -> T:
    """``asyncio.run(main)`` on the chosen loop, with the runtime's GIL switch interval."""
    sys.setswitchinterval(check_switch_interval(switch_interval_s))
    if resolve(choice) == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
