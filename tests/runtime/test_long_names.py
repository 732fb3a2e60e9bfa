"""One name rule everywhere: any topic or subscription name of 1..512 printable characters works, on
the wire and on the admin API, however many bytes its on-disk form needs; no internal error reaches a
client (issue 25 item 7).

Before, a name that passed the 1..512-character check but whose percent-encoded form exceeded 240
bytes (241 ASCII characters of a topic, 80 emoji) got UNKNOWN_ERROR "ValueError ... too long" on the
wire and HTTP 500 on the offload and internal-stats admin verbs; an ack of a message past the end of
the topic got UNKNOWN_ERROR; an admin URL over 8 KB was answered 400 but logged a traceback at ERROR.
"""

from __future__ import annotations

import socket
import urllib.parse

import pytest
from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client
from txnkeeper.client.message import MessageId
from txnkeeper.errors import BadRequestError
from txnkeeper.ledger.names import encode_name

pytestmark = pytest.mark.timeout(120)

LONG_TOPIC = "persistent://t/ns/" + "a" * 223  # 241 ASCII characters: 251 bytes percent-encoded
EMOJI_TOPIC = "persistent://t/ns/" + "\U0001f600" * 80  # 80 emoji: 960 bytes percent-encoded
EMOJI_SUB = "\U0001f680" * 80
LONG_SUB = "s" * 512  # the longest name the wire accepts


def test_the_names_need_more_than_the_old_on_disk_limit() -> None:
    for name in (LONG_TOPIC, EMOJI_TOPIC, EMOJI_SUB, LONG_SUB):
        safe = (chr(b).isascii() and (chr(b).isalnum() or chr(b) in "_-") for b in name.encode())
        assert sum(1 if ok else 3 for ok in safe) > 240 and len(encode_name(name)) <= 240


async def test_long_names_produce_consume_ack_and_survive_a_restart(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(LONG_TOPIC, EMOJI_SUB)
        other = await client.subscribe(EMOJI_TOPIC, LONG_SUB)
        producer = await client.create_producer(LONG_TOPIC)
        for i in range(3):
            await producer.send(f"m{i}".encode())
        txn = await client.new_transaction()
        await (await client.create_producer(EMOJI_TOPIC)).send(b"in-txn", txn=txn)
        await consumer.acknowledge(await consumer.receive(timeout=10))
        await consumer.acknowledge(await consumer.receive(timeout=10), txn=txn)
        await txn.commit()
        assert (await other.receive(timeout=10)).data == b"in-txn"
    store.restart()
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(LONG_TOPIC, EMOJI_SUB)
        assert (await consumer.receive(timeout=10)).data == b"m2"  # both acks held over the restart
    status, doc = http("GET", f"{store.admin_url()}/admin/v1/topics/internal-stats?" + _q(LONG_TOPIC))
    assert status == 200 and doc["managedLedgerName"] == LONG_TOPIC, doc
    assert EMOJI_SUB in doc["managedLedgerInternalStats"]["cursors"]
    query = urllib.parse.urlencode({"topic": LONG_TOPIC, "subscription": EMOJI_SUB})
    status, doc = http("GET", f"{store.admin_url()}/admin/v3/transactions/pendingAckInternalStats?{query}")
    assert status == 200, doc


@pytest.mark.parametrize("verb", ["offload-status", "offload-segments", "internal-stats"])
def test_admin_verbs_answer_404_for_a_long_name_the_pod_does_not_hold(
    cluster: tuple[ServePod, ServePod], verb: str
) -> None:
    _, store = cluster
    for topic in (LONG_TOPIC, EMOJI_TOPIC):
        status, doc = http("GET", f"{store.admin_url()}/admin/v1/topics/{verb}?" + _q(topic))
        assert status == 404 and "is not on this pod" in doc["error"], (verb, status, doc)
    status, doc = http("POST", f"{store.admin_url()}/admin/v1/topics/offload?" + _q(LONG_TOPIC), {}, TOKEN)
    assert status == 404 and "is not on this pod" in doc["error"], doc


async def test_an_ack_past_the_end_is_a_bad_request(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    topic = "persistent://t/ns/ack-past-end"
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(topic, "s")
        await (await client.create_producer(topic)).send(b"only")
        message = await consumer.receive(timeout=10)
        beyond = [
            MessageId(message.message_id.ledger_id, message.message_id.entry_id + 1),
            MessageId(message.message_id.ledger_id + 1000, 0),
            MessageId(2**63, 2**63),
        ]
        for wrong in beyond:
            with pytest.raises(BadRequestError, match=f"message {wrong} does not exist on {topic}"):
                await consumer.acknowledge(wrong)
            with pytest.raises(BadRequestError, match=f"message {wrong} does not exist on {topic}"):
                await consumer.acknowledge_cumulative(wrong)
            txn = await client.new_transaction()
            with pytest.raises(BadRequestError, match=f"message {wrong} does not exist on {topic}"):
                await consumer.acknowledge(wrong, txn=txn)
            await txn.abort()
        await consumer.acknowledge(message)  # the subscription is unharmed
        await (await client.create_producer(topic)).send(b"next")
        assert (await consumer.receive(timeout=10)).data == b"next"
    assert "request failed unexpectedly" not in store.log()


def test_an_admin_url_over_8_kb_is_a_400_without_a_traceback(cluster: tuple[ServePod, ServePod]) -> None:
    _, store = cluster
    host, port = store.admin.rsplit(":", 1)
    target = "/admin/v1/topics/internal-stats?topic=" + "a" * 9000
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.split(b" ")[1] == b"400", answer[:300]
    assert http("GET", f"{store.admin_url()}/health")[0] == 200
    log = store.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def _q(topic: str) -> str:
    return urllib.parse.urlencode({"topic": topic})
