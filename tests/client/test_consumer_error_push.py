"""A store's ConsumerError push (issue 25 item 9): what the client's ``Consumer.receive`` makes of the
pushes a store may send, well-formed or not, and that a store refuses the push sent as a request.

The client side runs against an in-process server over a real socket that answers Subscribe and then
pushes exactly the frames each case needs; the store side against a real ``txnkeeper serve`` pod.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from txnkeeper.client import Client, DataUnreadableError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import connect
from txnkeeper.protocol.server import ProtocolServer, Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_pods import ServePod

pytestmark = pytest.mark.timeout(120)
TOPIC = "persistent://public/default/pushed"


@dataclass
class PushingStore:
    """Answers Subscribe, remembers the session and the consumer id, and pushes what a test says."""

    sessions: list[tuple[Session, int]] = field(default_factory=list)
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)

    def handle(self, session: Session, body_name: str, command: api.Command) -> api.Command:
        if body_name == "subscribe":
            self.sessions.append((session, command.subscribe.consumer_id))
            self.subscribed.set()
        return api.Command(success=api.Success())

    def session_closed(self, session: Session) -> None:
        return None

    def session_holds_state(self, session: Session) -> bool:
        return True

    def session_writable(self, session: Session) -> None:
        return None

    def push(self, make: Callable[[int], api.Command]) -> None:
        session, consumer_id = self.sessions[-1]
        session.push(make(consumer_id))


def failure(
    consumer_id: int, message: str = "cannot read", after: tuple[int, int] | None = (3, 7)
) -> api.Command:
    command = api.Command()
    command.consumer_error.consumer_id = consumer_id
    command.consumer_error.error.code = api.DATA_UNREADABLE
    command.consumer_error.error.message = message
    if after is not None:
        command.consumer_error.after.ledger_id, command.consumer_error.after.entry_id = after
    return command


def message(consumer_id: int, entry: int) -> api.Command:
    command = api.Command()
    command.message.consumer_id = consumer_id
    command.message.message_id.ledger_id = 3
    command.message.message_id.entry_id = entry
    command.message.payload = f"m{entry}".encode()
    return command


@pytest.fixture
async def pushing() -> AsyncIterator[tuple[PushingStore, Client]]:
    store = PushingStore()
    server = ProtocolServer(store)
    await server.start("127.0.0.1", 0)
    client = Client(coordinators=[], stores=[f"127.0.0.1:{server.port}"], operation_timeout=10)
    yield store, client
    await client.close()
    await server.close()


def _no_error(consumer_id: int) -> api.Command:
    command = api.Command()
    command.consumer_error.consumer_id = consumer_id
    return command


def _huge(consumer_id: int) -> api.Command:
    return failure(consumer_id, "x" * 1_000_000)


# (pushes before a message at entry 8, what receive raises first: None: the message itself)
CASES: dict[str, tuple[list[Callable[[int], api.Command]], tuple[type[ServiceError], str] | None]] = {
    "an error": ([failure], (DataUnreadableError, "cannot read")),
    "for another consumer id": ([lambda c: failure(c + 1000)], None),
    "three errors in a row: one raise, the newest": (
        [lambda c: failure(c, "first"), lambda c: failure(c, "second"), lambda c: failure(c, "third")],
        (DataUnreadableError, "third"),
    ),
    "no error body": ([_no_error], (ServiceError, "gave no reason")),
    "no position": ([lambda c: failure(c, after=None)], (DataUnreadableError, "cannot read")),
    "a message of 1 MB": ([_huge], (DataUnreadableError, "x" * 1000)),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_what_receive_makes_of_a_pushed_consumer_error(
    pushing: tuple[PushingStore, Client], case: str
) -> None:
    store, client = pushing
    pushes, raised = CASES[case]
    consumer = await client.subscribe(TOPIC, "s")
    await store.subscribed.wait()
    store.push(lambda c: message(c, 7))
    for push in pushes:
        store.push(push)
    store.push(lambda c: message(c, 8))
    assert (await consumer.receive(timeout=30)).data == b"m7"  # what came before is handed out first
    if raised is not None:
        kind, text = raised
        with pytest.raises(kind) as exc:
            await consumer.receive(timeout=30)
        assert type(exc.value) is kind and text in str(exc.value)
    assert (await consumer.receive(timeout=30)).data == b"m8"  # and the consumer goes on


@pytest.fixture
def store_pod(tmp_path: Path) -> Iterator[ServePod]:
    pod = ServePod(tmp_path, "pas-0", "store").start()
    yield pod
    pod.stop()


def _a_message(consumer_id: int) -> api.Command:
    return message(consumer_id, 0)


@pytest.mark.parametrize("push", [failure, _a_message, _no_error, _huge])
async def test_a_store_refuses_a_push_sent_to_it_as_a_request(
    store_pod: ServePod, push: Callable[[int], api.Command]
) -> None:
    conn = await connect(store_pod.listen)
    try:
        with pytest.raises(ServiceError) as refused:
            await conn.request(push(1), 10)
        assert refused.value.code == api.BAD_REQUEST
        assert "is not a request a server accepts" in str(refused.value)
        assert conn.is_open  # and the connection stays usable
    finally:
        conn.close()


async def test_a_not_served_here_push_moves_the_consumer_to_the_owner() -> None:
    """A store that stops serving the topic (its shard moved, contracts §12) says so by a push naming
    the owner: the consumer resubscribes there and raises nothing."""
    old, new = PushingStore(), PushingStore()
    servers = [ProtocolServer(old), ProtocolServer(new)]
    for server in servers:
        await server.start("127.0.0.1", 0)
    old_address, new_address = (f"127.0.0.1:{s.port}" for s in servers)
    async with Client(coordinators=[], stores=[old_address], operation_timeout=10) as client:
        consumer = await client.subscribe(TOPIC, "s")
        await old.subscribed.wait()
        old.push(lambda c: message(c, 7))

        def moved(consumer_id: int) -> api.Command:
            command = api.Command()
            command.consumer_error.consumer_id = consumer_id
            command.consumer_error.error.code = api.NOT_SERVED_HERE
            command.consumer_error.error.message = "the shard moved"
            command.consumer_error.error.owner_address = new_address
            command.consumer_error.error.placement_epoch = 5
            return command

        old.push(moved)
        await asyncio.wait_for(new.subscribed.wait(), 30)
        assert consumer.store_address == new_address and client.store_for(TOPIC) == new_address
        new.push(lambda c: message(c, 8))
        received = await consumer.receive(timeout=30)
        # m7 may have been dropped with the old connection's queue (the new owner redelivers it).
        assert received.data in (b"m7", b"m8")
        if received.data == b"m7":
            assert (await consumer.receive(timeout=30)).data == b"m8"
    for server in servers:
        await server.close()
