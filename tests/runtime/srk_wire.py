"""A minimal raw-protocol single-routing-key writer for store-side tests (the real client lives in
txnkeeper.client): SetupAppend, chunked AppendBlock, AppendBlockEnd, AbortAppendBlock, idempotent Produce.

Chunks are sent as requests (so a refusal comes back with their request id); chunk futures still
pending once the block ended are cancelled, since a chunk that is accepted is never answered.
"""

from __future__ import annotations

import asyncio

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import chunks, encode_events
from txnkeeper.protocol.rpc import RpcConnection, connect

TIMEOUT = 30.0


class SrkWire:
    def __init__(self, conn: RpcConnection) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, address: str) -> SrkWire:
        return cls(await connect(address))

    def close(self) -> None:
        self.conn.close()

    async def authenticate(self, token: str) -> str:
        """ClientAuth with ``token``: the principal the store took the connection to be."""
        command = api.Command()
        command.client_auth.token = token
        response = await self.conn.request(command, TIMEOUT)
        return response.client_authenticated.principal

    async def setup(self, topic: str, writer_id: str) -> int:
        command = api.Command()
        command.setup_append.topic = topic
        command.setup_append.writer_id = writer_id
        response = await self.conn.request(command, TIMEOUT)
        return response.append_setup.last_event_number

    async def setup_producer(
        self, topic: str, producer_name: str, instance: str = "instance-1", *, resume: bool = False
    ) -> int:
        """SetupAppend of a named producer (instance token ``instance``): the name's last sequence id."""
        command = api.Command()
        command.setup_append.topic = topic
        command.setup_append.writer_id = producer_name
        command.setup_append.producer_session = instance
        command.setup_append.resume = resume
        response = await self.conn.request(command, TIMEOUT)
        return response.append_setup.last_event_number

    def send_chunks(self, writer_id: str, data: bytes, chunk_size: int) -> list[asyncio.Future[api.Command]]:
        sent = []
        for piece in chunks(data, chunk_size):
            command = api.Command()
            command.append_block.writer_id = writer_id
            command.append_block.data = piece
            sent.append(self.conn.request(command))
        return sent

    def end(
        self, writer_id: str, first: int, count: int, total: int, *, crc: int, key: str = "k"
    ) -> asyncio.Future[api.Command]:
        command = api.Command()
        end = command.append_block_end
        end.writer_id = writer_id
        end.first_event_number = first
        end.event_count = count
        end.total_bytes = total
        end.crc = crc
        end.key = key
        return self.conn.request(command, TIMEOUT)

    async def append(
        self, writer_id: str, first: int, events: list[bytes], *, key: str = "k", chunk_size: int = 64 * 1024
    ) -> api.DataAppended:
        """One whole block; the DataAppended answer (ServiceError if refused)."""
        block = encode_events(events)
        pending = self.send_chunks(writer_id, block.data, chunk_size)
        try:
            response = await self.end(
                writer_id, first, block.event_count, block.total_bytes, crc=block.crc, key=key
            )
        finally:
            for future in pending:
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()  # a refused chunk's error is also the End's
        return response.data_appended

    async def abort(self, writer_id: str) -> None:
        command = api.Command()
        command.abort_append_block.writer_id = writer_id
        await self.conn.request(command, TIMEOUT)

    async def produce(
        self, topic: str, payload: bytes, producer_name: str, sequence_id: int
    ) -> api.ProduceReceipt:
        command = api.Command()
        produce = command.produce
        produce.topic = topic
        produce.payload = payload
        produce.producer_name = producer_name
        produce.sequence_id = sequence_id
        return (await self.conn.request(command, TIMEOUT)).produce_receipt
