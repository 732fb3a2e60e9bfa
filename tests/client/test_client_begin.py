"""Client.new_transaction's request: built once per (timeout, names) and copied, never shared.

The pool is replaced by a recorder (pure logic: no socket); what matters is the NewTxn each begin
sends and the tickets the transaction then uses.
"""

from __future__ import annotations

import asyncio

from txnkeeper.client import Client
from txnkeeper.pb import txnkeeper_api_pb2 as api


def _answer(least: int, request: api.Command) -> api.Command:
    answer = api.Command()
    body = answer.new_txn_response
    body.txn_id.most = 0
    body.txn_id.least = least
    body.owner_token = b"token"
    for topic in request.new_txn.topics:
        ticket = body.tickets.add()
        ticket.topic = topic
        ticket.mac = b"mac-" + topic.encode()
    for ref in request.new_txn.subscriptions:
        ticket = body.tickets.add()
        ticket.topic = ref.topic
        ticket.subscription = ref.subscription
        ticket.mac = b"mac-" + ref.subscription.encode()
    return answer


async def test_begins_with_the_same_names_send_equal_but_distinct_requests() -> None:
    client = Client(coordinators=["c:1"], stores=["s:1", "s:2"])
    sent: list[api.Command] = []

    def request(address: str, command: api.Command) -> asyncio.Future[api.Command]:
        sent.append(command)
        answered: asyncio.Future[api.Command] = asyncio.get_running_loop().create_future()
        answered.set_result(_answer(len(sent), command))
        return answered

    client.connections.request = request  # type: ignore[method-assign]
    # Two topics that hash to different store pods: only the first one's pod's names are registered.
    topics = [f"persistent://t/ns/{n}" for n in range(20)]
    first = topics[0]
    other = next(t for t in topics if client.store_for(t) != client.store_for(first))
    names = {"topics": [first, other], "subscriptions": [(first, "sub")]}
    one = await client.new_transaction(5_000, **names)  # type: ignore[arg-type]
    two = await client.new_transaction(5_000, **names)  # type: ignore[arg-type]
    # Pairs given as lists (unhashable) are built as they come, to the same request.
    three = await client.new_transaction(5_000, topics=[first, other], subscriptions=[[first, "sub"]])  # type: ignore[list-item]
    assert len(sent) == 3 and sent[0] is not sent[1] is not sent[2]
    for command in sent:
        body = command.new_txn
        assert body.timeout_ms == 5_000 and body.store_address == client.store_for(first)
        assert list(body.topics) == [first]
        assert [(s.topic, s.subscription) for s in body.subscriptions] == [(first, "sub")]
    assert [t.txn_id.least for t in (one, two, three)] == [1, 2, 3]
    # The begin's tickets are used by name, and a name it did not register has none.
    registration = one.partition_registration(first, client.store_for(first))
    assert registration.done() and one.ticket(registration, first, "").mac == b"mac-" + first.encode()
    sub_registration = one.subscription_registration(first, "sub", client.store_for(first))
    assert one.ticket(sub_registration, first, "sub").mac == b"mac-sub"
    await client.close()
