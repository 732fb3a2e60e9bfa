"""API failures as sentences: what was asked, what went wrong, what to do. Never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

T = TypeVar("T")

EXIT_FAILED = 1  # the request was understood and failed (not found, forbidden, unreachable)
EXIT_USAGE = 2


class PluginError(Exception):
    """Reported as ``error: <message>`` on stderr with ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the HTTP status of the API error behind it, if one


def _server_message(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError):
        return str(err.reason or "")
    return str(body.get("message") or err.reason or "") if isinstance(body, dict) else str(err.reason)


def explain(err: ApiException, *, verb: str, resource: str, namespace: str | None, name: str = "") -> str:
    """One sentence for an API error of ``verb`` on ``resource`` (plural.group, as RBAC names it)."""
    where = f" in namespace {namespace!r}" if namespace else ""
    said = _server_message(err)
    if err.status == 403:
        return (
            f"forbidden: you may not {verb} {resource}{where} (ask for a Role granting verb {verb!r}"
            f" on {resource!r}; the API server said: {said})"
        )
    if err.status == 401:
        return f"unauthorized: the API server refused these credentials ({said}); check the kubeconfig"
    if err.status == 404:
        thing = f"{resource} {name!r}" if name else resource
        return f"{thing} not found{where}"
    return f"{verb} {resource}{(' ' + repr(name)) if name else ''}{where} failed: {err.status} {said}"


def call(
    fn: Callable[..., T],
    *args: Any,
    verb: str,
    resource: str,
    namespace: str | None,
    server: str,
    name: str = "",
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)`` with every API or connection failure turned into a PluginError."""
    try:
        return fn(*args, **kwargs)
    except ApiException as err:
        if err.status == 0 or err.status is None:  # raised by the client without an HTTP answer
            raise PluginError(f"cannot reach the Kubernetes API at {server}: {err.reason}") from err
        message = explain(err, verb=verb, resource=resource, namespace=namespace, name=name)
        raise PluginError(message, status=int(err.status)) from err
    except (HTTPError, OSError) as err:
        raise PluginError(f"cannot reach the Kubernetes API at {server}: {err}") from err
