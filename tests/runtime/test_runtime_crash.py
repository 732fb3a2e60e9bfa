"""Crashes mid-commit: a coordinator restart finishes the commit; a store SIGKILL leaves every
transaction wholly visible or wholly absent."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import pytest
from runtime_pods import ServePod
from runtime_waits import wait_until

from txnkeeper.client import Client, Consumer, ServiceError, Transaction

pytestmark = pytest.mark.timeout(150)

IN = "persistent://t/ns/in"
OUT = "persistent://t/ns/out"


async def read_until(consumer: Consumer, sentinel: bytes) -> list[bytes]:
    seen: list[bytes] = []
    while True:
        message = await consumer.receive(timeout=30)
        await consumer.acknowledge(message)
        if message.data == sentinel:
            return seen
        seen.append(message.data)


async def test_coordinator_restart_mid_commit_finishes_the_commit(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        consumer = await client.subscribe(IN, "work")
        reader = await client.subscribe(OUT, "reader")
        inp = await client.create_producer(IN)
        out = await client.create_producer(OUT)
        await inp.send(b"job")
        txn = await client.new_transaction(timeout_ms=120_000)
        message = await consumer.receive(timeout=10)
        await out.send(b"result", txn=txn)
        await consumer.acknowledge(message, txn=txn)

        assert store.process is not None
        store.process.send_signal(signal.SIGSTOP)  # the fan-out cannot complete
        try:
            commit = asyncio.ensure_future(txn.commit())

            async def committing() -> bool:
                return await client.transaction_status(txn) == "COMMITTING"

            await wait_until(committing, 15, "the coordinator to log COMMITTING")
            tc.kill(signal.SIGKILL)
        finally:
            store.process.send_signal(signal.SIGCONT)
        try:
            await commit
            raise AssertionError("the commit cannot have completed while the store was stopped")
        except ServiceError:
            pass
        tc.start()

        async def committed() -> bool:
            return await client.transaction_status(txn) == "COMMITTED"

        await wait_until(committed, 60, "the restarted coordinator to finish the commit")
        assert txn.state == "ERROR"  # the client never heard the outcome; retrying commit is safe
        await txn.commit()
        assert txn.state == "COMMITTED"
        assert (await reader.receive(timeout=15)).data == b"result"
        # The transactional ack was applied: the job is not delivered again.
        await inp.send(b"next")
        assert (await consumer.receive(timeout=15)).data == b"next"


async def test_store_sigkill_during_commits_is_all_or_nothing(cluster: tuple[ServePod, ServePod]) -> None:
    tc, store = cluster
    per_txn = 3
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        out = await client.create_producer(OUT)
        txns: list[Transaction] = []
        for i in range(30):
            # long enough that no transaction times out while a loaded machine sends the 90 messages
            txn = await client.new_transaction(timeout_ms=60_000)
            for part in range(per_txn):
                await out.send(f"t{i}-{part}".encode(), txn=txn)
            txns.append(txn)
        commits = [asyncio.ensure_future(t.commit()) for t in txns]
        # Kill once a commit was acknowledged (whatever the machine's speed), with the rest in flight.
        pending: set[asyncio.Future[None]] = set(commits)
        while pending and not any(c.done() and c.exception() is None for c in commits):
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        store.kill(signal.SIGKILL)
        store.start()  # same client port; the coordinator's retries reach it again
        outcomes = await asyncio.gather(*commits, return_exceptions=True)
        acknowledged = {i for i, outcome in enumerate(outcomes) if outcome is None}
        assert acknowledged, "at least one commit completed before the kill"

        async def all_ended() -> bool:
            statuses = [await client.transaction_status(t) for t in txns]
            return all(s in ("COMMITTED", "ABORTED", "UNKNOWN") for s in statuses)

        await wait_until(all_ended, 90, "every transaction to be committed or aborted")
        statuses = [await client.transaction_status(t) for t in txns]
    async with Client(coordinators=[tc.listen], stores=[store.listen]) as client:
        reader = await client.subscribe(OUT, "audit")
        await (await client.create_producer(OUT)).send(b"END")
        seen = await read_until(reader, b"END")
    per = Counter(data.decode().split("-")[0] for data in seen)
    assert all(count == per_txn for count in per.values()), f"a transaction is partly visible: {per}"
    assert len(seen) == len(set(seen)), "a message was delivered twice"
    for i, status in enumerate(statuses):
        visible = per.get(f"t{i}", 0) == per_txn
        assert visible == (status == "COMMITTED"), f"txn {i}: status {status}, visible {visible}"
        if i in acknowledged:
            assert visible, f"txn {i} was acknowledged committed but is not visible"
