"""A store pod SIGKILLed after its transaction buffer snapshot was written (and with more markers after
it) recovers every outcome: aborted messages are never dispatched, an open transaction's messages stay
held (and everything after them) until it commits, committed ones are visible, in order."""

from __future__ import annotations

import signal

import pytest
from runtime_pods import ServePod
from runtime_waits import wait_until

from txnkeeper.client import Client
from txnkeeper.topic import snapshot as snapshots
from txnkeeper.topic.service import SNAPSHOT_DIR

pytestmark = pytest.mark.timeout(180)

OUT = "persistent://t/ns/snapshotted"


async def test_store_sigkill_after_a_snapshot_keeps_every_outcome(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    path = snapshots.snapshot_path(store.data_dir / "store" / SNAPSHOT_DIR, OUT)
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        # Only registers the subscription: its messages are read by a consumer after the restart.
        await (await client.subscribe(OUT, "reader")).close()
        out = await client.create_producer(OUT)
        committed = await client.new_transaction(timeout_ms=120_000)
        aborted = await client.new_transaction(timeout_ms=120_000)
        await out.send(b"a1", txn=committed)
        await out.send(b"b1", txn=aborted)
        await out.send(b"a2", txn=committed)
        await committed.commit()
        await aborted.abort()
        before = {committed.txn_id, aborted.txn_id}

        async def snapshotted() -> bool:  # housekeeping snapshots what was written since the last one
            loaded = snapshots.read(path, OUT)
            return loaded is not None and before <= {e.txn_id for e in snapshots.unpack_ended(loaded.ended)}

        await wait_until(snapshotted, 60, f"a snapshot at {path} holding both outcomes")
        held = await client.new_transaction(timeout_ms=120_000)
        late_commit = await client.new_transaction(timeout_ms=120_000)
        late_abort = await client.new_transaction(timeout_ms=120_000)
        await out.send(b"c1", txn=held)
        await out.send(b"d1", txn=late_commit)
        await out.send(b"e1", txn=late_abort)
        await late_commit.commit()
        await late_abort.abort()
        store.kill(signal.SIGKILL)
        store.start()
        assert snapshots.read(path, OUT) is not None  # the snapshot the restart used was intact

        async with Client(coordinators=[tc.listen], stores=[store.listen]) as fresh:
            reader = await fresh.subscribe(OUT, "reader")
            seen = [(await reader.receive(timeout=30)).data for _ in range(2)]
            assert seen == [b"a1", b"a2"]
            with pytest.raises(TimeoutError):  # c1's txn is open: it and everything after it are held
                await reader.receive(timeout=2)
            await held.commit()
            await (await fresh.create_producer(OUT)).send(b"END")
            while seen[-1] != b"END":
                seen.append((await reader.receive(timeout=30)).data)
    assert seen == [b"a1", b"a2", b"c1", b"d1", b"END"], seen  # b1 and e1 (aborted) never
