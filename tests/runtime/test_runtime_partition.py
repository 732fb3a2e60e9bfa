"""A partition on a real managed ledger: transaction markers, replay after reopening, housekeeping."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from txnkeeper.coordinator.txnid import TxnID
from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory
from txnkeeper.topic.partition import Partition
from txnkeeper.topic.subscription import Subscription
from txnkeeper.topic.txnbuffer import TxnOutcome


async def test_replay_and_housekeeping_on_real_ledgers(tmp_path: Path) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/p", config)
    partition = Partition("persistent://t/ns/p", ledger)
    await partition.recover()
    old, new = TxnID(0, 1), TxnID(0, 2)
    await partition.publish(b"a", "", old)
    await partition.end_txn(old, commit=True)
    await partition.end_txn(old, commit=True)  # idempotent: no second marker
    for i in range(6):
        await partition.publish(f"p{i}".encode(), "", None)
    await partition.publish(b"b", "", new)
    assert ledger.ledger_ids()[0] != ledger.current_ledger_id()  # rolled over at least once
    await factory.close()

    factory = ManagedLedgerFactory(tmp_path)
    ledger = await factory.open("persistent://t/ns/p", config)
    partition = Partition("persistent://t/ns/p", ledger)
    await partition.recover()  # the outcome comes back from the marker; `new` is still open
    assert partition.buffer.outcome(old) is TxnOutcome.COMMITTED
    assert partition.buffer.outcome(new) is TxnOutcome.OPEN
    cursor = await ledger.open_cursor("sub")
    first = ledger.ledger_ids()[0]
    partition.subscriptions["sub"] = cast(Subscription, cast(Any, object()))
    await cursor.mark_delete(cast(Any, ledger.last_confirmed_entry()))
    await partition.housekeeping()
    assert ledger.ledger_ids()[0] > first  # consumed ledgers were deleted
    assert partition.buffer.outcome(old) is TxnOutcome.OPEN  # forgotten: its marker's ledger is gone
    await factory.close()
