"""The node agent: a kubelet for one node whose pods are local processes, plus the volume provisioner.

Why: the real kubelet needs a container runtime, which these machines lack. This agent registers the
Node (and keeps its Lease and Ready condition fresh so the node lifecycle controller leaves it alone),
watches the pods bound to it, and gives each a PodWorker. It authenticates as system:node:<name>, so the
Node authorizer and NodeRestriction admission limit it exactly as they limit a kubelet.

Run by `python -m e2e.localcluster up`; standalone: python -m e2e.localcluster.nodeagent --state-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import signal
import time
from pathlib import Path
from typing import Any

from .config import NODE_NAME, ClusterInfo, Layout, k8s_version, venv_bin_dir
from .containers import now
from .kubeapi import ApiError, KubeClient, informer
from .nodecontext import PodRef
from .podworker import PodWorker
from .procs import stop
from .provisioner import Provisioner

log = logging.getLogger("nodeagent")
Obj = dict[str, Any]
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 10.0
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class IpPool:
    """Pod IPs in 127.0.0.0/8 (127.0.0.2 ...), handed out round-robin so that a just-freed address
    (whose old sockets may linger) is the last to be reused. The whole of 127/8 routes to loopback."""

    def __init__(self, first: int = 2, last: int = 254, third_octet: int = 0) -> None:
        self.addrs = [f"127.0.{third_octet}.{i}" for i in range(first, last + 1)]
        self.next = 0
        self.by_uid: dict[str, str] = {}

    def allocate(self, uid: str) -> str:
        if uid in self.by_uid:
            return self.by_uid[uid]
        used = set(self.by_uid.values())
        for _ in range(len(self.addrs)):
            addr = self.addrs[self.next]
            self.next = (self.next + 1) % len(self.addrs)
            if addr not in used:
                self.by_uid[uid] = addr
                return addr
        raise RuntimeError("pod IP pool exhausted")

    def release(self, uid: str) -> None:
        self.by_uid.pop(uid, None)


def _memory_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


class NodeAgent:
    def __init__(self, layout: Layout, info: ClusterInfo) -> None:
        self.layout = layout
        self.info = info
        self.client = KubeClient(layout.kubeconfig("kubelet"))
        self.provisioner = Provisioner(KubeClient(layout.kubeconfig("provisioner")), layout.volumes)
        self.workers: dict[str, PodWorker] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.ips = IpPool(third_octet=info.pod_subnet)
        cpus = os.environ.get("E2E_NODE_CPU", str(os.cpu_count() or 1))
        self.allocatable = {
            "cpu": cpus,
            "memory": os.environ.get("E2E_NODE_MEMORY", f"{_memory_kib()}Ki"),
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }

    # -- what pod workers use ---------------------------------------------------------------
    def base_env(self, pod: Obj) -> dict[str, str]:
        """What a container runtime and kubelet put in every container's environment. There is no
        kube-proxy, so KUBERNETES_SERVICE_HOST points at the API server itself; PYTHONUNBUFFERED stands
        in for the image's ENV so that logs are written as they happen."""
        port = str(self.info.apiserver_port)
        return {
            "PATH": f"{venv_bin_dir()}:{STANDARD_PATH}",
            "HOSTNAME": pod["metadata"]["name"][:63],
            "HOME": os.environ.get("HOME", "/root"),
            "PYTHONUNBUFFERED": "1",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
            "KUBERNETES_PORT_443_TCP": f"tcp://127.0.0.1:{port}",
            "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
            "KUBERNETES_PORT_443_TCP_PORT": port,
            "KUBERNETES_PORT_443_TCP_ADDR": "127.0.0.1",
        }

    def forget(self, worker: PodRef) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]

    async def event_for(
        self, worker: PodRef, type_: str, reason: str, message: str, container: str | None = None
    ) -> None:
        ts = now()
        involved: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": worker.name,
            "namespace": worker.namespace,
            "uid": worker.uid,
        }
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{worker.name}.", "namespace": worker.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": NODE_NAME},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        log.info("pod %s/%s: %s: %s", worker.namespace, worker.name, reason, message)
        try:
            await self.client.request("POST", f"/api/v1/namespaces/{worker.namespace}/events", event)
        except (ApiError, OSError) as e:
            # Typically 403 in a namespace being deleted; events are best effort, as in the kubelet.
            log.info("event %s for %s not recorded: %s", reason, worker.name, str(e)[:200])

    # -- the node -----------------------------------------------------------------------------
    async def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "local-process",
                },
            },
            "spec": {},
        }
        await self.client.create("/api/v1/nodes", node)
        await self._node_status()

    async def _node_status(self) -> None:
        ts = now()

        def condition(type_: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": ts,
                "lastTransitionTime": self._since.setdefault(type_, ts),
            }

        status = {
            "capacity": self.allocatable,
            "allocatable": self.allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "local node"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "local node"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "local node"),
                condition("Ready", "True", "KubeletReady", "local node agent is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": NODE_NAME},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": _read("/etc/machine-id"),
                "systemUUID": _read("/etc/machine-id"),
                "bootID": _read("/proc/sys/kernel/random/boot_id"),
                "kernelVersion": platform.release(),
                "osImage": "local processes (txnkeeper e2e node agent)",
                "containerRuntimeVersion": "local://0",
                "kubeletVersion": f"v{k8s_version()}",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        await self.client.merge_patch(f"/api/v1/nodes/{NODE_NAME}/status", {"status": status})

    _since: dict[str, str] = {}

    async def heartbeat(self) -> None:
        """Renew the node Lease every 10 s and the node status every 30 s, as the kubelet does."""
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE_NAME}"
        last_status = time.monotonic()
        while True:
            renew = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            try:
                if await self.client.get(lease_path) is None:
                    await self.client.create(
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                        {
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": NODE_NAME, "namespace": "kube-node-lease"},
                            "spec": {
                                "holderIdentity": NODE_NAME,
                                "leaseDurationSeconds": LEASE_SECONDS,
                                "renewTime": renew,
                            },
                        },
                    )
                else:
                    await self.client.merge_patch(lease_path, {"spec": {"renewTime": renew}})
                if time.monotonic() - last_status > 30:
                    await self._node_status()
                    last_status = time.monotonic()
            except (ApiError, OSError) as e:
                log.warning("heartbeat: %s", e)
            await asyncio.sleep(HEARTBEAT_SECONDS)

    # -- pods ---------------------------------------------------------------------------------
    async def _pods_listed(self, pods: list[Obj]) -> None:
        seen = set()
        for pod in pods:
            seen.add(pod["metadata"]["uid"])
            self._pod(pod)
        for uid, worker in list(self.workers.items()):
            if uid not in seen:
                worker.gone()

    async def _pod_event(self, kind: str, pod: Obj) -> None:
        if kind == "DELETED":
            worker = self.workers.get(pod["metadata"]["uid"])
            if worker is not None:
                worker.gone()
        else:
            self._pod(pod)

    def _pod(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is None:
            if pod["metadata"].get("deletionTimestamp") and not pod.get("status", {}).get(
                "containerStatuses"
            ):
                # Deleted before it ever ran here: finish the deletion.
                task = asyncio.create_task(self._final_delete(pod))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                return
            self.workers[uid] = PodWorker(self, pod)
        else:
            worker.update(pod)

    async def _final_delete(self, pod: Obj) -> None:
        meta = pod["metadata"]
        await self.client.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
        )

    async def run(self) -> None:
        # Processes left by an agent that was killed: they are unsupervised now, so stop them; the
        # workers below restart the containers (counted as restarts).
        for pidfile in self.layout.pods.glob("*/pids/*.pid"):
            stop(pidfile, grace=5.0)
        await self.register()
        tasks = [
            asyncio.create_task(self.heartbeat()),
            asyncio.create_task(self.provisioner.run()),
            asyncio.create_task(
                informer(
                    self.client,
                    "/api/v1/pods",
                    {"fieldSelector": f"spec.nodeName={NODE_NAME}"},
                    self._pods_listed,
                    self._pod_event,
                )
            ),
        ]
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        log.info("node %s registered; watching pods", NODE_NAME)
        await stopping.wait()
        log.info("stopping: terminating %d pods", len(self.workers))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*(w.stop_for_shutdown(10.0) for w in list(self.workers.values())))
        for w in list(self.workers.values()):
            w.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w.task
        await self.client.close()
        await self.provisioner.client.close()


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    layout = Layout(args.state_dir)
    agent = NodeAgent(layout, ClusterInfo.load(layout.cluster_file))
    asyncio.run(agent.run())


if __name__ == "__main__":
    main()
