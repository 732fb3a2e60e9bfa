"""Message ids and received messages, as Pulsar's client shows them."""

from __future__ import annotations

from dataclasses import dataclass

from txnkeeper.pb import txnkeeper_api_pb2 as api


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """Where a message lives in its partition: (ledgerId, entryId), printed ``ledgerId:entryId``."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def from_pb(cls, data: api.MessageIdData) -> MessageId:
        return cls(data.ledger_id, data.entry_id)


@dataclass(frozen=True, slots=True)
class Message:
    """A message a consumer received."""

    message_id: MessageId
    data: bytes
    key: str
    topic: str
    redelivery_count: int

    def value(self) -> bytes:
        return self.data
