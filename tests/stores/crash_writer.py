"""Child process of the store crash test: writes and ends transactions until it is killed.

It prints ``ack <seq> <ledger> <entry> <size> <index>`` once a record is acknowledged and
``deleted <seq>`` once a transaction's delete returned, each line flushed, so the parent knows exactly
what was promised before its SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.txnlog import TransactionLogStore, TxnID

WRITERS = 32


async def main(root: Path) -> None:
    factory = ManagedLedgerFactory(root)
    store = await TransactionLogStore.open(
        factory,
        0,
        BatchedWriteConfig(enabled=True, max_records=16, max_delay_millis=1),
        ledger_config=ManagedLedgerConfig(max_entries_per_ledger=40),
    )
    out = sys.stdout
    seqs = iter(range(1, 1 << 40))

    async def writer() -> None:
        while True:
            seq = next(seqs)
            for op in (tm.TransactionMetadataEntry.NEW, tm.TransactionMetadataEntry.ADD_PARTITION):
                record = tm.TransactionMetadataEntry(
                    metadata_op=op, txnid_most_bits=0, txnid_least_bits=seq, partitions=[f"p{seq}"]
                )
                p = await store.append(record)
                out.write(f"ack {seq} {p.ledger_id} {p.entry_id} {p.batch_size} {p.batch_index}\n")
                out.flush()
            if seq % 3 == 0:  # test_store_crash.DELETE_EVERY
                await store.delete_txn(TxnID(0, seq))
                out.write(f"deleted {seq}\n")
                out.flush()

    await asyncio.gather(*(writer() for _ in range(WRITERS)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
