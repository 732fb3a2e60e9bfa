"""Turn the transaction log store's replay into what the coordinator resumes from.

A transaction whose NEW record is already deleted (a crash midway through deleting its records) is
reported as ended so the coordinator only finishes deleting it.
"""

from __future__ import annotations

from txnkeeper.coordinator.ports import RecoveredTxn
from txnkeeper.coordinator.state import TxnStatus
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import TxnLogState

# TxnStatus by number, and what an incomplete transaction (NEW record deleted) had ended as. Looked
# up by index: calling the enum per transaction was a third of adopting a million-record table.
_STATUS = tuple(TxnStatus)
_ENDED_AS = {
    TxnStatus.OPEN: TxnStatus.ABORTED,
    TxnStatus.ABORTING: TxnStatus.ABORTED,
    TxnStatus.COMMITTING: TxnStatus.COMMITTED,
    TxnStatus.COMMITTED: TxnStatus.COMMITTED,
    TxnStatus.ABORTED: TxnStatus.ABORTED,
}


def recovered_transactions(replayed: dict[TxnID, TxnLogState]) -> list[RecoveredTxn]:
    result: list[RecoveredTxn] = []
    add = result.append
    for store_id in sorted(replayed):
        state = replayed[store_id]
        status = _STATUS[state.status]
        if not state.complete:
            # Only some records survive (deletion was interrupted): the txn had ended; finish deleting.
            status = _ENDED_AS[status]
        add(
            RecoveredTxn(
                store_id,
                status,
                state.timeout_ms,
                state.start_time,
                state.last_modification_time,
                # Copies: the store keeps folding durable records into its own lists.
                list(state.partitions),
                list(state.subscriptions),
            )
        )
    return result


def highest_sequence(replayed: dict[TxnID, TxnLogState], coordinator_id: int) -> int:
    """The largest sequence the log still shows for this coordinator (0 if none)."""
    return max((t.least for t in replayed if t.most == coordinator_id), default=0)
