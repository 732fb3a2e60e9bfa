"""One pod on the local node: its containers as local processes, their probes, and the pod's status.

Why: this is the part of a kubelet the operator depends on. A pod gets an IP in 127.0.0.0/8, its
volumes as directories, and each container's command runs (in private mount/UTS namespaces, see
podinit.py) with the env the API asks for. Restarts follow restartPolicy with the kubelet's back-off,
readiness comes from the real probe against the real process, and deleting the pod sends SIGTERM,
then SIGKILL after the grace period, before the pod object is finally removed.
"""

# Files here are a few bytes on local disk (volumes, logs, spec files): blocking on them for
# microseconds is cheaper and clearer than a thread hop, so the async-file rules are off.

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from .containers import KUBELET_CONDITIONS, ContainerRunner, now
from .kubeapi import ApiError
from .nodecontext import NodeContext
from .volumes import materialise

log = logging.getLogger("pods")
Obj = dict[str, Any]


class PodWorker:
    """Everything the node does for one pod (keyed by UID: a recreated StatefulSet pod is a new one)."""

    def __init__(self, agent: NodeContext, pod: Obj) -> None:
        self.agent = agent
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.name: str = pod["metadata"]["name"]
        self.namespace: str = pod["metadata"]["namespace"]
        self.dir = agent.layout.pods / self.uid
        (self.dir / "pids").mkdir(parents=True, exist_ok=True)
        self.ip: str | None = None
        self.start_time: str | None = None
        self.initialized = False
        self.terminating = False
        self.api_gone = False
        self._term_event = asyncio.Event()
        self._status_event = asyncio.Event()
        self._events_sent: set[str] = set()
        self.init_runners = [ContainerRunner(self, c, True) for c in pod["spec"].get("initContainers", [])]
        self.runners = [ContainerRunner(self, c, False) for c in pod["spec"]["containers"]]
        prior = {c["name"]: c for c in pod.get("status", {}).get("containerStatuses", [])}
        for r in self.runners:  # a node-agent restart continues the restart count
            if r.name in prior and prior[r.name].get("restartCount") is not None:
                r.st.restart_count = prior[r.name]["restartCount"] + 1
        self._last_status: Obj | None = None
        self._status_task = asyncio.create_task(self._status_loop())
        self.task = asyncio.create_task(self._main())

    # -- inputs from the node agent -------------------------------------------------------------
    def update(self, pod: Obj) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self._request_termination()

    def gone(self) -> None:
        """The pod object vanished (force deletion): stop the processes quickly."""
        self.api_gone = True
        self._request_termination()

    def _request_termination(self) -> None:
        if not self.terminating:
            self.terminating = True
            self._term_event.set()

    def grace_period(self) -> float:
        if self.api_gone:
            return 2.0
        meta_grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if meta_grace is not None:
            return float(meta_grace)
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    async def wait_terminating(self, seconds: float) -> None:
        """Wait `seconds` unless the pod starts terminating first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._term_event.wait(), seconds)

    def status_changed(self) -> None:
        self._status_event.set()

    # -- lifecycle ----------------------------------------------------------------------------
    async def _main(self) -> None:
        try:
            phase = self.pod.get("status", {}).get("phase")
            if phase in ("Succeeded", "Failed") and not self.terminating:
                await self._term_event.wait()  # a finished pod: nothing runs until it is deleted
            if not self.terminating:
                self.ip = self.agent.ips.allocate(self.uid)
                self.start_time = now()
                self.pod.setdefault("status", {})["podIP"] = self.ip  # for $(POD_IP) via fieldRef
                self.pod["status"]["podIPs"] = [{"ip": self.ip}]
                self.pod["status"]["hostIP"] = "127.0.0.1"
                self.status_changed()
                await self._run_containers()
            if not self.terminating:
                await self._term_event.wait()  # finished (a Job's pod, a failed init): wait for deletion
            await self._terminate()
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)
            await self._terminate()
            raise
        finally:
            self.agent.ips.release(self.uid)
            self.agent.forget(self)

    async def _run_containers(self) -> None:
        term = asyncio.create_task(self._term_event.wait())
        try:
            for r in self.init_runners:
                run = asyncio.create_task(r.run())
                await asyncio.wait([run, term], return_when=asyncio.FIRST_COMPLETED)
                if self.terminating:
                    await r.kill(self.grace_period())
                    await run
                    return
                if run.result() != 0:
                    return  # restartPolicy Never: the pod failed; nothing more starts
            self.initialized = True
            self.status_changed()
            runs = [asyncio.create_task(r.run()) for r in self.runners]
            await asyncio.wait([*runs, term], return_when=asyncio.FIRST_COMPLETED)
            if not self.terminating:
                await asyncio.wait([*runs, term], return_when=asyncio.ALL_COMPLETED)  # until deleted
            grace = self.grace_period()
            await self.agent.event_for(
                self, "Normal", "Killing", f"Stopping containers (grace {grace:.0f} s)"
            )
            await asyncio.gather(*(r.kill(grace) for r in self.runners))
            await asyncio.gather(*runs)
        finally:
            term.cancel()

    async def _terminate(self) -> None:
        """Report the final status, then remove the pod object (the kubelet's final, grace-0 delete)."""
        self._status_event.set()
        await self._flush_status()
        self._status_task.cancel()
        if not self.api_gone and self.pod["metadata"].get("deletionTimestamp"):
            await self.agent.client.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )

    async def stop_for_shutdown(self, grace: float) -> None:
        """The node agent is stopping: kill the processes, leave the API objects alone."""
        self.api_gone = True
        self._request_termination()
        for r in [*self.init_runners, *self.runners]:
            await r.kill(min(grace, self.grace_period()))

    def etc_hosts(self) -> Obj:
        hosts = self.dir / "etc-hosts"
        lines = ["# Kubernetes-managed hosts file (local node agent).", "127.0.0.1\tlocalhost"]
        if self.ip:
            lines.append(f"{self.ip}\t{self.name[:63]}")
        for alias in self.pod["spec"].get("hostAliases", []):
            lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames', []))}")
        hosts.write_text("\n".join(lines) + "\n")
        return {"source": str(hosts), "target": "/etc/hosts", "readOnly": False}

    async def volume_paths(self) -> dict[str, Path]:
        paths = {}
        for v in self.pod["spec"].get("volumes", []):
            paths[v["name"]] = await materialise(
                self.agent.client, self.pod, v, self.dir, self.agent.allocatable
            )
        return paths

    async def event(
        self, type_: str, reason: str, message: str, container: str | None = None, once: bool = False
    ) -> None:
        key = f"{reason}:{message}"
        if once and key in self._events_sent:
            return
        self._events_sent.add(key)
        await self.agent.event_for(self, type_, reason, message, container)

    # -- status -------------------------------------------------------------------------------
    async def _status_loop(self) -> None:
        while True:
            await self._status_event.wait()
            await self._flush_status()

    async def _flush_status(self) -> None:
        self._status_event.clear()
        if self.api_gone:
            return
        status = self._compute_status()
        if status == self._last_status:
            return
        try:
            await self.agent.client.merge_patch(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status", {"status": status}
            )
            self._last_status = status
        except ApiError as e:
            if e.status == 404:
                self.gone()
            else:
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, e)
                self._status_event.set()
                await asyncio.sleep(0.5)  # retry pacing against a failing API server

    def _compute_status(self) -> Obj:
        main = [r.status() for r in self.runners]
        init = [r.status() for r in self.init_runners]
        policy = self.pod["spec"].get("restartPolicy", "Always")
        all_ready = all(c["ready"] for c in main)
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates", [])]
        old = {c["type"]: c for c in self.pod.get("status", {}).get("conditions", [])}
        gates_ok = all(old.get(g, {}).get("status") == "True" for g in gates)

        def terminated(c: Obj) -> Obj | None:
            t: Obj | None = c["state"].get("terminated")
            return t

        init_failed = any(
            terminated(c) and terminated(c)["exitCode"] != 0 and policy == "Never"  # type: ignore[index]
            for c in init
        )
        done = [terminated(c) for c in main]
        if init_failed:
            phase = "Failed"
        elif self.initialized and all(done) and (policy != "Always" or self.terminating):
            phase = "Succeeded" if all(t["exitCode"] == 0 for t in done if t) else "Failed"
        elif self.initialized and any("running" in c["state"] or c["restartCount"] > 0 for c in main):
            phase = "Running"
        else:
            phase = "Pending"

        def cond(type_: str, ok: bool) -> Obj:
            status = "True" if ok else "False"
            prev = old.get(type_)
            since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now()
            return {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": since}

        running = phase == "Running"
        conditions = [c for t, c in old.items() if t not in KUBELET_CONDITIONS]
        conditions += [
            cond("PodReadyToStartContainers", self.ip is not None and not self.terminating),
            cond("Initialized", self.initialized),
            cond("ContainersReady", self.initialized and all_ready and running),
            cond("Ready", self.initialized and all_ready and gates_ok and running),
        ]
        status: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "containerStatuses": main,
            "observedGeneration": self.pod["metadata"].get("generation", 1),
        }
        if init:
            status["initContainerStatuses"] = init
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        if self.start_time:
            status["startTime"] = self.start_time
        return status
