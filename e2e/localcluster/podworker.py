"""One pod on the local node: its containers as local processes, their probes, and the pod's status.

Why: this is the part of a kubelet the operator depends on. A pod gets an IP in 127.0.0.0/8, its
volumes as directories, and each container's command runs (in private mount/UTS namespaces, see
podinit.py) with the env the API asks for. Restarts follow restartPolicy with the kubelet's back-off,
readiness comes from the real probe against the real process, and deleting the pod sends SIGTERM,
then SIGKILL after the grace period, before the pod object is finally removed.
"""

# Files here are a few bytes on local disk (volumes, logs, spec files): blocking on them for
# microseconds is cheaper and clearer than a thread hop, so the async-file rules are off.
# ruff: noqa: ASYNC230

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from .kubeapi import ApiError
from .podspec import ConfigError, container_env, expand, resolve_command
from .procs import write_pidfile
from .volumes import VolumeNotReady, configmap_strings, materialise, mounts_for, secret_strings

if TYPE_CHECKING:
    from .nodeagent import NodeAgent

log = logging.getLogger("pods")
Obj = dict[str, Any]
PODINIT = Path(__file__).with_name("podinit.py")
KUBELET_CONDITIONS = {"PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"}
MAX_BACKOFF = 300.0


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class ContainerState:
    """What containerStatuses[] reports for one container."""

    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    pid: int | None = None


