"""The pending-ack store of one subscription: PendingAckMetadataEntry records on
``{topic}-{subscription}__transaction_pending_ack``, replayed into per-transaction acks at open.

The subscription recovers from it after a restart: acks of open transactions are pending again (and
block other transactions' acks of the same messages), a logged COMMIT/ABORT says how the transaction
ended when its records were not yet deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter.codec import PENDING_ACK_CODEC
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import PENDING_ACK_PREFIX
from txnkeeper.bufferedwriter.writer import WritePosition
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.release import BATCHED_LEVEL
from txnkeeper.stores.recordlog import RecordLog
from txnkeeper.stores.txnstore import TxnRecordStore, open_store
from txnkeeper.txnid import TxnID

# Pulsar's MLPendingAckStore cursor name.
CURSOR_NAME = "__pending_ack_state"


def pending_ack_log_name(topic: str, subscription: str) -> str:
    """Managed ledger name of a subscription's pending-ack log (Pulsar's naming)."""
    return f"{topic}-{subscription}__transaction_pending_ack"


@dataclass(slots=True)
class PendingAckState:
    """One transaction's live pending-ack records.

    ``acks``: the ACK records in log order; ``outcome``: ``pa.COMMIT`` or ``pa.ABORT`` when the end
    was logged but the records not yet deleted, else ``None`` (the transaction is still open here).
    """

    txn_id: TxnID
    acks: list[pa.PendingAckMetadataEntry] = field(default_factory=list)
    outcome: int | None = None
    positions: list[WritePosition] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.outcome == pa.COMMIT

    @property
    def aborted(self) -> bool:
        return self.outcome == pa.ABORT


class PendingAckStore(TxnRecordStore[pa.PendingAckMetadataEntry, PendingAckState]):
    """A subscription's durable pending-ack log (contracts §3)."""

    def __init__(self, log: RecordLog[pa.PendingAckMetadataEntry], topic: str, subscription: str) -> None:
        super().__init__(log)
        self.topic = topic
        self.subscription = subscription

    @classmethod
    async def open(
        cls,
        factory: ManagedLedgerFactory,
        topic: str,
        subscription: str,
        config: BatchedWriteConfig | None = None,
        format_level: int = BATCHED_LEVEL,
        *,
        registry: CollectorRegistry | None = None,
        ledger_config: ManagedLedgerConfig | None = None,
    ) -> PendingAckStore:
        """Open (or create) the pending-ack log of ``topic``/``subscription`` and replay it.

        Raises ``FormatLevelError`` at format level 1 if a live batched entry exists, and
        ``BatchedWriteNotAllowedError`` if ``config`` enables batching at level 1.
        """
        for what, value in (("topic", topic), ("subscription", subscription)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{what} must be a non-empty string, got {value!r}")
        return await open_store(
            lambda log: cls(log, topic, subscription),
            factory,
            pending_ack_log_name(topic, subscription),
            CURSOR_NAME,
            PENDING_ACK_CODEC,
            config=config,
            format_level=format_level,
            metrics_prefix=PENDING_ACK_PREFIX,
            labels={"topic": topic, "subscription": subscription},
            registry=registry,
            ledger_config=ledger_config,
        )

    def _check_record(self, record: pa.PendingAckMetadataEntry) -> None:
        if type(record) is not pa.PendingAckMetadataEntry:
            raise TypeError(
                f"the pending-ack log stores PendingAckMetadataEntry records, not {type(record).__name__}"
            )
        if not (
            record.HasField("pending_ack_op")
            and record.HasField("txnid_most_bits")
            and record.HasField("txnid_least_bits")
        ):
            raise ValueError(
                "a PendingAckMetadataEntry needs pending_ack_op, txnid_most_bits and txnid_least_bits;"
                f" got {record!r}"
            )

    def _fold(
        self,
        state: PendingAckState | None,
        txn_id: TxnID,
        position: WritePosition,
        record: pa.PendingAckMetadataEntry,
    ) -> PendingAckState:
        if state is None:
            state = PendingAckState(txn_id)
        op = record.pending_ack_op
        if op == pa.ACK:
            state.acks.append(record)
        elif op in (pa.COMMIT, pa.ABORT):
            state.outcome = op
        state.positions.append(position)
        return state
