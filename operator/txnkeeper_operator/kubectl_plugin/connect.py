"""The API client and the namespace, chosen as kubectl chooses them.

Order: --kubeconfig, else $KUBECONFIG (colon-separated files are merged), else ~/.kube/config if it
exists, else the in-cluster service account. The namespace is -n, else the kubeconfig context's, else
the pod's own (in-cluster), else ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from txnkeeper_operator.kubectl_plugin.failures import PluginError

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Seconds per API request: an unreachable server is reported rather than waited on for minutes.
REQUEST_TIMEOUT = 20


@dataclass(frozen=True, slots=True)
class Cluster:
    api: Any  # kubernetes.client.ApiClient (unannotated)
    namespace: str
    server: str

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        return client.BatchV1Api(self.api)


def _kubeconfig_path(explicit: str | None) -> str | None:
    if explicit:
        if not all(Path(p).expanduser().is_file() for p in explicit.split(os.pathsep) if p):
            raise PluginError(f"--kubeconfig {explicit}: no such file")
        return explicit
    env = os.environ.get("KUBECONFIG")
    if env:
        return env
    default = Path("~/.kube/config").expanduser()
    return str(default) if default.is_file() else None


def _context_namespace(path: str, context: str | None) -> str | None:
    list_contexts = cast(
        "Callable[..., tuple[list[dict[str, Any]], dict[str, Any]]]", config.list_kube_config_contexts
    )
    contexts, active = list_contexts(config_file=path)
    chosen = active if context is None else next((c for c in contexts if c["name"] == context), None)
    if chosen is None:
        return None
    ns = (chosen.get("context") or {}).get("namespace")
    return str(ns) if ns else None


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    path = _kubeconfig_path(kubeconfig)
    configuration = client.Configuration()
    try:
        if path is not None:
            load = cast("Callable[..., None]", config.load_kube_config)
            load(config_file=path, context=context, client_configuration=configuration)
            namespace = namespace or _context_namespace(path, context)
        elif context:
            raise PluginError(f"--context {context}: no kubeconfig (set --kubeconfig or $KUBECONFIG)")
        else:
            load_incluster = cast("Callable[..., None]", config.load_incluster_config)
            load_incluster(client_configuration=configuration)
            if namespace is None and IN_CLUSTER_NAMESPACE.is_file():
                namespace = IN_CLUSTER_NAMESPACE.read_text().strip() or None
    except ConfigException as err:
        where = path or "the in-cluster service account"
        raise PluginError(
            f"cannot configure the Kubernetes client from {where}: {err}"
            + ("" if path else " (no kubeconfig found: set --kubeconfig or $KUBECONFIG)")
        ) from err
    # One retry at most: "cannot reach" should come in seconds, not after urllib3's backoff.
    configuration.retries = 1
    return Cluster(client.ApiClient(configuration), namespace or "default", str(configuration.host))
