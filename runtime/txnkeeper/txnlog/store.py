"""The transaction log store of one coordinator: TransactionMetadataEntry records on
``__transaction_log_{coordinatorId}``, replayed into per-transaction state at open.

Replay is what the coordinator recovers from after a restart, so it must rebuild exactly the state the
acknowledged, not-yet-deleted records describe, whatever mix of batched, unbatched and oversized
passthrough entries holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from txnkeeper.bufferedwriter.codec import TXN_LOG_CODEC
from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.bufferedwriter.metrics import TXN_LOG_PREFIX
from txnkeeper.bufferedwriter.writer import WritePosition, unpack_position
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.release import BATCHED_LEVEL
from txnkeeper.stores.recordlog import RecordLog
from txnkeeper.stores.txnstore import StoreSnapshot, TxnRecordStore, open_store
from txnkeeper.txnid import TxnID

# Pulsar's MLTransactionLogImpl cursor name.
CURSOR_NAME = "transaction.subscription"

TxnLogRecord = tm.TransactionMetadataEntry
_Op = tm.TransactionMetadataEntry.TransactionMetadataOp
# As plain ints: each ``_Op.X`` goes through the protobuf enum wrapper's __getattr__, which was the
# largest single cost of folding a replayed record.
_NEW = int(_Op.NEW)
_ADD_PARTITION = int(_Op.ADD_PARTITION)
_ADD_SUBSCRIPTION = int(_Op.ADD_SUBSCRIPTION)
_UPDATE = int(_Op.UPDATE)


def transaction_log_name(coordinator_id: int) -> str:
    """Managed ledger name of a coordinator's log (Pulsar: ``__transaction_log_{id}``)."""
    return f"__transaction_log_{coordinator_id}"


@dataclass(slots=True)
class TxnLogState:
    """One transaction as its live log records describe it.

    ``status`` is a ``TxnStatus`` protobuf value (OPEN=0, COMMITTING=1, COMMITTED=2, ABORTING=3,
    ABORTED=4); ``complete`` is False when the NEW record is missing (a crash between deleting some
    and all of a transaction's records): such a transaction only needs deleting again.
    """

    txn_id: TxnID
    status: int = tm.OPEN
    timeout_ms: int = 0
    start_time: int = 0
    last_modification_time: int = 0
    owner: str = ""
    partitions: list[str] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    # pack_position of each live record, in log order: the store's own list for this transaction.
    packed: list[int] = field(default_factory=list)
    complete: bool = False

    @property
    def positions(self) -> list[WritePosition]:
        """Where this transaction's live records are, in log order."""
        return [unpack_position(p) for p in self.packed]

    @property
    def status_name(self) -> str:
        return str(tm.TxnStatus.Name(self.status))  # type: ignore[arg-type]


class TransactionLogStore(TxnRecordStore[tm.TransactionMetadataEntry, TxnLogState]):
    """A coordinator's durable transaction log (contracts §3)."""

    def __init__(
        self, log: RecordLog[tm.TransactionMetadataEntry], coordinator_id: int, *, snapshots: bool = False
    ) -> None:
        super().__init__(log, snapshots=snapshots)
        self.coordinator_id = coordinator_id

    @classmethod
    async def open(
        cls,
        factory: ManagedLedgerFactory,
        coordinator_id: int,
        config: BatchedWriteConfig | None = None,
        format_level: int = BATCHED_LEVEL,
        *,
        registry: CollectorRegistry | None = None,
        ledger_config: ManagedLedgerConfig | None = None,
        snapshots: bool = False,
        snapshot: StoreSnapshot[TxnLogState] | None = None,
    ) -> TransactionLogStore:
        """Open (or create) coordinator ``coordinator_id``'s log and replay it.

        ``snapshots=True`` lets the store capture snapshots (``capture_snapshot``); ``snapshot``, one
        captured by an earlier run (``coordinator.snapshot`` reads and writes the file), stands in for
        the records it covers, so only those after it are replayed.

        Raises ``FormatLevelError`` at format level 1 if a live batched entry exists, and
        ``BatchedWriteNotAllowedError`` if ``config`` enables batching at level 1.
        """
        if isinstance(coordinator_id, bool) or not isinstance(coordinator_id, int) or coordinator_id < 0:
            raise ValueError(f"coordinator id must be an integer >= 0, got {coordinator_id!r}")
        return await open_store(
            lambda log: cls(log, coordinator_id, snapshots=snapshots or snapshot is not None),
            factory,
            transaction_log_name(coordinator_id),
            CURSOR_NAME,
            TXN_LOG_CODEC,
            config=config,
            format_level=format_level,
            metrics_prefix=TXN_LOG_PREFIX,
            labels={"coordinator_id": str(coordinator_id)},
            registry=registry,
            ledger_config=ledger_config,
            snapshot=snapshot,
        )

    def _check_record(self, record: tm.TransactionMetadataEntry) -> None:
        if type(record) is not tm.TransactionMetadataEntry:
            raise TypeError(
                f"the transaction log stores TransactionMetadataEntry records, not {type(record).__name__}"
            )
        if record.txnid_most_bits != self.coordinator_id:
            raise ValueError(
                f"record of transaction ({record.txnid_most_bits},{record.txnid_least_bits})"
                f" does not belong to coordinator {self.coordinator_id}:"
                " txnid_most_bits must be the coordinator id"
            )

    def _fold(
        self,
        state: TxnLogState | None,
        txn_id: TxnID,
        position: WritePosition,
        record: tm.TransactionMetadataEntry,
    ) -> TxnLogState:
        if state is None:
            state = TxnLogState(txn_id)
        op = record.metadata_op
        if op == _NEW:
            state.complete = True
            state.timeout_ms = record.timeout_ms
            state.start_time = record.start_time
            state.owner = record.owner
        elif op == _ADD_PARTITION:
            for partition in record.partitions:
                if partition not in state.partitions:
                    state.partitions.append(partition)
        elif op == _ADD_SUBSCRIPTION:
            for sub in record.subscriptions:
                pair = (sub.topic, sub.subscription)
                if pair not in state.subscriptions:
                    state.subscriptions.append(pair)
        elif op == _UPDATE:
            state.status = record.new_status
        if record.HasField("last_modification_time"):
            state.last_modification_time = record.last_modification_time
        return state

    def _bind_positions(self, state: TxnLogState, packed: list[int]) -> None:
        state.packed = packed
