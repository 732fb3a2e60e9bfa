"""A coordinator pod restarts from its transaction log snapshot: a graceful stop writes one holding the
open transactions, a SIGKILL after more records loses nothing (they are replayed after it), and every
transaction ends as its client decides, with the right messages visible."""

from __future__ import annotations

import signal

import pytest
from runtime_pods import ServePod
from runtime_waits import wait_until

from txnkeeper.client import Client, Transaction
from txnkeeper.coordinator import snapshot as snapshots
from txnkeeper.txnid import TxnID
from txnkeeper.txnlog import transaction_log_name

pytestmark = pytest.mark.timeout(180)

OUT = "persistent://t/ns/txnlog-snapshot"


async def test_coordinator_restarts_from_its_snapshot_then_from_snapshot_and_tail(
    cluster: tuple[ServePod, ServePod],
) -> None:
    tc, store = cluster
    path = snapshots.snapshot_path(tc.data_dir / "coordinator", 0)
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        await (await client.subscribe(OUT, "reader")).close()
        out = await client.create_producer(OUT)
        keep = await client.new_transaction(timeout_ms=120_000)
        drop = await client.new_transaction(timeout_ms=120_000)
        await out.send(b"kept", txn=keep)
        await out.send(b"dropped", txn=drop)
        tc.stop()  # graceful: the final snapshot holds both open transactions
        loaded = snapshots.read(path, transaction_log_name(0))
        assert loaded is not None
        assert {keep.txn_id, drop.txn_id} <= {TxnID(*t) for t, _, _ in loaded.txns}
        tc.start()
        await reconnected(client, keep, drop)

        late = await client.new_transaction(timeout_ms=120_000)  # after the snapshot: replayed
        await out.send(b"late", txn=late)
        tc.kill(signal.SIGKILL)
        tc.start()
        await reconnected(client, keep, drop, late)

        await keep.commit()
        await drop.abort()
        await late.commit()
        reader = await client.subscribe(OUT, "reader")
        seen = [(await reader.receive(timeout=30)).data for _ in range(2)]
    assert sorted(seen) == [b"kept", b"late"]


async def reconnected(client: Client, *txns: Transaction) -> None:
    """Wait (with a deadline) until the restarted coordinator answers, knowing each txn as OPEN."""

    async def known() -> bool:
        return [await client.transaction_status(t) for t in txns] == ["OPEN"] * len(txns)

    await wait_until(known, 60, "the restarted coordinator to know every open transaction")
