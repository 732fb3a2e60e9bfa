"""The asyncio client library (Pulsar-like): Client, Producer, Consumer, Transaction, MessageId."""

from txnkeeper.client.client import Client
from txnkeeper.client.consumer import Consumer
from txnkeeper.client.errors import ClientClosedError, OperationTimeoutError, TransactionFailedError
from txnkeeper.client.message import Message, MessageId
from txnkeeper.client.producer import Producer
from txnkeeper.client.transaction import Transaction
from txnkeeper.errors import (
    InvalidTxnStatusError,
    ServiceError,
    TxnConflictError,
    TxnNotFoundError,
)

__all__ = [
    "Client",
    "ClientClosedError",
    "Consumer",
    "InvalidTxnStatusError",
    "Message",
    "MessageId",
    "OperationTimeoutError",
    "Producer",
    "ServiceError",
    "Transaction",
    "TransactionFailedError",
    "TxnConflictError",
    "TxnNotFoundError",
]
