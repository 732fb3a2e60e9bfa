"""Waiting on conditions with deadlines (never fixed sleeps as synchronisation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path


async def wait_until(predicate: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if await predicate():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


def wait_until_sync(predicate: Callable[[], bool], within: float, what: str) -> None:
    """``wait_until`` for tests that are not coroutines (raw sockets, threads)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what}")
        time.sleep(0.05)


async def wait_for_line(path: Path, prefix: str, within: float) -> str:
    found: list[str] = []

    def scan() -> bool:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    found.append(line)
                    return True
        return False

    async def has_line() -> bool:
        return await asyncio.to_thread(scan)

    await wait_until(has_line, within, f"a line starting {prefix!r} in {path}")
    return found[0]
