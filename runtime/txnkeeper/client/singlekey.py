"""Single-routing-key transactions (Pravega PDP-44, ``EventStreamWriter.writeEvents``).

Why they exist next to full transactions: when every event of a transaction goes to one routing key
(one topic), atomicity needs no coordinator. The events are buffered here until commit and then sent
as one numbered block that the store applies whole, de-duplicated by (writer id, event number): one
round trip instead of a coordinator's begin, add, end and the store's markers.

    writer = await client.create_single_key_writer(topic, "order-17", txn_timeout_ms=10_000)
    async with writer.begin_transaction() as txn:   # commits on a clean exit, aborts on an exception
        txn.write(b"created")
        txn.write(b"paid")
    ids = txn.message_ids                           # or: ids = await txn.commit()

Nothing of a transaction is sent before ``commit``, so ``abort`` and a timeout write nothing.
"""

from __future__ import annotations

import time

from txnkeeper.client.appender import MAX_EVENT_BYTES, BlockAppender
from txnkeeper.client.errors import ClientClosedError, MaxTransactionSizeExceededError, TxnFailedError
from txnkeeper.client.message import MessageId
from txnkeeper.errors import InvalidTxnStatusError


class SingleKeyTransaction:
    """Begun with ``SingleKeyWriter.begin_transaction``; ``write`` buffers, ``commit`` sends."""

    def __init__(self, writer: SingleKeyWriter, deadline: float) -> None:
        self._writer = writer
        self._deadline = deadline  # time.monotonic() after which commit fails (nothing sent)
        self._events: list[bytes] = []
        self._size = 0
        self.state = "OPEN"
        self.message_ids: list[MessageId] = []

    def __repr__(self) -> str:
        return f"SingleKeyTransaction[{self._writer.writer_id}, {len(self._events)} events, {self.state}]"

    @property
    def size(self) -> int:
        """Bytes of the events written so far."""
        return self._size

    def write(self, data: bytes) -> None:
        """Buffer one event (sent at commit). Refuses, writing nothing, once the transaction would
        exceed the writer's ``max_txn_bytes`` or its timeout passed."""
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"event data must be bytes, not {type(data).__name__}")
        event = bytes(data)
        if len(event) > MAX_EVENT_BYTES:
            raise ValueError(
                f"an event is at most {MAX_EVENT_BYTES} bytes (one frame), got {len(event)}: split it"
            )
        limit = self._writer.max_txn_bytes
        if self._size + len(event) > limit:
            raise MaxTransactionSizeExceededError(
                f"writing {len(event)} bytes would take transaction {self._writer.writer_id} to "
                f"{self._size + len(event)} bytes, above max_txn_bytes={limit}: nothing was sent; "
                "commit what fits and write the rest in the next transaction"
            )
        self._check_deadline()
        self._events.append(event)
        self._size += len(event)

    async def commit(self) -> list[MessageId]:
        """Send the buffered events as one block; their contiguous message ids once the store applied
        it (visible to consumers from then on). An empty transaction commits nothing."""
        if self.state == "COMMITTED":
            return self.message_ids
        self._check_open()
        self._check_deadline()
        self.state = "COMMITTING"
        self._writer._ended(self)
        if not self._events:
            self.state = "COMMITTED"
            return []
        try:
            self.message_ids = await self._writer._appender.append(self._events)
        except BaseException:
            self.state = "FAILED"
            raise
        self.state = "COMMITTED"
        return self.message_ids

    def abort(self) -> None:
        """Drop the buffered events; nothing of them was sent."""
        if self.state == "ABORTED":
            return
        self._check_open()
        self._events = []
        self.state = "ABORTED"
        self._writer._ended(self)

    async def __aenter__(self) -> SingleKeyTransaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            await self.commit()
        elif self.state == "OPEN":
            self.abort()

    def _check_open(self) -> None:
        if self.state != "OPEN":
            raise InvalidTxnStatusError(f"{self!r} is {self.state}, not OPEN")

    def _check_deadline(self) -> None:
        if time.monotonic() > self._deadline:
            self._events = []
            self.state = "ABORTED"
            self._writer._ended(self)
            raise TxnFailedError(
                f"transaction of writer {self._writer.writer_id} passed its timeout of "
                f"{self._writer.txn_timeout_ms} ms before commit: aborted, nothing was sent; begin "
                "a new transaction"
            )


class SingleKeyWriter:
    """Writes transactions of events for one routing key (one topic); one open transaction at a time,
    while the commits of earlier ones may still be in flight (they are applied in order)."""

    def __init__(
        self, appender: BlockAppender, routing_key: str, txn_timeout_ms: int, max_txn_bytes: int
    ) -> None:
        if txn_timeout_ms <= 0:
            raise ValueError(f"txn_timeout_ms must be positive, got {txn_timeout_ms}")
        if max_txn_bytes <= 0:
            raise ValueError(f"max_txn_bytes must be positive, got {max_txn_bytes}")
        self._appender = appender
        self.routing_key = routing_key
        self.txn_timeout_ms = txn_timeout_ms
        self.max_txn_bytes = max_txn_bytes
        self._open: SingleKeyTransaction | None = None
        self._closed = False

    @property
    def writer_id(self) -> str:
        """Give it to ``create_single_key_writer(writer_id=...)`` to continue this writer's numbering
        (and de-duplication) from another process."""
        return self._appender.writer_id

    @property
    def topic(self) -> str:
        return self._appender.topic

    @property
    def last_event_number(self) -> int:
        """The last event number the store confirmed for this writer (numbers start at 0; -1: none)."""
        return self._appender.acknowledged_through

    def begin_transaction(self) -> SingleKeyTransaction:
        if self._closed:
            raise ClientClosedError(f"single-key writer {self.writer_id} of {self.topic} is closed")
        if self._appender.failure is not None:
            raise self._appender.failure
        if self._open is not None:
            raise InvalidTxnStatusError(
                f"writer {self.writer_id} already has an open transaction: commit or abort it first"
            )
        txn = SingleKeyTransaction(self, time.monotonic() + self.txn_timeout_ms / 1000)
        self._open = txn
        return txn

    def _ended(self, txn: SingleKeyTransaction) -> None:
        if self._open is txn:
            self._open = None

    async def close(self) -> None:
        """Stop the writer: commits still in flight fail with ``ClientClosedError`` (their outcome is
        unknown; a writer created with the same writer id learns it)."""
        self._closed = True
        await self._appender.close()

    async def abandon(self) -> None:
        """Stop at once (the client is closing): unanswered commits fail with ``ClientClosedError``."""
        await self.close()

    async def flush(self) -> None:
        """Wait until every committed transaction was answered."""
        await self._appender.drained()

    async def __aenter__(self) -> SingleKeyWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
