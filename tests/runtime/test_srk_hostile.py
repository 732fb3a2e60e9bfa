"""Hostile inputs for the commands of single-key writers, named producers and client authentication
(SetupAppend, AppendBlockEnd, a named Produce, ClientAuth), against one real store pod that
authenticates clients: each is refused with the right code and a message saying what was wrong, and
the connection and everything already acknowledged stay usable."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from runtime_pods import ServePod, http
from srk_wire import SrkWire

from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import encode_events
from txnkeeper.protocol.clientauth import ClientTokenKey

pytestmark = pytest.mark.timeout(120)

TOPIC = "persistent://t/ns/hostile-srk"
KEY = b"hostile-table-key-" + b"z" * 22


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServePod]:
    work: Path = tmp_path_factory.mktemp("srk-hostile")
    key_file = work / "client-token.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    extra = ["--srk-enabled", "true", "--client-token-key-file", str(key_file)]
    pod = ServePod(work, "pas-0", "store", release="3.0.0", extra=extra)
    pod.start()
    yield pod
    pod.stop()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(header: object, claims: object, key: bytes = KEY) -> str:
    """A token with any header and claims, signed HS256 with ``key`` (whatever the header says)."""
    head, body = _b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode())
    signature = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


HS256 = {"alg": "HS256", "typ": "JWT"}
GOOD = ClientTokenKey(KEY).create_token("tester")

# (token, what the refusal says)
BAD_TOKENS: list[tuple[str, str]] = [
    ("", "carries no token"),
    ("not-a-token", "not a JWT"),
    ("a.b", "not a JWT"),
    ("a.b.c.d", "not a JWT"),
    ("!!!.e30.e30", "not base64url"),
    (_b64(b"not json") + ".e30.e30", "header is not JSON"),
    (_b64(b"[1]") + ".e30.e30", "header is not a JSON object"),
    (_b64(json.dumps({"alg": "none"}).encode()) + "." + _b64(b'{"sub":"tester"}') + ".", "HS256 tokens only"),
    (forge({"alg": "HS512"}, {"sub": "tester"}), "HS256 tokens only"),
    (forge(HS256, {"sub": "tester"}, key=b"another-key-" + b"y" * 30), "signature does not match"),
    (GOOD[:-2] + ("AA" if not GOOD.endswith("AA") else "BB"), "signature does not match"),
    (forge(HS256, {"role": "tester"}), "names no principal"),
    (forge(HS256, {"sub": 123}), "names no principal"),
    (forge(HS256, {"sub": ""}), "'sub' claim"),
    (forge(HS256, {"sub": "a\u001fb"}), "'sub' claim"),
    (forge(HS256, {"sub": "a\nb"}), "'sub' claim"),
    (forge(HS256, {"sub": "p" * 257}), "'sub' claim"),
    (forge(HS256, ["sub", "tester"]), "payload is not a JSON object"),
    (forge(HS256, {"sub": "tester", "exp": int(time.time()) - 5}), "expired"),
    (forge(HS256, {"sub": "tester", "exp": "tomorrow"}), "'exp' claim is not a number"),
    (forge(HS256, {"sub": "tester", "exp": True}), "'exp' claim is not a number"),
    (forge(HS256, {"sub": "tester", "exp": 1e300}), "'exp' claim is not a number"),
    (forge(HS256, {"sub": "tester", "nbf": int(time.time()) + 3600}), "not valid yet"),
    (forge(HS256, {"sub": "tester", "pad": "x" * 9000}), "more than 8192"),
    ("\u00e9\u00e9.\u00e9.\u00e9", "not base64url"),
]


@pytest.mark.parametrize(("token", "says"), BAD_TOKENS, ids=[f"token-{i}" for i in range(len(BAD_TOKENS))])
async def test_a_bad_client_token_is_refused_and_the_connection_stays_usable(
    store: ServePod, token: str, says: str
) -> None:
    wire = await SrkWire.open(store.listen)
    try:
        with pytest.raises(ServiceError) as refused:
            await wire.authenticate(token)
        assert refused.value.code == api.UNAUTHORIZED, refused.value
        assert says in str(refused.value), refused.value
        with pytest.raises(ServiceError) as still_anonymous:  # the refusal authenticated nobody
            await wire.setup(TOPIC, "w")
        assert still_anonymous.value.code == api.UNAUTHORIZED
        assert await wire.authenticate(GOOD) == "tester"
    finally:
        wire.close()


def _setup(topic: str = TOPIC, writer_id: str = "w", session: str = "", resume: bool = False) -> api.Command:
    command = api.Command()
    body = command.setup_append
    body.topic, body.writer_id, body.producer_session, body.resume = topic, writer_id, session, resume
    return command


def _end(first: int, count: int, writer_id: str = "w") -> api.Command:
    block = encode_events([b"e"] * max(count, 1))
    command = api.Command()
    end = command.append_block_end
    end.writer_id, end.first_event_number, end.event_count = writer_id, first, count
    end.total_bytes, end.crc, end.key = block.total_bytes, block.crc, "k"
    return command


def _produce(sequence_id: int, name: str = "p") -> api.Command:
    command = api.Command()
    produce = command.produce
    produce.topic, produce.payload, produce.producer_name, produce.sequence_id = (
        TOPIC,
        b"x",
        name,
        sequence_id,
    )
    return command


# (command, expected code, what the refusal says); sent on an authenticated connection that holds
# a session of writer "w" and of producer "p" on TOPIC.
BAD_COMMANDS: list[tuple[api.Command, int, str]] = [
    (_setup(writer_id=""), api.BAD_REQUEST, "writer id '' must be 1..256"),
    (_setup(writer_id="w" * 257), api.BAD_REQUEST, "must be 1..256"),
    (_setup(writer_id="a\u001fb"), api.BAD_REQUEST, "control character"),
    (_setup(writer_id="a\nb"), api.BAD_REQUEST, "control character"),
    (_setup(writer_id="a\u0000b"), api.BAD_REQUEST, "control character"),
    (_setup(session="s" * 257), api.BAD_REQUEST, "producer_session"),
    (_setup(session="s\u0000"), api.BAD_REQUEST, "producer_session"),
    (_setup(resume=True), api.BAD_REQUEST, "resume needs the producer_session"),
    (_setup(topic=""), api.BAD_REQUEST, "topic name"),
    (_setup(topic="a\u0000b"), api.BAD_REQUEST, "topic name"),
    (_setup(topic="t" * 600), api.BAD_REQUEST, "topic name"),
    (_end(-1, 1), api.BAD_REQUEST, "are not valid"),
    (_end(2**63 - 1, 2), api.BAD_REQUEST, "2^63 - 1"),
    (_end(0, 0), api.BAD_REQUEST, "at least one event"),
    (_end(0, 1, writer_id="never-set-up"), api.BAD_REQUEST, "no SetupAppend"),
    (_produce(2**63), api.BAD_REQUEST, "2^63 - 1"),
    (_produce(2**64 - 1), api.BAD_REQUEST, "2^63 - 1"),
    (_produce(0, name="not-set-up"), api.BAD_REQUEST, "no SetupAppend"),
]


@pytest.mark.parametrize(
    ("command", "code", "says"), BAD_COMMANDS, ids=[f"command-{i}" for i in range(len(BAD_COMMANDS))]
)
async def test_a_hostile_session_command_is_refused_and_nothing_is_registered_or_lost(
    store: ServePod, command: api.Command, code: int, says: str
) -> None:
    wire = await SrkWire.open(store.listen)
    try:
        assert await wire.authenticate(GOOD) == "tester"
        last = await wire.setup(TOPIC, "w")
        written = await wire.append("w", last + 1, [b"before"])  # acknowledged before the refusal
        producer_last = await wire.setup_producer(TOPIC, "p")
        if command.HasField("append_block_end"):  # the block's data, so only the End is wrong
            end = command.append_block_end
            wire.send_chunks(end.writer_id, encode_events([b"e"] * max(end.event_count, 1)).data, 1024)
        with pytest.raises(ServiceError) as refused:
            await wire.conn.request(command, 30)
        assert refused.value.code == code, refused.value
        assert says in str(refused.value), refused.value
        # The connection still serves, and the writer and producer go on where they were.
        assert await wire.setup(TOPIC, "w") == written.event_number
        assert (await wire.append("w", written.event_number + 1, [b"after"])).previous_event_number == (
            written.event_number
        )
        assert await wire.setup_producer(TOPIC, "p") == producer_last
        status, view = http("GET", f"{store.admin_url()}/admin/v1/topics/writers?topic={TOPIC}")
        assert status == 200
        names: Any = {row["writerId"] for row in view["writers"]}
        assert names <= {"w", "p"}, names  # nothing refused left state behind
    finally:
        wire.close()


async def test_client_auth_on_a_store_without_a_key_is_answered_unchecked(
    pods: Callable[..., ServePod],
) -> None:
    pod = pods("pas-0", "store", release="3.0.0", extra=["--srk-enabled", "true"])
    wire = await SrkWire.open(pod.listen)
    assert await wire.authenticate("anything at all") == ""  # nobody is authenticated here
    assert await wire.setup(TOPIC, "w") == -1
    wire.close()