class ContainerRunner:
    """Runs one container: start, supervise with probes, restart per restartPolicy with back-off."""

    def __init__(self, worker: PodWorker, spec: Obj, init: bool) -> None:
        self.worker = worker
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.st = ContainerState()
        self.proc: asyncio.subprocess.Process | None = None
        self.exit_code: int | None = None
        self.failures = 0  # consecutive failed runs: drives the back-off

    def status(self) -> Obj:
        return {
            "name": self.name,
            "state": self.st.state,
            "lastState": self.st.last_state,
            "ready": self.st.ready,
            "started": self.st.started,
            "restartCount": self.st.restart_count,
            "image": self.spec.get("image", ""),
            "imageID": "",
            **({"containerID": f"local://{self.st.pid}"} if self.st.pid else {}),
        }

    def _set(self, **changes: Any) -> None:
        for k, v in changes.items():
            setattr(self.st, k, v)
        self.worker.status_changed()

    async def run(self) -> int:
        """Until the container is done for good (or the pod terminates); returns the last exit code."""
        policy = self.worker.pod["spec"].get("restartPolicy", "Always")
        while not self.worker.terminating:
            try:
                await self._start()
            except ConfigError as e:
                self._set(state={"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}})
                await self.worker.event("Warning", "Failed", f"Error: {e}", self.name)
                await self.worker.wait_terminating(5.0)
                continue
            except (VolumeNotReady, ApiError, aiohttp.ClientError) as e:
                # Not ready yet, or not allowed yet: the Node authorizer learns a new pod's references
                # (ConfigMaps, Secrets, claims) from its own watch, a moment after the pod is bound.
                self._set(state={"waiting": {"reason": "ContainerCreating", "message": str(e)}})
                await self.worker.event("Warning", "FailedMount", str(e), self.name, once=True)
                await self.worker.wait_terminating(1.0)
                continue
            except (FileNotFoundError, PermissionError, OSError) as e:
                self.exit_code = 128
                self._set(
                    state={
                        "terminated": {
                            "exitCode": 128,
                            "reason": "StartError",
                            "message": str(e),
                            "startedAt": now(),
                            "finishedAt": now(),
                        }
                    },
                    ready=False,
                    started=False,
                )
                await self.worker.event("Warning", "Failed", f"Error: {e}", self.name)
            else:
                await self._supervise()
            code = self.exit_code if self.exit_code is not None else 128
            if self.worker.terminating:
                break
            if self.init and code == 0:
                break
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                break
            # Restart: the kubelet's back-off (first restart at once, then 10 s doubling up to 5 min).
            self.failures += 1
            delay = 0.0 if self.failures <= 1 else min(10.0 * 2 ** (self.failures - 2), MAX_BACKOFF)
            self._set(last_state=self.st.state)
            if delay > 0:
                message = (
                    f"back-off {delay:.0f}s restarting failed container={self.name} pod={self.worker.name}"
                )
                self._set(state={"waiting": {"reason": "CrashLoopBackOff", "message": message}})
                await self.worker.event(
                    "Warning", "BackOff", f"Back-off restarting failed container {self.name}"
                )
                await self.worker.wait_terminating(delay)
            if self.worker.terminating:
                break
            self._set(restart_count=self.st.restart_count + 1)
        return self.exit_code if self.exit_code is not None else 0

    async def _start(self) -> None:
        w = self.worker
        env = await container_env(
            w.pod,
            self.spec,
            base=w.agent.base_env(w.pod),
            configmap=lambda ns, name: configmap_strings(w.agent.client, ns, name),
            secret=lambda ns, name: secret_strings(w.agent.client, ns, name),
            node_allocatable=w.agent.allocatable,
        )
        command = self.spec.get("command") or []
        if not command:
            raise ConfigError(
                f"container {self.name!r} has no command: the local node ignores images, so every "
                "container must name its command (the image's ENTRYPOINT is not known here)"
            )
        argv = [expand(a, env) for a in [*command, *self.spec.get("args", [])]]
        argv[0] = resolve_command(argv[0], env)
        volume_paths = await w.volume_paths()
        spec = {
            # The kubelet-managed /etc/hosts first: the pod's hostname resolves to its pod IP (Spark's
            # driver, for one, looks its own hostname up).
            "mounts": [w.etc_hosts(), *mounts_for(self.spec, volume_paths, env)],
            "hostname": w.name[:63],
            "cwd": self.spec.get("workingDir") or str(w.dir / "cwd"),
            "argv": argv,
            "env": env,
        }
        spec_file = w.dir / f"{self.name}.spec.json"
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        log_dir = w.dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{self.name}-{self.st.restart_count}.log", "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                sys.executable,
                "-I",
                str(PODINIT),
                str(spec_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach its children too
            )
        write_pidfile(w.dir / "pids" / f"{self.name}.pid", self.proc.pid)
        self.exit_code = None
        self._set(
            state={"running": {"startedAt": now()}},
            pid=self.proc.pid,
            ready=False,
            started="startupProbe" not in self.spec,
        )
        await w.event("Normal", "Started", f"Started container {self.name} (pid {self.proc.pid})", self.name)

    async def _supervise(self) -> None:
        assert self.proc is not None
        probes = [] if self.init else [asyncio.create_task(self._probe_loop())]
        started_at = time.monotonic()
        code = await self.proc.wait()
        for p in probes:
            p.cancel()
        (self.worker.dir / "pids" / f"{self.name}.pid").unlink(missing_ok=True)
        if code < 0:  # killed by a signal: the runtime reports 128 + signal number
            code = 128 - code
        self.exit_code = code
        if time.monotonic() - started_at > 600:
            self.failures = 0  # ran long enough: the back-off resets, as in the kubelet
        reason = "Completed" if code == 0 else "Error"
        self._set(
            state={
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": self.st.state.get("running", {}).get("startedAt", now()),
                    "finishedAt": now(),
                    "containerID": f"local://{self.st.pid}",
                }
            },
            ready=False,
        )

    async def _probe_loop(self) -> None:
        """Startup, then readiness and liveness probes, with the API's timing and thresholds."""
        startup = self.spec.get("startupProbe")
        readiness = self.spec.get("readinessProbe")
        liveness = self.spec.get("livenessProbe")
        if startup:
            if not await self._until_threshold(startup, want_success=True):
                await self.worker.event("Warning", "Unhealthy", "Startup probe failed", self.name)
                await self.kill(self.worker.grace_period())
                return
            self._set(started=True)
        tasks = []
        if readiness:
            tasks.append(asyncio.create_task(self._readiness(readiness)))
        else:
            self._set(ready=True)
        if liveness:
            tasks.append(asyncio.create_task(self._liveness(liveness)))
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()

    async def _until_threshold(self, probe: Obj, want_success: bool) -> bool:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        fails = 0
        while True:
            if await self._probe_once(probe):
                return True
            fails += 1
            if fails >= probe.get("failureThreshold", 3):
                return False
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _readiness(self, probe: Obj) -> None:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        successes = fails = 0
        while True:
            ok = await self._probe_once(probe)
            successes, fails = (successes + 1, 0) if ok else (0, fails + 1)
            if ok and successes >= probe.get("successThreshold", 1) and not self.st.ready:
                self._set(ready=True)
            elif not ok and fails >= probe.get("failureThreshold", 3) and self.st.ready:
                self._set(ready=False)
                await self.worker.event("Warning", "Unhealthy", "Readiness probe failed", self.name)
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _liveness(self, probe: Obj) -> None:
        if not await self._until_threshold_forever(probe):
            await self.worker.event("Warning", "Unhealthy", "Liveness probe failed; restarting", self.name)
            await self.kill(self.worker.grace_period())

    async def _until_threshold_forever(self, probe: Obj) -> bool:
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        fails = 0
        while fails < probe.get("failureThreshold", 3):
            fails = 0 if await self._probe_once(probe) else fails + 1
            if fails < probe.get("failureThreshold", 3):
                await asyncio.sleep(probe.get("periodSeconds", 10))
        return False

    async def _probe_once(self, probe: Obj) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        ip = self.worker.ip or "127.0.0.1"
        try:
            if "httpGet" in probe:
                hg = probe["httpGet"]
                port = self._port(hg["port"])
                scheme = hg.get("scheme", "HTTP").lower()
                url = f"{scheme}://{hg.get('host') or ip}:{port}{hg.get('path', '/')}"
                headers = {h["name"]: h["value"] for h in hg.get("httpHeaders", [])}
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(url, headers=headers, ssl=False, timeout=aiohttp.ClientTimeout(total=timeout)) as r,
                ):
                    return 200 <= r.status < 400
            if "tcpSocket" in probe:
                ts = probe["tcpSocket"]
                _r, writer = await asyncio.wait_for(
                    asyncio.open_connection(ts.get("host") or ip, self._port(ts["port"])), timeout
                )
                writer.close()
                return True
            if "exec" in probe:
                proc = await asyncio.create_subprocess_exec(
                    *probe["exec"]["command"],
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    proc.kill()
                    return False
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        await self.worker.event(
            "Warning", "Unhealthy", f"unsupported probe {sorted(probe)}", self.name, once=True
        )
        return False

    def _port(self, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in self.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"no container port named {port!r}")

    async def kill(self, grace: float) -> None:
        """SIGTERM the container's process group; SIGKILL once `grace` seconds have passed."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


class PodWorker:
    """Everything the node does for one pod (keyed by UID: a recreated StatefulSet pod is a new one)."""

    def __init__(self, agent: NodeAgent, pod: Obj) -> None:
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
