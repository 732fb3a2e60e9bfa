"""A test peer that plays a pod whose shard (or coordinator id) moved to another pod: a real process on
a real socket speaking the own protocol through ``protocol.server.ProtocolServer``.

Why a peer of its own: the client's and the coordinator's placement following must be tested against
real answers, before and independently of the store pods' own placement enforcement. It is not a mock
of a store: it never serves anything; it only says "not here, there" the way a pod does (contracts §12).

Modes (``--mode``):
- ``redirect``: every request is answered ``NOT_SERVED_HERE`` with ``owner_address = --owner``.
- ``move``: until SIGUSR1 every connection is forwarded byte for byte to ``--owner`` (the pod still
  serves the topic; clients see the real store behind this address). On SIGUSR1 the forwarded
  connections are cut (as a pod closes a shard's clients when it fences it), then for ``--moving-ms``
  every request is answered ``NOT_SERVED_HERE`` without an owner ("being moved: retry"), and from then on
  with the owner. So a client's topic "moves" from this address to the owner's, which holds the very
  same data (as a target pod holds what it received), dedup state included.

The ports file gets ``{"listen": "host:port"}``; ``<ports file>.stats`` counts the refusals answered.

    python redirector.py --owner 127.0.0.1:6651 --ports-file /tmp/r.json [--mode move --moving-ms 500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

from txnkeeper.errors import NotServedHereError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.server import HandlerResult, ProtocolServer, Session

EPOCH = 7  # the placement epoch the refusals carry (any epoch >= 1 marks them as placement answers)


class Refuser:
    """The ``CommandHandler``: refuses every request as a pod that does not serve it."""

    def __init__(self, owner: str, stats: Path) -> None:
        self.owner = owner
        self.moving_until = 0.0  # time.monotonic() until which refusals name no owner
        self.counts = {"redirects": 0, "moving": 0}
        self._stats = stats

    def handle(self, session: Session, body_name: str, command: api.Command) -> HandlerResult:
        moving = time.monotonic() < self.moving_until
        self.counts["moving" if moving else "redirects"] += 1
        tmp = self._stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.counts))
        tmp.replace(self._stats)
        if moving:
            raise NotServedHereError(
                f"{body_name}: the shard is being moved off this pod; retry shortly", placement_epoch=EPOCH
            )
        raise NotServedHereError(
            f"{body_name}: served by {self.owner}, not this pod",
            owner_address=self.owner,
            placement_epoch=EPOCH,
        )

    def session_closed(self, session: Any) -> None:
        return None

    def session_holds_state(self, session: Any) -> bool:
        return False

    def session_writable(self, session: Any) -> None:
        return None


class Front:
    """The listening socket: forwards each connection to the owner (before the move) or to the
    refusing protocol server (after it)."""

    def __init__(self, owner: str, refuser_address: tuple[str, int], forwarding: bool) -> None:
        host, _, port = owner.rpartition(":")
        self._owner = (host, int(port))
        self._refuser = refuser_address
        self.forwarding = forwarding
        self._forwarded: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def cut_forwarded(self) -> None:
        self.forwarding = False
        for writer in list(self._forwarded):
            writer.transport.abort()
        self._forwarded.clear()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        forwarding = self.forwarding
        target = self._owner if forwarding else self._refuser
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.transport.abort()
            return
        if forwarding:
            self._forwarded.update((writer, up_writer))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            self._forwarded.discard(w)
            w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


async def run(args: argparse.Namespace) -> None:
    ports_file = Path(args.ports_file)
    refuser = Refuser(args.owner, ports_file.with_suffix(".stats"))
    protocol = ProtocolServer(refuser)
    await protocol.start("127.0.0.1", 0)
    front = Front(args.owner, ("127.0.0.1", protocol.port), forwarding=args.mode == "move")
    server = await asyncio.start_server(front.accept, "127.0.0.1", 0)
    loop = asyncio.get_running_loop()

    def start_move() -> None:
        refuser.moving_until = time.monotonic() + args.moving_ms / 1000
        front.cut_forwarded()

    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, start_move)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    port = server.sockets[0].getsockname()[1]
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"listen": f"127.0.0.1:{port}"}))
    tmp.replace(ports_file)
    await stop.wait()
    server.close()
    await protocol.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owner", required=True, help="host:port of the pod that serves what is asked")
    parser.add_argument("--ports-file", required=True)
    parser.add_argument("--mode", choices=("redirect", "move"), default="redirect")
    parser.add_argument("--moving-ms", type=int, default=0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
