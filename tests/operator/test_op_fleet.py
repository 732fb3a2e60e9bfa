"""The local fleet: the operator's engine driving real `txnkeeper serve` processes on real disk.

Upgrade 1.0.0 -> 2.0.0 with batching (restarts one at a time, then dynamic enable), a dynamic disable
that restarts nothing, and no process left behind. The Spark-verified downgrade runs in `make demo`.
"""

from __future__ import annotations

import asyncio
import io
import secrets
from pathlib import Path

import aiohttp
import pytest

from txnkeeper.client.client import Client
from txnkeeper.contract.admin import COORDINATOR_LOG, AdminClient
from txnkeeper.fleet.demo import BATCHED, Fleet
from txnkeeper.fleet.display import Display
from txnkeeper.fleet.group import COORDINATOR, STORE, MemberGroup
from txnkeeper.fleet.scaling import ScalingDriver
from txnkeeper_operator.engine import BatchSettings, Desired


@pytest.mark.timeout(90)
async def test_fleet_upgrade_enable_and_dynamic_disable(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(secrets.token_urlsafe(16))
    token.chmod(0o600)  # serve refuses a token file others can read
    out = io.StringIO()
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(session, timeout_seconds=10, token=token.read_text())
        group = MemberGroup("tc", COORDINATOR, tmp_path, token, admin, replicas=2, coordinators=4)
        fleet = Fleet([group], Display(out))
        try:
            assert await fleet.drive({"tc": Desired("1.0.0", 2, BatchSettings())}, 40)
            assert group.history == ["template -> 1.0.0, pods start with batch log off"]
            group.history.clear()

            assert await fleet.drive({"tc": Desired("2.0.0", 2, BATCHED)}, 40)
            assert group.history == [
                "template -> 2.0.0, pods start with batch log off",
                "restart tc-1: 1.0.0 -> 2.0.0",
                "restart tc-0: 1.0.0 -> 2.0.0",
                "template -> 2.0.0, pods start with batch log on",
                "batch log on on tc-1",
                "batch log on on tc-0",
            ]
            for member in group.members:
                base = group.admin_base(member)
                state = (await admin.batch_log(base, COORDINATOR_LOG)).effective()
                assert state == BATCHED
            pids = [m.proc.pid for m in group.members if m.proc is not None]
            group.history.clear()

            assert await fleet.drive({"tc": Desired("2.0.0", 2, BatchSettings())}, 40)
            assert group.history == [
                "template -> 2.0.0, pods start with batch log off",
                "batch log off on tc-1",
                "batch log off on tc-0",
            ]
            assert [m.proc.pid for m in group.members if m.proc is not None] == pids  # nothing restarted
            assert "Ready: 2 pod(s) ready at 2.0.0, batch log disabled" in out.getvalue()
        finally:
            await group.stop()
            group.kill_all()
    assert not any(m.running() for m in group.members)
    assert {m.name for m in group.members} == {"tc-0", "tc-1"}


@pytest.mark.timeout(240)
async def test_fleet_scales_stores_out_and_in_under_transactional_load(tmp_path: Path) -> None:
    """The operator's scaling engine over local processes (what `make demo` shows): 2 -> 3 -> 2 store
    members while a client commits transactions; every committed message is then read exactly once,
    through a client that only knows the first two members (it follows the redirects), and the
    removed member's data is gone."""
    token = tmp_path / "token"
    token.write_text(secrets.token_urlsafe(16))
    token.chmod(0o600)
    lines: list[str] = []
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(session, timeout_seconds=30, token=token.read_text())
        tc = MemberGroup("tc", COORDINATOR, tmp_path, token, admin, replicas=1, coordinators=1)
        pas = MemberGroup("pas", STORE, tmp_path, token, admin, replicas=2, placement_replicas=2)
        fleet = Fleet([tc, pas], Display(io.StringIO()))
        driver = ScalingDriver(pas, admin, token.read_text(), lines.append)
        committed: list[bytes] = []
        stop = asyncio.Event()
        try:
            want = {"tc": Desired("2.0.0", 1, BatchSettings()), "pas": Desired("2.0.0", 2, BatchSettings())}
            assert await fleet.drive(want, 60)
            first_two = pas.client_addresses()
            topics = [f"persistent://public/demo/scale-{i}" for i in range(8)]

            async def produce() -> None:
                async with Client(coordinators=tc.client_addresses(), stores=first_two) as client:
                    producers = [await client.create_producer(t) for t in topics]
                    n = 0
                    while not stop.is_set():
                        txn = await client.new_transaction()
                        batch = [f"{n}-{i}".encode() for i in range(len(topics))]
                        for producer, payload in zip(producers, batch, strict=True):
                            await producer.send(payload, txn=txn)
                        await txn.commit()
                        committed.extend(batch)
                        n += 1

            load = asyncio.create_task(produce())
            await _settle(driver, 3)
            assert set(driver.owners()) == {"pas-0", "pas-1", "pas-2"}
            assert all(count > 0 for count in driver.owners().values()), driver.owners()
            during_scale_out = len(committed)
            await _settle(driver, 2)
            stop.set()
            await load
            assert len(committed) > during_scale_out > 0, "transactions kept committing through both"
            assert set(driver.owners()) == {"pas-0", "pas-1"} and len(pas.members_started()) == 2
            assert not pas.members[2].running() and not pas.members[2].data_dir.exists()
            assert any("fence" in line for line in lines) and any("release" in line for line in lines)

            received: list[bytes] = []
            async with Client(coordinators=tc.client_addresses(), stores=first_two) as client:
                for topic in topics:
                    consumer = await client.subscribe(topic, "check")
                    expected = sum(1 for p in committed if int(p.split(b"-")[1]) == topics.index(topic))
                    for _ in range(expected):
                        received.append((await consumer.receive(timeout=20)).data)
                    with pytest.raises(TimeoutError):
                        await consumer.receive(timeout=0.5)
            assert sorted(received) == sorted(committed), "every committed message exactly once"
        finally:
            stop.set()
            for group in (tc, pas):
                await group.stop()
                group.kill_all()


async def _settle(driver: ScalingDriver, replicas: int) -> None:
    deadline = asyncio.get_running_loop().time() + 150
    while True:
        decision = await driver.step(replicas)
        if (
            decision.phase == "Balanced"
            and not decision.actions
            and len(driver.group.members_started()) == replicas
        ):
            return
        assert asyncio.get_running_loop().time() < deadline, f"{decision.phase}: {decision.message}"
        await asyncio.sleep(0.2)
