"""An in-memory stand-in for the ledger's ``add_entry`` seam, for unit tests of the writer's pure logic.

It can hold appends (to test what happens while an fsync is in flight) and fail the next append (to
test batch failure). Integration tests use the real managed ledger instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class MemPosition:
    ledger_id: int
    entry_id: int


class MemLog:
    """Appends entries to a list in call order; positions are (ledger 1, index)."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.gate: asyncio.Event | None = None
        self.fail_next: list[BaseException] = []
        self.appends_started = 0

    def hold(self) -> None:
        """Make appends wait (as if their fsync were slow) until ``release``."""
        self.gate = asyncio.Event()

    def release(self) -> None:
        if self.gate is not None:
            self.gate.set()
            self.gate = None

    async def add_entry(self, data: bytes) -> MemPosition:
        self.appends_started += 1
        if self.fail_next:
            error = self.fail_next.pop(0)
            if self.gate is not None:
                await self.gate.wait()
            raise error
        position = MemPosition(1, len(self.entries))
        self.entries.append(data)  # position assigned in call order, like the real ledger
        if self.gate is not None:
            await self.gate.wait()
        return position
