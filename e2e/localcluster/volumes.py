"""Materialising a pod's volumes as directories on this machine.

Why: containers here are local processes, so every volume becomes a directory that podinit.py
bind-mounts at the container's mountPath: emptyDir under the pod's directory, ConfigMap/Secret/
downward-API/projected (service-account token included) as files written by the node agent, and a
PersistentVolumeClaim as the directory of the PersistentVolume it is bound to (which the provisioner
created), so its data outlives the pod exactly as a real volume does.
"""

# Files here are a few bytes on local disk (volumes, logs, spec files): blocking on them for
# microseconds is cheaper and clearer than a thread hop, so the async-file rules are off.
# ruff: noqa: ASYNC240

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .kubeapi import KubeClient
from .podspec import (
    ConfigError,
    decode_secret,
    expand,
    field_ref,
    resource_field_ref,
    write_file,
    write_key_files,
)

Obj = dict[str, Any]


class VolumeNotReady(Exception):
    """Retry later (a PVC not bound yet, a ConfigMap not created yet): FailedMount in a real kubelet."""


async def _configmap_bytes(client: KubeClient, ns: str, name: str) -> dict[str, bytes] | None:
    cm = await client.get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
    if cm is None:
        return None
    data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return data


async def _secret_bytes(client: KubeClient, ns: str, name: str) -> dict[str, bytes] | None:
    secret = await client.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
    if secret is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


async def configmap_strings(client: KubeClient, ns: str, name: str) -> dict[str, str] | None:
    cm = await client.get(f"/api/v1/namespaces/{ns}/configmaps/{name}")
    return None if cm is None else dict(cm.get("data") or {})


async def secret_strings(client: KubeClient, ns: str, name: str) -> dict[str, str] | None:
    secret = await client.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
    return None if secret is None else decode_secret(secret.get("data"))


async def materialise(
    client: KubeClient,
    pod: Obj,
    volume: Obj,
    pod_dir: Path,
    node_allocatable: Mapping[str, str],
) -> Path:
    """The host directory (or file) that backs `volume`."""
    ns = pod["metadata"]["namespace"]
    name: str = volume["name"]
    target: Path = pod_dir / "volumes" / name
    if "emptyDir" in volume:
        target.mkdir(parents=True, exist_ok=True)
        return target
    if "hostPath" in volume:
        path = Path(volume["hostPath"]["path"])
        if volume["hostPath"].get("type") in ("DirectoryOrCreate",) and not path.exists():
            path.mkdir(parents=True)
        if not path.exists():
            raise VolumeNotReady(f"hostPath {path} does not exist")
        return path
    if "persistentVolumeClaim" in volume:
        return await _pvc_path(client, ns, volume["persistentVolumeClaim"]["claimName"])
    if "configMap" in volume or "secret" in volume:
        src = volume.get("configMap") or volume["secret"]
        ref = src.get("name") or src.get("secretName")
        is_cm = "configMap" in volume
        data = await (_configmap_bytes if is_cm else _secret_bytes)(client, ns, ref)
        if data is None:
            if src.get("optional"):
                target.mkdir(parents=True, exist_ok=True)
                return target
            raise VolumeNotReady(f"{'configmap' if is_cm else 'secret'} {ref!r} not found")
        _clear(target)
        write_key_files(target, data, src.get("items"), src.get("defaultMode", 0o644))
        return target
    if "downwardAPI" in volume:
        _clear(target)
        target.mkdir(parents=True, exist_ok=True)
        await _downward(pod, volume["downwardAPI"].get("items", []), target, 0o644, node_allocatable)
        return target
    if "projected" in volume:
        _clear(target)
        target.mkdir(parents=True, exist_ok=True)
        mode = volume["projected"].get("defaultMode", 0o644)
        for source in volume["projected"].get("sources", []):
            await _projected_source(client, pod, source, target, mode=mode, node_allocatable=node_allocatable)
        return target
    kinds = sorted(k for k in volume if k != "name")
    raise ConfigError(f"volume {name!r}: unsupported volume source {kinds} on the local node")


