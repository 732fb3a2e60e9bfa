"""Adapter from a subscription's needs to its PendingAckStore (layer 3) records.

Acks are logged as Pulsar's PendingAckMetadataEntry (op ACK, Individual/Cumulative, one
PendingAckMetadata per message); ends as COMMIT/ABORT records; replay is folded back into positions.
A batch-index ack is a PendingAckMetadata with Pulsar's ack set (set bits: the indexes this ack
leaves) and the batch size, as Pulsar's MLPendingAckStore writes it.
"""

from __future__ import annotations

import asyncio

from txnkeeper.bufferedwriter.writer import WritePosition
from txnkeeper.ledger.ackset import full_mask, mask_to_words, words_to_mask
from txnkeeper.ledger.position import Position
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.pendingack import PendingAckStore
from txnkeeper.topic.ports import IndexAck, RecoveredPendingAck
from txnkeeper.txnid import TxnID


class PendingAckLogAdapter:
    """``PendingAckHandle`` over a ``PendingAckStore``."""

    def __init__(self, store: PendingAckStore) -> None:
        self.store = store

    def log_ack(
        self,
        txn_id: TxnID,
        positions: list[Position],
        cumulative: bool,
        index_acks: list[IndexAck] | None = None,
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
        for ack in index_acks or ():
            metadata = record.pending_ack_metadata.add()
            metadata.ledgerId = ack.position.ledger_id
            metadata.entryId = ack.position.entry_id
            metadata.ack_set.extend(mask_to_words(full_mask(ack.batch_size) & ~ack.acked))
            metadata.batch_size = ack.batch_size
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
            indexes: dict[Position, tuple[int, int]] = {}
            for ack in state.acks:
                positions = []
                for m in ack.pending_ack_metadata:
                    position = Position(m.ledgerId, m.entryId)
                    if not m.HasField("batch_size"):
                        positions.append(position)
                        continue
                    acked = full_mask(m.batch_size) & ~words_to_mask(m.ack_set, m.batch_size)
                    held, _ = indexes.get(position, (0, m.batch_size))
                    indexes[position] = (held | acked, m.batch_size)
                if ack.ack_type == pa.CommandAck.Cumulative:
                    for position in positions:
                        if txn.cumulative is None or txn.cumulative < position:
                            txn.cumulative = position
                else:
                    txn.individual.extend(p for p in positions if p not in txn.individual)
            txn.index_acks = [IndexAck(p, acked, size) for p, (acked, size) in sorted(indexes.items())]
            if state.committed:
                txn.ended = True
            elif state.aborted:
                txn.ended = False
            result.append(txn)
        return result

    async def close(self) -> None:
        await self.store.close()

    async def destroy(self) -> None:
        await self.store.destroy()
