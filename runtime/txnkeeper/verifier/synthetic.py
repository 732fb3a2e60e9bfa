"""Synthetic pods: real aiohttp admin endpoints serving made-up ledgers documents (contracts §5).

The verifier's tests and benchmark need many pods with precise, sometimes broken, answers (unreachable,
hanging, malformed) without running thousands of stores for real. Each synthetic pod listens on its own
127.0.0.1 port, like a real pod on its own IP, and all of them are served by one event loop on a
background thread, so they work from synchronous code and from Spark's worker processes alike.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from txnkeeper.verifier.fetch import LEDGERS_PATH
from txnkeeper.verifier.model import PodEndpoint


@dataclass(frozen=True)
class PodAnswer:
    """What one synthetic pod answers to GET /admin/v1/stores/ledgers."""

    body: bytes
    status: int = 200
    hang: bool = False  # accept the request and never answer (until the servers stop)

    @classmethod
    def document(cls, document: object, status: int = 200) -> PodAnswer:
        return cls(json.dumps(document).encode(), status)

    @classmethod
    def raw(cls, body: bytes, status: int = 200) -> PodAnswer:
        return cls(body, status)

    @classmethod
    def hanging(cls) -> PodAnswer:
        return cls(b"", hang=True)


def store_entry(
    name: str,
    ledgers: Sequence[int],
    *,
    kind: str = "txnlog",
    batched: int = 0,
    unbatched: int = 10,
    positions: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One store in the shape of contracts §5."""
    last = ledgers[-1] if ledgers else 0
    live_positions = (
        list(positions) if positions is not None else [f"{last}:{i}" for i in range(min(batched, 20))]
    )
    return {
        "name": name,
        "kind": kind,
        "ledgers": list(ledgers),
        "oldestLiveLedger": min(ledgers) if ledgers else None,
        "currentLedger": max(ledgers) if ledgers else 0,
        "liveEntries": {"batched": batched, "unbatched": unbatched},
        "liveBatchedPositions": live_positions,
    }


def pod_document(pod: str, stores: Iterable[dict[str, Any]], release: str = "2.0.0") -> dict[str, Any]:
    return {"pod": pod, "release": release, "formatLevel": 2, "stores": list(stores)}


class SyntheticPods:
    """Many synthetic pods on one background event loop; use as a context manager."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="synthetic-pods", daemon=True)
        self._answers: dict[tuple[str, int], PodAnswer] = {}
        self._names: dict[str, tuple[str, int]] = {}
        self._runner: web.AppRunner | None = None
        self._release_hangers: asyncio.Event | None = None
        self._dead_sockets: list[socket.socket] = []

    def __enter__(self) -> SyntheticPods:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()

    async def _start(self) -> None:
        self._release_hangers = asyncio.Event()
        app = web.Application()
        app.router.add_get(LEDGERS_PATH, self._handle)
        # verify-offload's input: a synthetic pod answers it with the same configured document.
        app.router.add_get("/admin/v1/offload/summary", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        answer = self._answers.get((sockname[0], sockname[1])) if sockname else None
        if answer is None:
            return web.json_response({"error": "no such synthetic pod"}, status=404)
        if answer.hang:
            assert self._release_hangers is not None
            await self._release_hangers.wait()
            return web.json_response({"error": "shutting down"}, status=503)
        return web.Response(body=answer.body, status=answer.status, content_type="application/json")

    def add_pod(self, name: str, answer: PodAnswer, host: str = "127.0.0.1", port: int = 0) -> PodEndpoint:
        """Start a pod listening on `host:port` (a fresh port by default); returns its endpoint (named,
        so the document's pod name is checked). Distinct 127.0.0.x hosts sharing one port stand for
        pods on their own IPs, as a cluster gives them."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, port))
        sock.listen(128)
        address = (host, sock.getsockname()[1])
        self._answers[address] = answer
        self._names[name] = address
        asyncio.run_coroutine_threadsafe(self._add_site(sock), self._loop).result()
        return PodEndpoint(pod=name, url=f"http://{address[0]}:{address[1]}")

    async def _add_site(self, sock: socket.socket) -> None:
        assert self._runner is not None
        await web.SockSite(self._runner, sock).start()

    def dead_endpoint(self, name: str) -> PodEndpoint:
        """An address that refuses connections: bound (so no one else takes the port), never listening."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._dead_sockets.append(sock)
        return PodEndpoint(pod=name, url=f"http://127.0.0.1:{sock.getsockname()[1]}")

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
        for sock in self._dead_sockets:
            sock.close()

    async def _stop(self) -> None:
        if self._release_hangers is not None:
            self._release_hangers.set()
        if self._runner is not None:
            await self._runner.cleanup()
