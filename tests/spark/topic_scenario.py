"""A real topic for the data source tests: committed, aborted and open transactions, plain messages,
one ledger only the filesystem tier holds and two the store pod holds (one closed, one open).

Real ``txnkeeper serve`` processes (a coordinator and a release 3.0.0 store with a filesystem tier),
written through the client. Each message's payload names it; ``expected`` lists what a consumer
sees, in topic order: (payload, key, producer name, committed in a transaction).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime_pods import TOKEN, ServePod, http

from txnkeeper.client import Client
from txnkeeper.txnid import TxnID

TOPIC = "persistent://public/default/orders"


def tier_settings(tier: Path) -> dict[str, Any]:
    return {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": str(tier),
        "managedLedgerOffloadThresholdInBytes": -1,  # manual only: the scenario drives every offload
        "managedLedgerOffloadDeletionLagMs": 0,
        "managedLedgerOffloadMaxBlockSizeInBytes": 4096,
        "managedLedgerOffloadMinBlockSizeInBytes": 4096,
    }


@dataclass
class Scenario:
    tc: ServePod
    store: ServePod
    tier: Path
    topic: str
    expected: list[tuple[str, str | None, str | None, bool]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    open_payloads: list[str] = field(default_factory=list)
    held_back: list[tuple[str, str | None, str | None, bool]] = field(default_factory=list)
    open_txn: TxnID | None = None

    def admin(self, method: str, verb: str, body: object = None) -> tuple[int, Any]:
        query = "?" + urllib.parse.urlencode({"topic": self.topic})
        token = TOKEN if method != "GET" else None
        return http(method, f"{self.store.admin_url()}/admin/v1/topics/{verb}{query}", body, token)

    def options(self) -> dict[str, str]:
        import json

        return {
            "topic": self.topic,
            "adminUrl": self.store.admin_url(),
            "offload": json.dumps(tier_settings(self.tier)),
        }

    def abort_open(self) -> None:
        assert self.open_txn is not None
        txn = self.open_txn
        url = f"{self.tc.admin_url()}/admin/v3/transactions/abortTransaction/{txn.most}/{txn.least}"
        status, doc = http("POST", url, {}, TOKEN)
        assert status in (200, 202), doc
        self.expected += self.held_back
        self.aborted += self.open_payloads
        self.held_back, self.open_payloads, self.open_txn = [], [], None


async def _phase(scenario: Scenario, phase: str, *, leave_open: bool = False) -> None:
    async with Client(coordinators=[scenario.tc.listen], stores=[scenario.store.listen]) as client:
        named = await client.create_producer(scenario.topic, producer_name=f"app-{phase}")
        plain = await client.create_producer(scenario.topic)

        async def send(payload: str, key: str) -> None:
            await named.send(payload.encode(), key=key)
            (scenario.held_back if scenario.open_txn else scenario.expected).append(
                (payload, key, f"app-{phase}", False)
            )

        async def txn(name: str, keys: list[str], commit: bool) -> None:
            t = await client.new_transaction(timeout_ms=600_000)
            payloads = [f"{phase}-{name}-{i}" for i in range(len(keys))]
            for payload, key in zip(payloads, keys, strict=True):
                await plain.send(payload.encode(), key=key, txn=t)
            if commit:
                await t.commit()
                scenario.expected.extend((p, k, None, True) for p, k in zip(payloads, keys, strict=True))
            else:
                await t.abort()
                scenario.aborted.extend(payloads)

        await send(f"{phase}-p0", "k1")
        await txn("committed", ["k1", "k2"], True)
        await send(f"{phase}-p1", "k2")
        await txn("aborted", ["k1", "k3"], False)
        if leave_open:
            t = await client.new_transaction(timeout_ms=600_000)
            await plain.send(f"{phase}-open-0".encode(), key="k1", txn=t)
            scenario.open_payloads.append(f"{phase}-open-0")
            scenario.open_txn = t.txn_id
        await send(f"{phase}-p2", "k3")


def build(workdir: Path, started: list[ServePod]) -> Scenario:
    tier = workdir / "tier"
    tier.mkdir()
    tc = ServePod(workdir, "tc-0", "coordinator")
    started.append(tc)
    tc.start()
    store = ServePod(
        workdir,
        "pas-0",
        "store",
        release="3.0.0",
        config={"offload": tier_settings(tier), "singleKeyTransactions": {"enabled": True}},
    )
    started.append(store)
    store.start()
    scenario = Scenario(tc, store, tier, TOPIC)
    asyncio.run(_phase(scenario, "a"))
    status, doc = scenario.admin("POST", "offload", {})
    assert status == 200, doc
    store.stop()  # closes ledger a: the next offload deletes its local file
    store.start()
    status, doc = scenario.admin("POST", "offload", {})
    assert status == 200, doc
    asyncio.run(_phase(scenario, "b"))
    store.stop()  # closes ledger b, which stays local
    store.start()
    asyncio.run(_phase(scenario, "c", leave_open=True))
    status, state = http(
        "GET", f"{store.admin_url()}/admin/v1/topics/read-state?topic={urllib.parse.quote(TOPIC)}"
    )
    assert status == 200, state
    used = [item for item in state["ledgers"] if item["entries"]]
    assert [item["tierOnly"] for item in used] == [True, False, False], state
    return scenario
