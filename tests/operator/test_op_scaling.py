"""Scaling through the whole reconcile (scaling.py): the placement ConfigMap, the §12 verbs called in
order on the pods, the StatefulSet resized, Events and status.placement, the rebalance annotation.

The Kubernetes side is test_op_reconcile's in-memory cluster; each pod's admin API is a scalesim pod
(the engine scenarios' model of the verbs and their rules), reached through the same calls the real
AdminClient makes. The real API server's part (scale subresource, CEL, RBAC) is test_op_apiserver's.
"""

from __future__ import annotations

import json
from typing import Any

from engine.scalesim import PodError, SimPod
from test_op_reconcile import Clock, Events, FakeKube, FakePods, Obj, _cr

from txnkeeper.contract.admin import AdminError, HeldUnit, HeldUnits
from txnkeeper.contract.placement import Placement
from txnkeeper_operator import naming
from txnkeeper_operator.context import Context
from txnkeeper_operator.reconcile import reconcile
from txnkeeper_operator.settings import OperatorSettings


class ScalingKube(FakeKube):
    def run_statefulset_controller(self) -> None:
        """Also removes the pods above spec.replicas (with whenScaled: Delete, their claims)."""
        super().run_statefulset_controller()
        sts = self.objects.get(("StatefulSet", "ns", "txn"))
        if sts is None:
            return
        for key in [k for k in self.objects if k[0] == "Pod"]:
            if naming.pod_ordinal(key[2]) >= sts["spec"]["replicas"]:
                del self.objects[key]


class PlacementPods(FakePods):
    """FakePods plus the §12 verbs, each pod's placement state a scalesim pod."""

    def __init__(self, kube: FakeKube, initial: Placement) -> None:
        super().__init__(kube)
        self.initial = initial
        self.sims: dict[int, SimPod] = {}
        self.verbs: list[str] = []
        self.removed_holding: list[int] = []

    def _sim(self, base: str) -> SimPod:
        ordinal = naming.pod_ordinal(self._pod(base)["metadata"]["name"])
        if ordinal not in self.sims:
            pod = SimPod(ordinal, self.initial)
            pod.data = {u: [1] for u in self.initial.shards_of(ordinal)}
            self.sims[ordinal] = pod
        return self.sims[ordinal]

    def forget_removed(self) -> None:
        present = {naming.pod_ordinal(k[2]) for k in self.kube.objects if k[0] == "Pod"}
        for ordinal in [o for o in self.sims if o not in present]:
            if self.sims.pop(ordinal).data:
                self.removed_holding.append(ordinal)

    def _call(self, what: str, base: str, verb: Any, *args: Any) -> None:
        self.verbs.append(f"{what} txn-{self._sim(base).ordinal}")
        try:
            verb(*args)
        except PodError as err:
            raise AdminError(str(err)) from err

    async def get_placement(self, base: str) -> Any:
        return self._sim(base).record

    def placement_calls(self, kind: str) -> PlacementPods:
        assert kind == "coordinator-ids"
        return self

    async def held(self, base: str) -> Any:
        pod = self._sim(base)
        units = tuple(
            HeldUnit(u, pod.record.owner_of(u), state, 10, 0.0, 1.0)
            for u, state in sorted(pod.held().items())
        )
        return HeldUnits(pod.record.epoch, units)

    async def put_placement(self, base: str, record: Placement, token: str) -> None:
        self._call(f"put {record.epoch}", base, self._sim(base).put, record)

    async def fence(self, base: str, unit: int, move: str, token: str) -> dict[str, Any]:
        self._call(f"fence {unit}", base, self._sim(base).fence, unit, move)
        return {"files": []}

    async def receive(self, base: str, unit: int, move: str, source: str, token: str) -> dict[str, Any]:
        # The target is given the source's admin URL from the record (its DNS name).
        assert source.startswith("http://txn-") and source.endswith(".txn.ns.svc:8080"), source
        origin = self.sims[naming.pod_ordinal(source.split(".", maxsplit=1)[0].removeprefix("http://"))]
        self._call(f"receive {unit}", base, self._sim(base).receive, unit, move, origin)
        return {"files": 0, "bytes": 0}

    async def release(self, base: str, unit: int, move: str, token: str) -> None:
        self._call(f"release {unit}", base, self._sim(base).release, unit, move)

    async def discard(self, base: str, unit: int, move: str, token: str) -> None:
        self._call(f"discard {unit}", base, self._sim(base).discard, unit, move)

    async def unfence(self, base: str, unit: int, move: str, token: str) -> None:
        self._call(f"unfence {unit}", base, self._sim(base).unfence, unit, move)


def _cm(kube: FakeKube) -> tuple[Placement, dict[str, Any]]:
    data = kube.objects[("ConfigMap", "ns", "txn-placement")]["data"]
    return Placement.loads(data["placement.json"]), json.loads(data["moves.json"])


async def _settle(kube: ScalingKube, pods: PlacementPods, ctx: Context, done: Any, limit: int = 40) -> None:
    for _ in range(limit):
        kube.run_statefulset_controller()
        pods.forget_removed()
        await reconcile(kube.cr, ctx)
        if done():
            return
    raise AssertionError(f"not settled: {kube.cr.get('status', {}).get('placement')}")


