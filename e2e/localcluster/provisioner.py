"""Dynamic provisioning of PersistentVolumes as local directories (the "local-path" StorageClass).

Why: StatefulSets ask for storage through volumeClaimTemplates. Like an external provisioner on a real
cluster, this creates a PersistentVolume (hostPath, pinned to the one node) for every pending claim of
its class and lets kube-controller-manager's PV controller bind them; when a claim is deleted the PV
controller releases the volume and this deletes the PV and its directory (reclaimPolicy Delete).
A pod deleted and recreated with the same claim therefore finds its data again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

from .config import NODE_NAME, PROVISIONER_NAME
from .kubeapi import ApiError, KubeClient, informer

log = logging.getLogger("provisioner")
Obj = dict[str, Any]
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


class Provisioner:
    def __init__(self, client: KubeClient, volumes_dir: Path) -> None:
        self.client = client
        self.volumes_dir = volumes_dir
        self.classes: dict[str, Obj] = {}

    async def run(self) -> None:
        await asyncio.gather(
            informer(
                self.client, "/apis/storage.k8s.io/v1/storageclasses", {}, self._classes, self._class_event
            ),
            informer(self.client, "/api/v1/persistentvolumeclaims", {}, self._claims, self._claim_event),
            informer(self.client, "/api/v1/persistentvolumes", {}, self._volumes, self._volume_event),
        )

    async def _classes(self, items: list[Obj]) -> None:
        self.classes = {c["metadata"]["name"]: c for c in items}

    async def _class_event(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            self.classes.pop(obj["metadata"]["name"], None)
        else:
            self.classes[obj["metadata"]["name"]] = obj

    async def _claims(self, items: list[Obj]) -> None:
        for pvc in items:
            await self._claim_event("MODIFIED", pvc)

    async def _claim_event(self, kind: str, pvc: Obj) -> None:
        if kind == "DELETED" or pvc["spec"].get("volumeName") or pvc["metadata"].get("deletionTimestamp"):
            return
        sc = self.classes.get(pvc["spec"].get("storageClassName") or "")
        if sc is None:
            # The class informer may not have listed yet; fetch the class directly.
            name = pvc["spec"].get("storageClassName")
            if not name:
                return
            sc = await self.client.get(f"/apis/storage.k8s.io/v1/storageclasses/{name}")
            if sc is None:
                return
        if sc.get("provisioner") != PROVISIONER_NAME:
            return
        try:
            await self._provision(pvc, sc)
        except ApiError as e:
            log.warning("provisioning %s/%s: %s", pvc["metadata"]["namespace"], pvc["metadata"]["name"], e)

    async def _provision(self, pvc: Obj, sc: Obj) -> None:
        meta = pvc["metadata"]
        name = f"pvc-{meta['uid']}"  # the external-provisioner naming convention
        path = self.volumes_dir / name
        path.mkdir(parents=True, exist_ok=True)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER_NAME}},
            "spec": {
                "capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"]},
                "accessModes": pvc["spec"].get("accessModes", ["ReadWriteOnce"]),
                "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                "storageClassName": sc["metadata"]["name"],
                "volumeMode": pvc["spec"].get("volumeMode", "Filesystem"),
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                                ]
                            }
                        ]
                    }
                },
            },
        }
        if await self.client.create("/api/v1/persistentvolumes", pv) is not None:
            log.info("provisioned %s for %s/%s at %s", name, meta["namespace"], meta["name"], path)

    async def _volumes(self, items: list[Obj]) -> None:
        for pv in items:
            await self._volume_event("MODIFIED", pv)

    async def _volume_event(self, kind: str, pv: Obj) -> None:
        ours = pv["metadata"].get("annotations", {}).get(PROVISIONED_BY) == PROVISIONER_NAME
        if kind == "DELETED" or not ours:
            return
        released = pv.get("status", {}).get("phase") in ("Released", "Failed")
        if released and pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
            path = Path(pv["spec"]["hostPath"]["path"])
            if path.parent == self.volumes_dir:  # never delete a directory this provisioner did not make
                shutil.rmtree(path, ignore_errors=True)
            if await self.client.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}"):
                log.info("deleted released volume %s", pv["metadata"]["name"])
