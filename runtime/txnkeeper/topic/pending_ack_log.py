"""Adapter from a subscription's needs to its PendingAckStore (layer 3) records.

Acks are logged as Pulsar's PendingAckMetadataEntry (op ACK, Individual/Cumulative, one
PendingAckMetadata per message); ends as COMMIT/ABORT records; replay is folded back into positions.
"""

from __future__ import annotations

import asyncio

from txnkeeper.bufferedwriter.writer import WritePosition
from txnkeeper.ledger.position import Position
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.topic.ports import RecoveredPendingAck
from txnkeeper.txnid import TxnID


class PendingAckLogAdapter:
    """``PendingAckHandle`` over a ``PendingAckStore``."""

    def __init__(self, store: PendingAckStore) -> None:
        self.store = store

    def log_ack(
        self, txn_id: TxnID, positions: list[Position], cumulative: bool
    ) -> asyncio.Future[WritePosition]:
        record = pa.PendingAckMetadataEntry(
            pending_ack_op=pa.ACK,
            ack_type=pa.CommandAck.Cumulative if cumulative else pa.CommandAck.Individual,
            txnid_most_bits=txn_id.most,
            txnid_least_bits=txn_id.least,
        )
        # Added in place: building each PendingAckMetadata and passing the list copies them again.
        for position in positions:
            metadata = record.pending_ack_metadata.add()
            metadata.ledgerId = position.ledger_id
            metadata.entryId = position.entry_id
        return self.store.append(record)

    def log_end(self, txn_id: TxnID, commit: bool) -> asyncio.Future[WritePosition]:
        return self.store.append(
            pa.PendingAckMetadataEntry(
                pending_ack_op=pa.COMMIT if commit else pa.ABORT,
                txnid_most_bits=txn_id.most,
                txnid_least_bits=txn_id.least,
            )
        )

    async def delete_txn(self, txn_id: TxnID) -> None:
        await self.store.delete_txn(txn_id)

    async def delete_txns(self, txn_ids: list[TxnID]) -> None:
        await self.store.delete_txns(txn_ids)

    async def recovered(self) -> list[RecoveredPendingAck]:
        result = []
        for store_id, state in sorted((await self.store.replay()).items()):
            txn = RecoveredPendingAck(TxnID(store_id.most, store_id.least))
            for ack in state.acks:
                positions = [Position(m.ledgerId, m.entryId) for m in ack.pending_ack_metadata]
                if ack.ack_type == pa.CommandAck.Cumulative:
                    for position in positions:
                        if txn.cumulative is None or txn.cumulative < position:
                            txn.cumulative = position
                else:
                    txn.individual.extend(p for p in positions if p not in txn.individual)
            if state.committed:
                txn.ended = True
            elif state.aborted:
                txn.ended = False
            result.append(txn)
        return result

    async def close(self) -> None:
        await self.store.close()