async def test_scale_out_and_in_moves_coordinator_ids_through_the_verbs() -> None:
    cr: Obj = _cr("2.0.0")
    cr["spec"].update(replicas=1, coordinators=4)
    kube = ScalingKube(cr)
    pods = PlacementPods(kube, Placement.initial("coordinator-ids", 1, 4))
    events = Events()
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=events, clock=Clock())  # type: ignore[arg-type]

    def placement() -> dict[str, Any]:
        found: dict[str, Any] = kube.cr.get("status", {}).get("placement") or {}
        return found

    await _settle(kube, pods, ctx, lambda: placement().get("phase") == "Balanced")
    record, moves = _cm(kube)
    # Epoch 1 as the pods derive it, then epoch 2 with the members (pushed to the pod).
    assert (record.epoch, record.owners, moves["initialReplicas"]) == (2, (0, 0, 0, 0), 1)
    assert record.members[0].admin_url == "http://txn-0.txn.ns.svc:8080" and pods.sims[0].record == record
    sts = kube.objects[("StatefulSet", "ns", "txn")]
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--replicas") + 1] == "1"

    kube.cr["spec"]["replicas"] = 2  # kubectl scale --replicas=2
    await _settle(kube, pods, ctx, lambda: placement().get("phase") == "Balanced")
    record, moves = _cm(kube)
    assert sorted(len(record.shards_of(o)) for o in (0, 1)) == [2, 2] and moves["moves"] == []
    assert kube.objects[("StatefulSet", "ns", "txn")]["spec"]["replicas"] == 2
    # Fence on the source, receive on the target, the record to the target first, then release.
    first = [v for v in pods.verbs if not v.startswith("put")][:3]
    assert first == ["fence 0 txn-0", "receive 0 txn-1", "release 0 txn-0"]
    switch = pods.verbs.index("receive 0 txn-1") + 1
    assert pods.verbs[switch].endswith("txn-1") and pods.verbs[switch + 1].endswith("txn-0")
    assert all(s.record == record for s in pods.sims.values())
    reasons = [r for _, r, _ in events.seen]
    assert reasons.count("ShardMoveStarted") == 2 and reasons.count("ShardMoved") == 2 and "Scaled" in reasons
    status = placement()
    assert status["epoch"] == record.epoch and [p["count"] for p in status["pods"]] == [2, 2]

    # The ConfigMap lost (deleted by hand): the first record is written again, then the pods' newer
    # copy is taken instead of being pushed an older one they would refuse.
    del kube.objects[("ConfigMap", "ns", "txn-placement")]
    await reconcile(kube.cr, ctx)
    assert _cm(kube)[0] == record and _cm(kube)[1]["initialReplicas"] == 1  # what the pods started with
    assert "PlacementAdopted" in [r for _, r, _ in events.seen]

    kube.cr["spec"]["replicas"] = 1
    await _settle(
        kube,
        pods,
        ctx,
        lambda: placement().get("phase") == "Balanced" and ("Pod", "ns", "txn-1") not in kube.objects,
    )
    record, _ = _cm(kube)
    assert record.owners == (0, 0, 0, 0) and pods.removed_holding == []
    assert kube.objects[("StatefulSet", "ns", "txn")]["spec"]["replicas"] == 1
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert conditions["ScaleInSafe"]["status"] == "True"

    # kubectl annotate ... txnkeeper.io/rebalance=now: nothing to move; the annotation is removed.
    kube.cr["metadata"]["annotations"][naming.REBALANCE_ANNOTATION] = "now"
    await _settle(
        kube, pods, ctx, lambda: naming.REBALANCE_ANNOTATION not in kube.cr["metadata"]["annotations"]
    )
    assert ("Normal", "Rebalanced") in [(t, r) for t, r, _ in events.seen]


async def test_a_record_of_the_same_epoch_that_differs_stops_all_placement_changes() -> None:
    """The ConfigMap's epoch 1 puts ids on pods 0 and 1, the pods' own epoch 1 all on pod 0 (they were
    started with other counts): pushing either would hand ids to a pod without their data."""
    cr: Obj = _cr("2.0.0")
    cr["spec"].update(replicas=2, coordinators=4)
    kube = ScalingKube(cr)
    pods = PlacementPods(kube, Placement.initial("coordinator-ids", 1, 4))
    events = Events()
    ctx = Context(kube=kube, admin=pods, settings=OperatorSettings(), events=events, clock=Clock())  # type: ignore[arg-type]
    for _ in range(6):
        kube.run_statefulset_controller()
        await reconcile(kube.cr, ctx)
    record, _ = _cm(kube)
    assert (record.epoch, record.owners) == (1, (0, 1, 0, 1))  # written from spec.replicas: 2
    assert all(s.record.epoch == 1 and s.record.owners == (0, 0, 0, 0) for s in pods.sims.values())
    assert pods.verbs == []  # no verb, no push
    assert kube.cr["status"]["placement"]["phase"] == "Unusable"
    warnings = [m for _, r, m in events.seen if r == "PlacementUnusable"]
    assert warnings and "with owners [0, 0, 0, 0]" in warnings[0]
    conditions = {c["type"]: c for c in kube.cr["status"]["conditions"]}
    assert conditions["ScaleInSafe"]["status"] == "Unknown"
