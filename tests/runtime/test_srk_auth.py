"""Writer ids and producer names belong to the client's credential (issue 25 item 12), against a real
store process over real sockets.

A store given a client token key (``serve --client-token-key-file``) authenticates connections that
present a token (``ClientAuth``); a writer id or producer name is then the principal's: another
principal's SetupAppend of the same id, even a ``resume`` with the first client's own instance token,
reaches a writer of its own and never fences, reads or exhausts the first one's. Within one principal
the newest session still takes the id over (a restarted application instance).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_pods import ServePod, http
from srk_wire import SrkWire

from txnkeeper.client import Client, MessageId, WriterFencedError
from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.clientauth import ClientTokenKey

pytestmark = pytest.mark.timeout(240)

TOPIC = "persistent://t/ns/auth"
KEY = b"k" * 24 + b"0123456789abcdef"  # 40 bytes


def _store(pods: Callable[..., ServePod], tmp_path: Path) -> ServePod:
    key_file = tmp_path / "client-token.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    extra = ["--srk-enabled", "true", "--client-token-key-file", str(key_file)]
    return pods("pas-0", "store", release="3.0.0", extra=extra)


def _token(principal: str, **kwargs: int) -> str:
    return ClientTokenKey(KEY).create_token(principal, **kwargs)


async def read_all(client: Client, sentinel: bytes) -> list[tuple[bytes, MessageId]]:
    consumer = await client.subscribe(TOPIC, "audit")
    producer = await client.create_producer(TOPIC)
    await producer.send(sentinel)
    seen: list[tuple[bytes, MessageId]] = []
    while True:
        message = await consumer.receive(timeout=60)
        if message.data == sentinel:
            return seen
        seen.append((message.data, message.message_id))


async def test_another_principal_cannot_take_over_a_writer_id_or_a_producer_name(
    pods: Callable[..., ServePod], tmp_path: Path
) -> None:
    store = _store(pods, tmp_path)
    async with (
        Client(coordinators=[], stores=[store.listen], auth_token=_token("alice")) as alice,
        Client(coordinators=[], stores=[store.listen], auth_token=_token("bob")) as bob,
    ):
        writer = await alice.create_single_key_writer(TOPIC, "k", 60_000, writer_id="w")
        async with writer.begin_transaction() as txn:
            txn.write(b"alice-0")
        producer = await alice.create_producer(TOPIC, producer_name="app")
        a0 = await producer.send(b"alice-send-0")
        assert alice.principals == {store.listen: "alice"}

        # Bob opens the same writer id and producer name: his own, starting from scratch.
        bobs_writer = await bob.create_single_key_writer(TOPIC, "k", 60_000, writer_id="w")
        assert bobs_writer.last_event_number == -1
        async with bobs_writer.begin_transaction() as txn:
            txn.write(b"bob-0")
        bobs_producer = await bob.create_producer(TOPIC, producer_name="app")
        assert bobs_producer.last_sequence_id == -1
        b0 = await bobs_producer.send(b"bob-send-0")

        # Even a resume with Alice's own instance token, on Bob's authenticated connection.
        wire = await SrkWire.open(store.listen)
        assert await wire.authenticate(_token("bob")) == "bob"
        alice_instance = producer._sequenced._instance  # type: ignore[union-attr]
        with pytest.raises(ServiceError) as resumed:  # it reaches Bob's "app", held by Bob's producer
            await wire.setup_producer(TOPIC, "app", alice_instance, resume=True)
        assert resumed.value.code == api.WRITER_FENCED and "principal 'bob'" in str(resumed.value)
        assert await wire.setup(TOPIC, "w") == 0  # Bob's writer, not Alice's
        wire.close()

        # Alice was never fenced: her writer and producer go on where they were.
        async with writer.begin_transaction() as txn:
            txn.write(b"alice-1")
        assert writer.last_event_number == 1
        a1 = await producer.send(b"alice-send-1")
        assert producer.last_sequence_id == 1

        # Within one principal the newest session still takes the id over.
        async with Client(coordinators=[], stores=[store.listen], auth_token=_token("alice")) as again:
            restarted = await again.create_single_key_writer(TOPIC, "k", 60_000, writer_id="w")
            assert restarted.last_event_number == 1
            txn = writer.begin_transaction()
            txn.write(b"alice-zombie")
            with pytest.raises(WriterFencedError):
                await txn.commit()

        status, view = http("GET", f"{store.admin_url()}/admin/v1/topics/writers?topic={TOPIC}")
        assert status == 200
        rows = {(row["principal"], row["writerId"]): row["lastEventNumber"] for row in view["writers"]}
        assert rows == {("alice", "w"): 1, ("bob", "w"): 0, ("alice", "app"): 1, ("bob", "app"): 0}
        seen = dict(await read_all(alice, b"end"))
        assert seen[b"alice-send-0"] == a0 and seen[b"alice-send-1"] == a1 and seen[b"bob-send-0"] == b0
        assert sorted(seen) == sorted(
            [b"alice-0", b"alice-1", b"alice-send-0", b"alice-send-1", b"bob-0", b"bob-send-0"]
        )

    # The binding survives a restart: the state is kept under each principal's name.
    store.restart()
    async with Client(coordinators=[], stores=[store.listen], auth_token=_token("bob")) as bob:
        assert (await bob.create_single_key_writer(TOPIC, "k", 60_000, writer_id="w")).last_event_number == 0


async def test_sessions_need_a_valid_token_on_a_store_that_authenticates_clients(
    pods: Callable[..., ServePod], tmp_path: Path
) -> None:
    store = _store(pods, tmp_path)
    wire = await SrkWire.open(store.listen)
    with pytest.raises(ServiceError) as anonymous:
        await wire.setup(TOPIC, "w")
    assert anonymous.value.code == api.UNAUTHORIZED and "ClientAuth" in str(anonymous.value)
    with pytest.raises(ServiceError) as forged:
        await wire.authenticate(ClientTokenKey(b"x" * 40).create_token("alice"))
    assert forged.value.code == api.UNAUTHORIZED and "signature" in str(forged.value)
    with pytest.raises(ServiceError) as expired:
        await wire.authenticate(_token("alice", expires_at=int(time.time()) - 1))
    assert expired.value.code == api.UNAUTHORIZED and "expired" in str(expired.value)
    assert await wire.authenticate(_token("alice")) == "alice"
    with pytest.raises(ServiceError) as switch:
        await wire.authenticate(_token("bob"))
    assert switch.value.code == api.UNAUTHORIZED and "new connection" in str(switch.value)
    assert await wire.setup(TOPIC, "w") == -1
    wire.close()
    # Plain produce and consume need no token.
    async with Client(coordinators=[], stores=[store.listen]) as anonymous_client:
        await (await anonymous_client.create_producer(TOPIC)).send(b"plain")
    # The client library reports a refused token when it connects.
    async with Client(coordinators=[], stores=[store.listen], auth_token="not-a-token") as bad:
        with pytest.raises(ServiceError, match="not a JWT"):
            await bad.create_producer(TOPIC, producer_name="app")


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (b"k" * 40, 0o644, "has mode 0644"),
        (b"k" * 40, 0o620, "has mode 0620"),
        (b"short", 0o600, "holds 5 bytes; it needs at least 32"),
        (b"   \n", 0o600, "is empty"),
    ],
)
def test_serve_refuses_a_client_token_key_file_that_is_open_or_short(
    tmp_path: Path, content: bytes, mode: int, says: str
) -> None:
    key_file = tmp_path / "client-token.key"
    key_file.write_bytes(content)
    key_file.chmod(mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXNKEEPER_")}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "txnkeeper.cli", "serve", "--role", "store"),
            *("--data-dir", str(tmp_path / "data"), "--admin-listen", "127.0.0.1:0"),
            *("--listen", "127.0.0.1:0", "--client-token-key-file", str(key_file)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and str(key_file) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()  # refused before touching the data directory


CREATE = (sys.executable, "-m", "txnkeeper.cli", "client-token", "create", "--key-file")


def test_client_token_create_prints_a_token_the_store_accepts(tmp_path: Path) -> None:
    key_file = tmp_path / "client-token.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    created = subprocess.run(
        [*CREATE, str(key_file), "--principal", "tenant-a", "--expires-in", "3600"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = created.stdout.strip()
    now = time.time()
    assert ClientTokenKey(KEY).principal_of(token, now) == "tenant-a"
    with pytest.raises(ServiceError, match="expired"):
        ClientTokenKey(KEY).principal_of(token, now + 3601)
    refused = subprocess.run(
        [*CREATE, str(key_file), "--principal", "a\nb"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "control character" in refused.stderr