async def _pvc_path(client: KubeClient, ns: str, claim: str) -> Path:
    pvc = await client.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
    if pvc is None:
        raise VolumeNotReady(f"persistentvolumeclaim {claim!r} not found")
    pv_name = pvc.get("spec", {}).get("volumeName")
    if not pv_name or pvc.get("status", {}).get("phase") != "Bound":
        raise VolumeNotReady(f"persistentvolumeclaim {claim!r} is not bound yet")
    pv = await client.get(f"/api/v1/persistentvolumes/{pv_name}")
    if pv is None:
        raise VolumeNotReady(f"persistentvolume {pv_name!r} not found")
    spec = pv["spec"]
    path = (spec.get("hostPath") or spec.get("local") or {}).get("path")
    if path is None:
        raise ConfigError(f"persistentvolume {pv_name!r} is neither hostPath nor local")
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)


async def _downward(
    pod: Obj, items: list[Obj], target: Path, default_mode: int, node_allocatable: Mapping[str, str]
) -> None:
    for item in items:
        if "fieldRef" in item:
            value = field_ref(pod, item["fieldRef"]["fieldPath"])
        else:
            ref = item["resourceFieldRef"]
            container = next(c for c in pod["spec"]["containers"] if c["name"] == ref.get("containerName"))
            value = resource_field_ref(container, ref, node_allocatable)
        write_file(target / item["path"], value.encode(), item.get("mode", default_mode))


async def _projected_source(
    client: KubeClient, pod: Obj, source: Obj, target: Path, *, mode: int, node_allocatable: Mapping[str, str]
) -> None:
    ns = pod["metadata"]["namespace"]
    if "serviceAccountToken" in source:
        sat = source["serviceAccountToken"]
        sa = pod["spec"].get("serviceAccountName", "default")
        spec: Obj = {
            "expirationSeconds": sat.get("expirationSeconds", 3600),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
        if sat.get("audience"):
            spec["audiences"] = [sat["audience"]]
        result = await client.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        write_file(target / sat["path"], result["status"]["token"].encode(), mode)
    elif "configMap" in source or "secret" in source:
        is_cm = "configMap" in source
        src = source["configMap"] if is_cm else source["secret"]
        data = await (_configmap_bytes if is_cm else _secret_bytes)(client, ns, src["name"])
        if data is None:
            if src.get("optional"):
                return
            raise VolumeNotReady(f"{'configmap' if is_cm else 'secret'} {src['name']!r} not found")
        write_key_files(target, data, src.get("items"), mode)
    elif "downwardAPI" in source:
        await _downward(pod, source["downwardAPI"].get("items", []), target, mode, node_allocatable)
    else:
        raise ConfigError(f"unsupported projected volume source {sorted(source)}")


def _clear(target: Path) -> None:
    """Rewrite ConfigMap/Secret volumes from scratch so deleted keys disappear."""
    if target.exists():
        for p in sorted(target.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()


def mounts_for(container: Obj, volume_paths: Mapping[str, Path], env: Mapping[str, str]) -> list[Obj]:
    """podinit.py's mount list for one container: source directory (or subPath inside it) -> mountPath."""
    mounts: list[Obj] = []
    for vm in container.get("volumeMounts", []):
        if vm["name"] not in volume_paths:
            raise ConfigError(f"volumeMount {vm['name']!r} names no volume of the pod")
        source = volume_paths[vm["name"]]
        sub = vm.get("subPath") or (expand(vm["subPathExpr"], env) if vm.get("subPathExpr") else "")
        if sub:
            source = source / sub
            if not source.exists():
                source.mkdir(parents=True)  # as the kubelet does for a missing subPath
        mounts.append(
            {"source": str(source), "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))}
        )
    return mounts
