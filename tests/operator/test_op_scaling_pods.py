"""The operator's scaling (scaling.step, the engine and the admin client) against real store pods:
two `txnkeeper serve --role store` processes started as a StatefulSet starts them (`--replicas 1
--shards 4`, so pod 1 owns nothing), messages written, then scale 2 (two shards move to pod 1, its
source SIGKILLed and restarted right after its first fence) and back to 1; every message is read back
from the owner the record names, and pod 1 holds nothing when the StatefulSet would shrink.

The operator is "restarted" before every decision: each round starts from the ConfigMap alone.
Each test is skipped while the runtime serves no moves of its kind (the pods' side of contracts §12 is
built beside this).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from txnkeeper.client import Client
from txnkeeper.contract.admin import AdminClient
from txnkeeper.contract.placement import Member, Placement
from txnkeeper.fleet.process import RuntimeProcess, write_admin_token
from txnkeeper_operator import builders, scaling
from txnkeeper_operator.context import Context
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.engine.placement import MovePhase
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

pytestmark = pytest.mark.timeout(240)
TOKEN = "scaling-pods-token-0123456789"
TOPICS = [f"persistent://t/ns/orders-{i}" for i in range(8)]


class ConfigMaps:
    """The part of the Kubernetes API scaling uses: the placement ConfigMap and the CR's annotations."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(name)
        return json.loads(json.dumps(found)) if found is not None else None

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        self.objects[manifest["metadata"]["name"]] = json.loads(json.dumps(manifest))

    async def create_if_absent(self, manifest: Mapping[str, Any]) -> bool:
        if manifest["metadata"]["name"] in self.objects:
            return False
        await self.apply(manifest)
        return True

    async def patch_resource(self, plural: str, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        raise AssertionError("no rebalance annotation in this test")


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.seen.append((reason, message))


@pytest.fixture
async def pods(tmp_path: Path) -> AsyncIterator[dict[int, RuntimeProcess]]:
    pytest.importorskip(
        "txnkeeper.admin.shard_routes",
        reason="this runtime serves no shard moves yet (contracts §12 store side)",
    )
    token = write_admin_token(tmp_path / "token", TOKEN)
    procs = {
        o: RuntimeProcess.in_work_dir(
            tmp_path, f"pas-{o}", "store", token_file=token, release="2.0.0",
            extra_args=["--replicas", "1", "--shards", "4"],
        )
        for o in (0, 1)
    }  # fmt: skip
    try:
        for proc in procs.values():
            proc.start()
        for proc in procs.values():
            await proc.wait_started()
        yield procs
    finally:
        for proc in procs.values():
            await proc.stop()


def _pod(ordinal: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pas-{ordinal}"},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


async def _read_all(record: Placement, pods: dict[int, RuntimeProcess], subscription: str) -> list[bytes]:
    """Every message of every topic, by a new subscription on the owner the record names."""
    got: list[bytes] = []
    for topic in TOPICS:
        address = pods[record.owner_of_topic(topic)].client_address
        assert address is not None
        async with Client(coordinators=[], stores=[address]) as client:
            consumer = await client.subscribe(topic, subscription)
            for _ in range(3):
                message = await consumer.receive(timeout=10)
                got.append(message.data)
                await consumer.acknowledge(message)
    return got


async def test_scale_store_pods_out_and_in_with_a_source_killed(
    pods: dict[int, RuntimeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scaling, "MAX_ROUNDS", 1)  # one decision per step: a kill between any two
    assert pods[0].client_address is not None
    async with Client(coordinators=[], stores=[pods[0].client_address]) as client:
        for topic in TOPICS:
            producer = await client.create_producer(topic)
            for i in range(3):
                await producer.send(f"{topic}/{i}".encode())
    body = {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "PendingAckStore",
        "metadata": {"name": "pas", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"version": "2.0.0", "replicas": 2, "shards": 4, "scaling": {"maxConcurrentMoves": 1}},
    }
    cr = Resource.from_body(body)
    kube, events = ConfigMaps(), Events()
    sizes: list[int] = []

    async def resize(replicas: int, initial: int, units: int) -> None:
        assert (initial, units) == (1, 4)
        sizes.append(replicas)

    def member(_cr: Resource, ordinal: int) -> Member:
        address = pods[ordinal].client_address
        assert address is not None
        return Member(address, f"pulsar://{address}", pods[ordinal].admin_url)

    # The StatefulSet as the operator keeps it: 2 pods now, started with the first record's counts.
    count = builders.PodCount(2, 1, 4)
    started = builders.statefulset(cr, Template("2.0.0", BatchSettings()), OperatorSettings(), None, count)

    async with aiohttp.ClientSession() as session:
        admin = AdminClient(session, timeout_seconds=20, token=TOKEN)
        ctx = Context(kube=kube, admin=admin, settings=OperatorSettings(), events=events)  # type: ignore[arg-type]
        run = scaling.ScalingRun(
            ctx, cr, body, [_pod(0), _pod(1)], resize, TOKEN,
            base_of=lambda pod: pods[int(pod["metadata"]["name"][-1])].admin_url, member_of=member,
        )  # fmt: skip
        killed = False

        async def drive(desired: int, replicas: int) -> scaling.Placed:
            nonlocal killed
            for _ in range(60):
                placed = await scaling.load(ctx, cr, started)  # a fresh operator each round
                placed, decision, replicas = await scaling.step(run, placed, desired, replicas)
                fenced = [m for m in placed.state.moves if m.phase is MovePhase.RECEIVE]
                if fenced and not killed:
                    killed = True  # the source SIGKILLed right after its fence, then restarted
                    source = pods[fenced[0].source]
                    source.kill()
                    source.start()
                    await source.wait_started()
                if decision.phase == "Balanced" and replicas == desired:
                    return placed
            raise AssertionError(f"not balanced: {placed.state}")

        # 1 -> 2 (the StatefulSet was grown by the operator already: its pods run)
        placed = await drive(2, 2)
        assert killed
        record = placed.record
        assert sorted(len(record.shards_of(o)) for o in (0, 1)) == [2, 2]
        listed = {o: await admin.list_shards(pods[o].admin_url) for o in (0, 1)}
        assert {o: sorted(u.unit for u in held.units) for o, held in listed.items()} == {
            o: sorted(record.shards_of(o)) for o in (0, 1)
        }
        assert all(held.epoch == record.epoch for held in listed.values())
        sent = sorted(f"{t}/{i}".encode() for t in TOPICS for i in range(3))
        assert sorted(await _read_all(record, pods, "after-scale-out")) == sent

        # 2 -> 1: pod 1's shards move home, then the StatefulSet shrinks (pod 1 holds nothing).
        placed = await drive(1, 2)
        assert placed.record.owners == (0, 0, 0, 0) and sizes[-1] == 1
        assert (await admin.list_shards(pods[1].admin_url)).units == ()
        assert sorted(await _read_all(placed.record, pods, "after-scale-in")) == sent
    reasons = [r for r, _ in events.seen]
    assert reasons.count("ShardMoved") == 4 and "Scaled" in reasons


async def test_scale_coordinator_pods_out_and_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for coordinator ids: two coordinator pods started with `--coordinators 4
    --coordinator-ids auto --replicas 1`, scaled to 2 (two ids move with their logs) and back to 1."""
    pytest.importorskip(
        "txnkeeper.admin.coordinator_moves", reason="this runtime moves no coordinator ids yet"
    )
    monkeypatch.setattr(scaling, "MAX_ROUNDS", 1)
    token = write_admin_token(tmp_path / "token", TOKEN)
    procs = {
        o: RuntimeProcess.in_work_dir(
            tmp_path, f"tc-{o}", "coordinator", token_file=token, release="2.0.0",
            extra_args=["--coordinators", "4", "--coordinator-ids", "auto", "--replicas", "1"],
        )
        for o in (0, 1)
    }  # fmt: skip
    body = {
        "apiVersion": "txnkeeper.io/v1",
        "kind": "TransactionCoordinator",
        "metadata": {"name": "tc", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"version": "2.0.0", "replicas": 2, "coordinators": 4},
    }
    cr = Resource.from_body(body)
    started = builders.statefulset(
        cr, Template("2.0.0", BatchSettings()), OperatorSettings(), None, builders.PodCount(2, 1, 4)
    )
    kube, events = ConfigMaps(), Events()

    async def resize(replicas: int, initial: int, units: int) -> None:
        assert (initial, units) == (1, 4)

    def member(_cr: Resource, ordinal: int) -> Member:
        address = procs[ordinal].client_address
        assert address is not None
        return Member(address, f"pulsar://{address}", procs[ordinal].admin_url)

    try:
        for proc in procs.values():
            proc.start()
        for proc in procs.values():
            await proc.wait_started()
        async with aiohttp.ClientSession() as session:
            admin = AdminClient(session, timeout_seconds=20, token=TOKEN)
            ctx = Context(kube=kube, admin=admin, settings=OperatorSettings(), events=events)  # type: ignore[arg-type]
            pod_objs = [_pod(0), _pod(1)]
            for pod in pod_objs:
                pod["metadata"]["name"] = pod["metadata"]["name"].replace("pas", "tc")
            run = scaling.ScalingRun(
                ctx, cr, body, pod_objs, resize, TOKEN,
                base_of=lambda pod: procs[int(pod["metadata"]["name"][-1])].admin_url, member_of=member,
            )  # fmt: skip
            for desired in (2, 1):
                for _ in range(60):
                    placed = await scaling.load(ctx, cr, started)
                    placed, decision, replicas = await scaling.step(run, placed, desired, 2)
                    if decision.phase == "Balanced" and replicas == desired:
                        break
                else:
                    raise AssertionError(f"not balanced at {desired}: {placed.state}")
                held = {o: await admin.list_coordinator_ids(procs[o].admin_url) for o in (0, 1)}
                assert {o: sorted(u.unit for u in h.units) for o, h in held.items()} == {
                    o: sorted(placed.record.shards_of(o)) for o in (0, 1)
                }
                if desired == 2:
                    assert sorted(len(placed.record.shards_of(o)) for o in (0, 1)) == [2, 2]
            assert placed.record.owners == (0, 0, 0, 0)
    finally:
        for proc in procs.values():
            await proc.stop()
    assert [r for r, _ in events.seen].count("ShardMoved") == 4
