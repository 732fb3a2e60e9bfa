"""Which asyncio event loop a runtime process runs on.

Why it exists: every log record, frame and acknowledgement costs a few event-loop callbacks, and at
the rates a pod serves (100,000+ records/s) the loop's own bookkeeping is a quarter of the CPU. uvloop
(libuv, in C) does that bookkeeping for about half the cost and is what large asyncio services run
on; the standard loop stays available (``--event-loop asyncio``) for debugging and for platforms
without uvloop. The code never depends on which loop runs it: the test suite runs on the standard one.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")


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


def run(main: Coroutine[Any, Any, T], choice: str | None = "auto") -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if resolve(choice) == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
