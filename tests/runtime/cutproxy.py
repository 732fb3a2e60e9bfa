"""A TCP proxy in front of a store pod that cuts a connection at a chosen point (real sockets).

Why: "the connection went away mid-block" and "the answer was lost" must be produced exactly, not
hoped for by timing: the proxy counts the bytes it forwards and, once a rule matches, stops forwarding
and closes both sides of that connection. Later connections are forwarded untouched unless a new rule
is armed. ``refusing`` turns every new connection away (closed at once) until it is cleared, so a
client's reconnects fail for as long as a test needs, e.g. while another client writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class CutRule:
    """Cut when ``upstream_bytes`` client->server bytes were forwarded (the rest of that read is
    dropped), or, with ``drop_answers``, swallow everything server->client once that many were
    forwarded upstream and cut after ``hold`` more server->client bytes arrived."""

    upstream_bytes: int
    drop_answers: bool = False
    hold: int = 1


class CutProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._rule: CutRule | None = None
        self.refusing = False
        self.refused = 0  # connections turned away while refusing
        self.cuts = 0
        self.cut_done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    def arm(self, rule: CutRule) -> None:
        """Apply ``rule`` to the next connection's traffic (from its first byte)."""
        self._rule = rule
        self.cut_done.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.refused += 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers.update((writer, up_writer))
        rule, self._rule = self._rule, None
        state = {"up": 0, "down_after": 0, "cut": False}

        def cut() -> None:
            if not state["cut"]:
                state["cut"] = True
                self.cuts += 1
                for w in (writer, up_writer):
                    w.transport.abort()
                self.cut_done.set()

        async def upstream() -> None:
            while data := await reader.read(65536):
                if rule is not None and not rule.drop_answers:
                    room = rule.upstream_bytes - state["up"]
                    if len(data) >= room:
                        up_writer.write(data[:room])
                        with contextlib.suppress(ConnectionError):
                            await up_writer.drain()
                        cut()
                        return
                state["up"] += len(data)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if rule is not None and rule.drop_answers and state["up"] >= rule.upstream_bytes:
                    state["down_after"] += len(data)
                    if state["down_after"] >= rule.hold:
                        cut()
                        return
                    continue
                writer.write(data)
                await writer.drain()
            writer.close()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        self._tasks.update(tasks)
        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.gather(*tasks)
        self._tasks.difference_update(tasks)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
