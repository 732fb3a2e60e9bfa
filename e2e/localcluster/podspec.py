"""Turning a pod spec into a process: environment, $(VAR) expansion, downward API, command lookup.

Why separate from the process supervisor: these are the rules of the Kubernetes API (the same ones a
real kubelet applies), kept pure so they are easy to read against the upstream documentation and to
unit-test without a cluster.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from decimal import ROUND_UP, Decimal
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

# A lookup of a ConfigMap or Secret's data by (namespace, name); None when it does not exist.
DataLookup = Callable[[str, str], Awaitable[dict[str, str] | None]]


class ConfigError(Exception):
    """The pod cannot start as specified (CreateContainerConfigError in a real kubelet)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, `$$` escapes a `$`, anything
    else (undefined variables, a lone `$`) is kept literally."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2 : close]
                    out.append(env[name] if name in env else text[i : close + 1])
                    i = close + 1
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def field_ref(pod: Obj, path: str) -> str:
    """The downward API's fieldRef paths."""
    meta = pod["metadata"]
    status = pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(a["ip"] for a in status.get("hostIPs", [])),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(a["ip"] for a in status.get("podIPs", [])),
    }
    if path in simple:
        return str(simple[path])
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path == prefix:
            items = sorted((meta.get(source) or {}).items())
            return "\n".join(f'{k}="{v}"' for k, v in items)
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    raise ConfigError(f"unsupported downward API fieldRef {path!r}")


def _quantity(q: str) -> Decimal:
    suffixes: dict[str, Decimal | int] = {
        "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
        "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
        "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    }  # fmt: skip
    for suffix in sorted(suffixes, key=len, reverse=True):
        if q.endswith(suffix):
            return Decimal(q[: -len(suffix)]) * Decimal(suffixes[suffix])
    return Decimal(q)


def resource_field_ref(container: Obj, ref: Obj, node_allocatable: Mapping[str, str]) -> str:
    """limits.cpu, requests.memory, ...: unset limits fall back to the node's allocatable."""
    kind, _, resource = ref["resource"].partition(".")
    value = (container.get("resources", {}).get(kind) or {}).get(resource)
    if value is None:
        value = node_allocatable.get(resource, "0") if kind == "limits" else "0"
    divisor = _quantity(str(ref.get("divisor", "1")))
    return str((_quantity(str(value)) / divisor).to_integral_value(rounding=ROUND_UP))


async def container_env(
    pod: Obj,
    container: Obj,
    *,
    base: Mapping[str, str],
    configmap: DataLookup,
    secret: DataLookup,
    node_allocatable: Mapping[str, str],
) -> dict[str, str]:
    """The container's environment: `base` (PATH, HOSTNAME, KUBERNETES_SERVICE_*), then envFrom, then
    env in order, each value $(VAR)-expanded against what is defined before it, as the kubelet does."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        ref = source.get("configMapRef") or source.get("secretRef")
        if ref is None:
            continue
        lookup = configmap if "configMapRef" in source else secret
        data = await lookup(ns, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"{'configmap' if lookup is configmap else 'secret'} {ref['name']!r} not found")
        for k, v in data.items():
            env[prefix + k] = v
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        vf = var["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            target = container
            if vf["resourceFieldRef"].get("containerName"):
                target = next(
                    c
                    for c in pod["spec"]["containers"]
                    if c["name"] == vf["resourceFieldRef"]["containerName"]
                )
            env[name] = resource_field_ref(target, vf["resourceFieldRef"], node_allocatable)
        elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
            is_cm = "configMapKeyRef" in vf
            ref = vf["configMapKeyRef"] if is_cm else vf["secretKeyRef"]
            data = await (configmap if is_cm else secret)(ns, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = "configmap" if is_cm else "secret"
                raise ConfigError(f"{what} {ref['name']!r} key {ref['key']!r} not found (env {name})")
            env[name] = data[ref["key"]]
        else:
            raise ConfigError(f"unsupported valueFrom in env {name}: {sorted(vf)}")
    return env


def resolve_command(argv0: str, env: Mapping[str, str]) -> str:
    """Images are ignored: a command is looked up on the container's PATH (the repo's venv first).
    An absolute path that exists on this machine is used as is; one that only exists in the image
    (e.g. /opt/venv/bin/txnkeeper) is mapped to the same file name on PATH."""
    if "/" in argv0:
        if os.path.exists(argv0):
            return argv0
        argv0 = os.path.basename(argv0)
    found = shutil.which(argv0, path=env.get("PATH", ""))
    if found is None:
        raise FileNotFoundError(
            f'exec: "{argv0}": executable file not found in $PATH ({env.get("PATH", "")})'
        )
    return found


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="surrogateescape") for k, v in (data or {}).items()}


def write_key_files(
    target: Path,
    data: Mapping[str, bytes],
    items: list[Obj] | None,
    default_mode: int,
) -> None:
    """Materialise ConfigMap/Secret keys as files: all keys, or only `items` (key -> path, mode)."""
    target.mkdir(parents=True, exist_ok=True)
    selected: list[tuple[str, str, int]]
    if items:
        selected = [(i["key"], i["path"], i.get("mode", default_mode)) for i in items]
    else:
        selected = [(k, k, default_mode) for k in data]
    for key, rel, mode in selected:
        if key not in data:
            raise ConfigError(f"key {key!r} not found")
        write_file(target / rel, data[key], mode)


def write_file(path: Path, content: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    tmp.chmod(mode)
    tmp.replace(path)
