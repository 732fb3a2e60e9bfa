"""The verifier's Kubernetes I/O: find the resources' pods, read markers, publish the report.

Uses the official client (in-cluster service account, or a kubeconfig) and only the core API: pods are
listed by label selector and reached at `http://{status.podIP}:{adminPort}` (contracts §6), or with
TLS (TXNKEEPER_TLS_CA_FILE set: the job mounts its resource's Secret) at
`https://{pod}.{headless service}.{namespace}.svc:{adminPort}`, the name the pods' certificate is for
(urllib checks the URL's host; a pod IP is in no certificate); the report goes to the ConfigMap
`{cr-name}-verifier-report`, key `report.json` (contracts §7).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from txnkeeper.contract.tls import CA_FILE_ENV
from txnkeeper.verifier.model import PodEndpoint, VerifierInfraError, VerifierInputError

REPORT_KEY = "report.json"
MARKERS_KEY = "markers.json"
DEFAULT_ADMIN_PORT = 8080
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current_namespace() -> str:
    """The pod's own namespace in-cluster, else `default`."""
    try:
        return _NAMESPACE_FILE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def core_api(kubeconfig: str | None = None) -> Any:
    """A CoreV1Api: from `kubeconfig` if given, else in-cluster, else the default kubeconfig."""
    try:
        from kubernetes import client
        from kubernetes import config as kube_config
    except ImportError as exc:
        raise VerifierInfraError("the kubernetes client is not installed (pip install kubernetes)") from exc
    # The client's loaders are untyped; treat the module as dynamic rather than sprinkle ignores.
    config: Any = kube_config
    try:
        if kubeconfig is not None:
            api_client = config.new_client_from_config(config_file=kubeconfig)
            return client.CoreV1Api(api_client)
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return client.CoreV1Api()
    except Exception as exc:
        raise VerifierInfraError(f"cannot configure the Kubernetes client: {exc}") from exc


class LazyKube:
    """The Kubernetes client of a verifier run, created only when a flag needs it (local runs never
    touch it): both Spark jobs (verify-invalidation, verify-offload) take ``--kubeconfig`` and
    ``--namespace`` and reach the API only for discovery or a ConfigMap."""

    def __init__(self, kubeconfig: str | None, namespace: str | None) -> None:
        self._kubeconfig = kubeconfig
        self.namespace: str = namespace or current_namespace()
        self._api: Any = None

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = core_api(self._kubeconfig)
        return self._api


def _api_error(action: str, exc: Exception) -> VerifierInfraError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    detail = f"HTTP {status} {reason}" if status is not None else f"{type(exc).__name__}: {exc}"
    return VerifierInfraError(f"{action}: {detail}")


def discover_pods(
    api: Any,
    namespace: str,
    selectors: list[str],
    admin_port: int = DEFAULT_ADMIN_PORT,
    *,
    tls: bool | None = None,
) -> list[PodEndpoint]:
    """Every pod matching any selector. Pods without an IP are kept (as unreachable), never skipped:
    a pod the verifier did not check must make the verdict "not safe", not vanish from it. ``tls``
    (default: TXNKEEPER_TLS_CA_FILE is set): https:// by the pod's DNS name in its headless Service."""
    endpoints: dict[str, PodEndpoint] = {}
    if tls is None:
        tls = bool(os.environ.get(CA_FILE_ENV))
    for selector in selectors:
        try:
            pods = api.list_namespaced_pod(namespace, label_selector=selector)
        except Exception as exc:
            raise _api_error(f"cannot list pods in {namespace} with selector {selector!r}", exc) from exc
        if not pods.items:
            raise VerifierInputError(f"selector {selector!r} matched no pods in namespace {namespace}")
        for pod in pods.items:
            name = pod.metadata.name
            ip = pod.status.pod_ip if pod.status is not None else None
            phase = pod.status.phase if pod.status is not None else None
            dns = _dns_name(pod, namespace)
            if ip and tls and dns is None:
                endpoints[name] = PodEndpoint(
                    pod=name,
                    url=None,
                    note="no headless Service (spec.subdomain): its TLS certificate names no address to use",
                )
            elif ip and tls:
                endpoints[name] = PodEndpoint(pod=name, url=f"https://{dns}:{admin_port}")
            elif ip:
                endpoints[name] = PodEndpoint(pod=name, url=f"http://{_host(ip)}:{admin_port}")
            else:
                endpoints[name] = PodEndpoint(
                    pod=name, url=None, note=f"phase {phase or 'unknown'}, no pod IP"
                )
    return [endpoints[name] for name in sorted(endpoints)]


def _dns_name(pod: Any, namespace: str) -> str | None:
    """``{hostname}.{subdomain}.{namespace}.svc``: a StatefulSet pod's name in its headless Service (a
    pod's hostname defaults to its name)."""
    spec = pod.spec
    hostname = (getattr(spec, "hostname", None) if spec is not None else None) or pod.metadata.name
    subdomain = getattr(spec, "subdomain", None) if spec is not None else None
    return f"{hostname}.{subdomain}.{namespace}.svc" if hostname and subdomain else None


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def read_configmap_key(api: Any, namespace: str, name: str, key: str) -> str:
    try:
        configmap = api.read_namespaced_config_map(name, namespace)
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            raise VerifierInputError(f"ConfigMap {namespace}/{name} does not exist") from exc
        raise _api_error(f"cannot read ConfigMap {namespace}/{name}", exc) from exc
    data = configmap.data or {}
    if key not in data:
        raise VerifierInputError(f"ConfigMap {namespace}/{name} has no key {key!r}")
    return str(data[key])


def write_configmap_key(
    api: Any, namespace: str, name: str, key: str, value: str, *, labels: dict[str, str] | None = None
) -> None:
    """Create the ConfigMap, or patch only this key (keeping labels and owner references the operator
    may have set on a pre-created one)."""
    try:
        from kubernetes import client
    except ImportError as exc:
        raise VerifierInfraError("the kubernetes client is not installed") from exc
    try:
        api.patch_namespaced_config_map(name, namespace, {"data": {key: value}})
        return
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            raise _api_error(f"cannot update ConfigMap {namespace}/{name}", exc) from exc
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels or {}),
        data={key: value},
    )
    try:
        api.create_namespaced_config_map(namespace, body)
        return
    except Exception as exc:
        if getattr(exc, "status", None) != 409:
            raise _api_error(f"cannot create ConfigMap {namespace}/{name}", exc) from exc
    # Created by someone else (the operator) between our patch and create: patch it after all.
    try:
        api.patch_namespaced_config_map(name, namespace, {"data": {key: value}})
    except Exception as exc:
        raise _api_error(f"cannot update ConfigMap {namespace}/{name}", exc) from exc
