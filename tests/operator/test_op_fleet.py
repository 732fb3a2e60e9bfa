"""The local fleet: the operator's engine driving real `txnkeeper serve` processes on real disk.

Upgrade 1.0.0 -> 2.0.0 with batching (restarts one at a time, then dynamic enable), a dynamic disable
that restarts nothing, and no process left behind. The Spark-verified downgrade runs in `make demo`.
"""

from __future__ import annotations

import io
import secrets
from pathlib import Path

import aiohttp
import pytest

from txnkeeper.contract.admin import COORDINATOR_LOG, AdminClient
from txnkeeper.fleet.demo import BATCHED, Fleet
from txnkeeper.fleet.display import Display
from txnkeeper.fleet.group import COORDINATOR, MemberGroup
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
