"""ConfirmRegistrations (a store pod asking a coordinator pod to hold many registrations in one
request) with hostile or careless input, raw own-protocol frames against real pods:

| input | answer |
|---|---|
| no registration | BAD_REQUEST for the request |
| more than MAX_CONFIRMATIONS registrations | BAD_REQUEST naming the limit |
| an item with another transaction's owner token | that item UNAUTHORIZED, the others confirmed |
| an item of a transaction nobody began (forged, valid token) | that item TXN_NOT_FOUND |
| an item of a coordinator id this pod does not host | that item NOT_SERVED_HERE |
| an item naming an invalid topic | that item BAD_REQUEST |
| the request sent to a store pod | every item NOT_SERVED_HERE (no coordinator there) |
| a coordinator pod that predates the request (closes the connection over it) | the store confirms |
|   | item by item with AddPartitionToTxn / AddSubscriptionToTxn |
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from runtime_pods import ServePod

from txnkeeper.errors import BadRequestError, NotServedHereError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import ClusterSecret, load_cluster_secret
from txnkeeper.protocol.frames import FrameDecoder, encode_frame
from txnkeeper.protocol.rpc import RpcConnection, connect
from txnkeeper.server.handler import MAX_CONFIRMATIONS
from txnkeeper.server.pulsar_txns import TxnRegistrations
from txnkeeper.txnid import TxnID

pytestmark = pytest.mark.timeout(180)
TOPIC = "persistent://t/ns/confirmed"


def _secret(pod: ServePod) -> ClusterSecret:
    secret = load_cluster_secret(pod.secret_file)
    assert secret is not None
    return secret


def _item(txn: TxnID, token: bytes, topic: str = TOPIC, subscription: str = "") -> api.Registration:
    item = api.Registration(topic=topic, subscription=subscription, owner_token=token)
    item.txn_id.most, item.txn_id.least = txn.most, txn.least
    return item


def _confirm(items: list[api.Registration], store_address: str = "127.0.0.1:1") -> api.Command:
    command = api.Command()
    command.confirm_registrations.store_address = store_address
    command.confirm_registrations.registrations.extend(items)
    return command


async def _begin(conn: RpcConnection) -> TxnID:
    command = api.Command()
    command.new_txn.timeout_ms = 60_000
    begun = (await conn.request(command, 10)).new_txn_response.txn_id
    return TxnID(begun.most, begun.least)


async def test_each_item_is_answered_on_its_own(cluster: tuple[ServePod, ServePod]) -> None:
    coordinator, store = cluster
    secret = _secret(coordinator)
    conn = await connect(coordinator.listen)
    try:
        txn, other = await _begin(conn), await _begin(conn)
        forged = TxnID(txn.most, 987_654_321)
        unhosted = TxnID(7, 1)
        items = [
            _item(txn, secret.owner_token(txn)),
            _item(txn, secret.owner_token(txn), subscription="audit"),
            _item(txn, secret.owner_token(other)),  # another transaction's token
            _item(forged, secret.owner_token(forged)),
            _item(unhosted, secret.owner_token(unhosted)),
            _item(txn, secret.owner_token(txn), topic=""),
        ]
        answer = await conn.request(_confirm(items, store.listen), 10)
        results = answer.registrations_confirmed.results
        assert len(results) == len(items)
        assert [r.HasField("error") for r in results] == [False, False, True, True, True, True]
        codes = [r.error.code for r in results[2:]]
        assert codes == [api.UNAUTHORIZED, api.TXN_NOT_FOUND, api.NOT_SERVED_HERE, api.BAD_REQUEST], results
        assert all(r.error.message for r in results[2:])
        # Confirmed means registered at the store named: the end goes there (an unreachable address
        # would hold it back). That it reaches the partition: test_pulsar_txn_hostile's batched test.
        end = api.Command()
        end.end_txn.txn_id.most, end.end_txn.txn_id.least = txn.most, txn.least
        end.end_txn.action = api.ABORT
        end.end_txn.owner_token = secret.owner_token(txn)
        await conn.request(end, 30)
        status = api.Command()
        status.get_txn_status.txn_id.most, status.get_txn_status.txn_id.least = txn.most, txn.least
        assert (await conn.request(status, 10)).txn_status.status == "ABORTED"
        again = await conn.request(_confirm(items[:1], store.listen), 10)
        assert again.registrations_confirmed.results[0].error.code in (
            api.TXN_NOT_FOUND,
            api.INVALID_TXN_STATUS,
        )
    finally:
        conn.close()


async def test_empty_and_oversized_requests_are_refused(cluster: tuple[ServePod, ServePod]) -> None:
    coordinator, store = cluster
    secret = _secret(coordinator)
    conn = await connect(coordinator.listen)
    try:
        with pytest.raises(BadRequestError, match="names no registration"):
            await conn.request(_confirm([]), 10)
        txn = await _begin(conn)
        token = secret.owner_token(txn)
        many = [_item(txn, token, topic=f"{TOPIC}-{i}") for i in range(MAX_CONFIRMATIONS + 1)]
        with pytest.raises(BadRequestError, match=f"at most {MAX_CONFIRMATIONS}"):
            await conn.request(_confirm(many), 10)
        # The connection still serves.
        answer = await conn.request(_confirm(many[:2]), 10)
        assert [r.HasField("error") for r in answer.registrations_confirmed.results] == [False, False]
    finally:
        conn.close()
    on_store = await connect(store.listen)
    try:
        answer = await on_store.request(_confirm([_item(txn, secret.owner_token(txn))]), 10)
        result = answer.registrations_confirmed.results[0]
        assert result.error.code == api.NOT_SERVED_HERE
        assert "no transaction coordinator" in result.error.message
    finally:
        on_store.close()


class _OldCoordinator:
    """A coordinator pod of the version before ConfirmRegistrations, as its decoder treats the request:
    an error frame naming the frame it cannot read, then the connection closed; AddPartitionToTxn and
    AddSubscriptionToTxn answered with tickets (empty here: the store does not read them)."""

    def __init__(self) -> None:
        self.batches = 0
        self.singles: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for command in decoder.feed(data):
                    body = command.WhichOneof("body")
                    if body == "confirm_registrations":
                        self.batches += 1
                        writer.write(
                            encode_frame(
                                api.Command(
                                    error=api.Error(
                                        code=api.MALFORMED_FRAME, message="frame at byte 0 carries no command"
                                    )
                                )
                            )
                        )
                        writer.close()
                        return
                    assert body in ("add_partition", "add_subscription"), body
                    self.singles.append(body)
                    answer = api.Command(request_id=command.request_id)
                    answer.txn_tickets.SetInParent()
                    writer.write(encode_frame(answer))
        finally:
            writer.close()


class _Placement:
    def __init__(self, address: str) -> None:
        self.address = address

    def coordinator_address(self, coordinator_id: int) -> str | None:
        return self.address


@pytest.fixture
async def old_coordinator() -> AsyncIterator[tuple[_OldCoordinator, str]]:
    old = _OldCoordinator()
    server = await asyncio.start_server(old.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield old, f"127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_coordinator_older_than_the_request_is_asked_item_by_item(
    old_coordinator: tuple[_OldCoordinator, str],
) -> None:
    old, address = old_coordinator
    secret = ClusterSecret(b"s" * 32)
    registrations = TxnRegistrations(secret, _Placement(address), lambda topic: "127.0.0.1:2")  # type: ignore[arg-type]
    try:
        txn = TxnID(0, 1)
        first = [registrations.ensure(txn, TOPIC), registrations.ensure(txn, TOPIC, "audit")]
        await asyncio.wait_for(asyncio.gather(*first), 10)
        assert old.batches == 1 and sorted(old.singles) == ["add_partition", "add_subscription"]
        # Remembered: the next ones go item by item at once, and confirmed ones cost nothing.
        await asyncio.wait_for(registrations.ensure(TxnID(0, 2), TOPIC), 10)
        await registrations.ensure(txn, TOPIC)
        assert old.batches == 1 and len(old.singles) == 3
        assert registrations.confirmations == 3
    finally:
        await registrations.close()


async def test_a_refused_item_fails_only_its_waiters(cluster: tuple[ServePod, ServePod]) -> None:
    """The store side against a real coordinator: one request, one forged item refused, the rest held."""
    coordinator, _ = cluster
    secret = _secret(coordinator)
    conn = await connect(coordinator.listen)
    try:
        txns = [await _begin(conn) for _ in range(3)]
    finally:
        conn.close()
    registrations = TxnRegistrations(secret, _Placement(coordinator.listen), lambda topic: "127.0.0.1:2")  # type: ignore[arg-type]
    try:
        forged = TxnID(txns[0].most, 987_654_321)
        waiting = [registrations.ensure(t, TOPIC) for t in (*txns, forged)]
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)
        assert outcomes[:3] == [None, None, None]
        assert isinstance(outcomes[3], ServiceError) and outcomes[3].code == api.TXN_NOT_FOUND
        assert not isinstance(outcomes[3], NotServedHereError)
        assert registrations.requests == 1 and registrations.confirmations == 4
    finally:
        await registrations.close()
