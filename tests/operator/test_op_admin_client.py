"""The operator's admin-API client against a real `txnkeeper serve` process (contracts §5/§6).

The operator never imports the runtime, so this is where the two sides meet: the batch-log documents
parse, a dynamic toggle is confirmed by the pod, a forced rollover returns LastBatchedLedger markers,
a level-1 pod refuses batching with 409, and a call without the token changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from txnkeeper.contract.admin import AdminClient, AdminError, parse_batch_log
from txnkeeper.fleet.process import RuntimeProcess, write_admin_token
from txnkeeper_operator.engine import BatchSettings
from txnkeeper_operator.naming import PENDING_ACK_STORE, TRANSACTION_COORDINATOR

TOKEN = "t0ken-for-tests"
ON = BatchSettings(enabled=True, max_records=64, max_size_bytes=65536, max_delay_millis=2)


async def _start(tmp_path: Path, release: str, batch: dict[str, object]) -> RuntimeProcess:
    proc = RuntimeProcess.in_work_dir(
        tmp_path,
        "tc-0",
        "coordinator",
        token_file=write_admin_token(tmp_path / "token", TOKEN),
        release=release,
        extra_args=["--coordinators", "2", "--coordinator-ids", "0,1"],
        config={"batchedWrite": batch},
    )
    proc.start()
    try:
        await proc.wait_started()
    except BaseException:
        await proc.stop()
        raise
    return proc


@pytest.fixture
async def client() -> AsyncIterator[AdminClient]:
    async with aiohttp.ClientSession() as session:
        yield AdminClient(session, timeout_seconds=10)


@pytest.mark.timeout(60)
async def test_toggle_rollover_and_auth_against_a_real_pod(tmp_path: Path, client: AdminClient) -> None:
    proc = await _start(tmp_path, "2.0.0", {"enabled": False})
    try:
        base = proc.admin_url
        info = await client.info(base)
        assert info["release"] == "2.0.0" and info["formatLevel"] == 2
        before = await client.batch_log(base, TRANSACTION_COORDINATOR)
        assert before.effective().enabled is False and len(before.stores) == 2

        await client.set_batch_log(base, TRANSACTION_COORDINATOR, ON, TOKEN)
        after = await client.batch_log(base, TRANSACTION_COORDINATOR)
        assert after.effective() == ON
        assert {e["coordinatorId"] for e in after.array} == {0, 1}

        with pytest.raises(AdminError, match="401"):
            await client.set_batch_log(base, TRANSACTION_COORDINATOR, ON.disabled(), "wrong")
        assert (await client.batch_log(base, TRANSACTION_COORDINATOR)).effective() == ON

        markers = await client.rollover(base, TOKEN)
        assert set(markers) == {"__transaction_log_0", "__transaction_log_1"}
        again = await client.rollover(base, TOKEN)
        assert all(again[s] > markers[s] for s in markers)  # each rollover moves the marker on
    finally:
        await proc.stop()
    assert not proc.running()


@pytest.mark.timeout(60)
async def test_level_one_pod_refuses_batching(tmp_path: Path, client: AdminClient) -> None:
    proc = await _start(tmp_path, "1.0.0", {})
    try:
        with pytest.raises(AdminError, match="409"):
            await client.set_batch_log(proc.admin_url, TRANSACTION_COORDINATOR, ON, TOKEN)
        state = await client.batch_log(proc.admin_url, TRANSACTION_COORDINATOR)
        assert state.effective().enabled is False
    finally:
        await proc.stop()


def test_disagreeing_stores_never_look_disabled() -> None:
    stat_off = {
        "batchEnabled": False,
        "batchedWriteMaxRecords": 512,
        "batchedWriteMaxSize": 4194304,
        "batchedWriteMaxDelayInMillis": 1,
    }
    doc = {
        "pendingAck": stat_off,
        "subscriptionArray": [
            {"topic": "t", "subscription": "s", "transactionPendingAckBatchedWriteStat": stat_off},
            {
                "topic": "t",
                "subscription": "s2",
                "transactionPendingAckBatchedWriteStat": {**stat_off, "batchEnabled": True},
            },
        ],
    }
    state = parse_batch_log(PENDING_ACK_STORE, doc).effective()
    assert state.enabled is True and not state.satisfies(BatchSettings())
    with pytest.raises(AdminError):
        parse_batch_log(PENDING_ACK_STORE, {"pendingAck": {"batchEnabled": True}})
