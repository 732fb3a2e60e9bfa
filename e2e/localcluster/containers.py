"""One container of a pod on the local node: started as a local process, probed, restarted with back-off.

Why a module of its own: the container lifecycle (start, probes, restartPolicy, back-off, kill) is the
biggest part of a kubelet and needs of its pod only the narrow ``PodSandbox`` surface, not the worker.
"""

# Files here are a few bytes on local disk (pid files, spec files): blocking on them for microseconds
# is cheaper and clearer than a thread hop, so the async-file rules are off.
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
from typing import Any

import aiohttp

from .kubeapi import ApiError
from .nodecontext import PodSandbox
from .podspec import ConfigError, container_env, expand, resolve_command
from .procs import write_pidfile
from .volumes import VolumeNotReady, configmap_strings, mounts_for, secret_strings

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

    def __init__(self, worker: PodSandbox, spec: Obj, init: bool) -> None:
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
            if not await self._until_threshold(startup):
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

    async def _until_threshold(self, probe: Obj) -> bool:
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
