"""Turn the transaction log store's replay into what the coordinator resumes from.

A transaction whose NEW record is already deleted (a crash midway through deleting its records) is
reported as ended so the coordinator only finishes deleting it.
"""

from __future__ import annotations

from txnkeeper.coordinator.ports import RecoveredTxn
from txnkeeper.coordinator.state import TxnStatus
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import TxnLogState


def recovered_transactions(replayed: dict[TxnID, TxnLogState]) -> list[RecoveredTxn]:
    result = []
    for store_id, state in sorted(replayed.items()):
        status = TxnStatus(state.status)
        if not state.complete and status not in (TxnStatus.COMMITTED, TxnStatus.ABORTED):
            # Only some records survive (deletion was interrupted): the txn had ended; finish deleting.
            status = (
                TxnStatus.ABORTED if status in (TxnStatus.OPEN, TxnStatus.ABORTING) else TxnStatus.COMMITTED
            )
        result.append(
            RecoveredTxn(
                txn_id=store_id,
                status=status,
                timeout_ms=state.timeout_ms,
                start_time_ms=state.start_time,
                last_modification_ms=state.last_modification_time,
                partitions=list(state.partitions),
                subscriptions=list(state.subscriptions),
            )
        )
    return result


def highest_sequence(replayed: dict[TxnID, TxnLogState], coordinator_id: int) -> int:
    """The largest sequence the log still shows for this coordinator (0 if none)."""
    return max((t.least for t in replayed if t.most == coordinator_id), default=0)
