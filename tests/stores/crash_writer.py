"""Child process of the store crash test: writes and ends transactions until it is killed.

Every line goes out in one ``os.write`` (shorter than PIPE_BUF, so it is in the pipe whole or not at
all) and is written BEFORE the child acts further on what it reports:
``ack <seq> <ledger> <entry> <size> <index>`` once a record is acknowledged, ``deleting <seq>`` just
before a transaction's delete starts (after that the delete may or may not have happened at a kill),
and ``deleted <seq>`` once the delete returned (from then on the transaction must stay gone).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from txnkeeper.bufferedwriter import BatchedWriteConfig
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.txnlog import TransactionLogStore, TxnID

WRITERS = 32
DELETE_EVERY = 3  # every third transaction is ended once its records are acknowledged
RECORDS_PER_TXN = 2


def report(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def main(root: Path) -> None:
    factory = ManagedLedgerFactory(root)
    store = await TransactionLogStore.open(
        factory,
        0,
        BatchedWriteConfig(enabled=True, max_records=16, max_delay_millis=1),
        ledger_config=ManagedLedgerConfig(max_entries_per_ledger=40),
    )
    seqs = iter(range(1, 1 << 40))

    async def writer() -> None:
        while True:
            seq = next(seqs)
            for op in (tm.TransactionMetadataEntry.NEW, tm.TransactionMetadataEntry.ADD_PARTITION):
                record = tm.TransactionMetadataEntry(
                    metadata_op=op, txnid_most_bits=0, txnid_least_bits=seq, partitions=[f"p{seq}"]
                )
                p = await store.append(record)
                report(f"ack {seq} {p.ledger_id} {p.entry_id} {p.batch_size} {p.batch_index}")
            if seq % DELETE_EVERY == 0:
                report(f"deleting {seq}")
                await store.delete_txn(TxnID(0, seq))
                report(f"deleted {seq}")

    await asyncio.gather(*(writer() for _ in range(WRITERS)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
