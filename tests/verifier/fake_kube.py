"""A fake Kubernetes API server (core/v1 pods and ConfigMaps only) over real HTTP.

No API server runs on this machine for unit tests, so the verifier's Kubernetes I/O talks to this
instead: the real `kubernetes` client, a real kubeconfig and real HTTP requests, with the few API
semantics the verifier relies on (label-selector listing, 404/409, merge patch of `data`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "code": code,
        "message": message,
    }
    return web.json_response(body, status=code)


class FakeKubeApi:
    def __init__(self) -> None:
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-kube", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self._get_cm)
        app.router.add_patch("/api/v1/namespaces/{ns}/configmaps/{name}", self._patch_cm)
        app.router.add_post("/api/v1/namespaces/{ns}/configmaps", self._create_cm)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, directory: Path, namespace: str) -> Path:
        path = directory / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "verifier", "user": {"token": "test-token"}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "verifier", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    def add_pod(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str],
        ip: str | None,
        phase: str,
        *,
        subdomain: str | None = None,
    ) -> None:
        """``subdomain``: a StatefulSet's pod (spec.hostname = its name, spec.subdomain = the headless
        Service)."""
        status: dict[str, Any] = {"phase": phase}
        if ip is not None:
            status["podIP"] = ip
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "status": status,
        }
        if subdomain is not None:
            pod["spec"] = {"hostname": name, "subdomain": subdomain, "containers": [{"name": "txnkeeper"}]}
        self.pods.setdefault(namespace, []).append(pod)

    async def _list_pods(self, request: web.Request) -> web.Response:
        self.requests.append(("list-pods", request.query.get("labelSelector", "")))
        wanted = dict(
            term.split("=", 1) for term in request.query.get("labelSelector", "").split(",") if term
        )
        items = [
            pod
            for pod in self.pods.get(request.match_info["ns"], [])
            if all(pod["metadata"]["labels"].get(key) == value for key, value in wanted.items())
        ]
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    async def _get_cm(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        self.requests.append(("get-configmap", key[1]))
        if key not in self.configmaps:
            return _status(404, "NotFound", f'configmaps "{key[1]}" not found')
        return web.json_response(self.configmaps[key])

    async def _patch_cm(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        self.requests.append(("patch-configmap", request.content_type))
        if key not in self.configmaps:
            return _status(404, "NotFound", f'configmaps "{key[1]}" not found')
        patch = await request.json()
        self.configmaps[key].setdefault("data", {}).update(patch.get("data", {}))
        return web.json_response(self.configmaps[key])

    async def _create_cm(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = (request.match_info["ns"], body["metadata"]["name"])
        self.requests.append(("create-configmap", key[1]))
        if key in self.configmaps:
            return _status(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "ConfigMap")
        self.configmaps[key] = body
        return web.json_response(body, status=201)
