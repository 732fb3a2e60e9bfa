"""The `helm test` selfcheck finds the operator pod through the API and probes its liveness endpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from txnkeeper_operator.selfcheck import check_crds, check_operator


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def healthz() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _pod(name: str, phase: str, ip: str | None) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name), status=SimpleNamespace(phase=phase, pod_ip=ip)
    )


class _Core:
    def __init__(self, pods: list[Any]) -> None:
        self.pods = pods
        self.asked: list[tuple[str, str]] = []

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.asked.append((namespace, label_selector))
        return SimpleNamespace(items=self.pods)


def test_running_operator_answering_liveness_passes(healthz: int) -> None:
    core = _Core([_pod("op-1", "Running", "127.0.0.1"), _pod("op-0", "Pending", None)])
    assert check_operator(core, "tk", "app=op", 5, port=healthz) == []
    assert core.asked == [("tk", "app=op")]


def test_missing_or_silent_operator_fails(healthz: int) -> None:
    assert "no running operator pod" in check_operator(_Core([]), "tk", "app=op", 5, port=healthz)[0]
    silent = check_operator(_Core([_pod("op", "Running", "127.0.0.1")]), "tk", "app=op", 2, port=1)
    assert silent and "liveness" in silent[0]


def test_unserved_crd_fails() -> None:
    class Boom(Exception):
        pass

    class Custom:
        def list_namespaced_custom_object(self, *args: Any) -> Any:
            if args[-1] == "pendingackstores":
                raise Boom("HTTP 404")
            return {"items": []}

    failures = check_crds(Custom(), Boom, "tk")
    assert len(failures) == 1 and "pendingackstores.txnkeeper.io" in failures[0]
