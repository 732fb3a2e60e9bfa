"""The asyncio client library (Pulsar-like): Client, Producer, Consumer, Transaction, MessageId, and
PDP-44's single-routing-key transactions (SingleKeyWriter)."""

from txnkeeper.client.client import Client
from txnkeeper.client.consumer import Consumer
from txnkeeper.client.errors import (
    ClientClosedError,
    MaxTransactionSizeExceededError,
    OperationTimeoutError,
    ProducerFencedError,
    TransactionFailedError,
    TxnFailedError,
    UnsupportedFeatureError,
    WriterFencedError,
    WriterStateLostError,
)
from txnkeeper.client.message import Message, MessageId
from txnkeeper.client.producer import Producer
from txnkeeper.client.singlekey import SingleKeyTransaction, SingleKeyWriter
from txnkeeper.client.transaction import Transaction
from txnkeeper.contract.tls import TlsClientSettings
from txnkeeper.errors import (
    BacklogQuotaExceededError,
    DataUnreadableError,
    InvalidTxnStatusError,
    ServiceError,
    TlsHandshakeError,
    TxnConflictError,
    TxnNotFoundError,
)

__all__ = [
    "BacklogQuotaExceededError",
    "Client",
    "ClientClosedError",
    "Consumer",
    "DataUnreadableError",
    "InvalidTxnStatusError",
    "MaxTransactionSizeExceededError",
    "Message",
    "MessageId",
    "OperationTimeoutError",
    "Producer",
    "ProducerFencedError",
    "ServiceError",
    "SingleKeyTransaction",
    "SingleKeyWriter",
    "TlsClientSettings",
    "TlsHandshakeError",
    "Transaction",
    "TransactionFailedError",
    "TxnConflictError",
    "TxnFailedError",
    "TxnNotFoundError",
    "UnsupportedFeatureError",
    "WriterFencedError",
    "WriterStateLostError",
]
