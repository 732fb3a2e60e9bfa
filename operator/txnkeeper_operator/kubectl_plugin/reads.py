"""What the plugin reads from the API server: the resources, their Events and their CronJobs."""

from __future__ import annotations

from typing import Any

from txnkeeper_operator import naming
from txnkeeper_operator.kubectl_plugin.connect import REQUEST_TIMEOUT, Cluster
from txnkeeper_operator.kubectl_plugin.failures import PluginError, call
from txnkeeper_operator.kubectl_plugin.refs import Ref

Obj = dict[str, Any]


def rbac_name(kind: naming.Kind) -> str:
    return f"{kind.plural}.{naming.GROUP}"


def _sanitize(cluster: Cluster, obj: Any) -> Obj:
    out: Obj = cluster.api.sanitize_for_serialization(obj)
    return out


def get_resource(cluster: Cluster, kind: naming.Kind, name: str) -> Obj:
    try:
        obj: Obj = call(
            cluster.custom.get_namespaced_custom_object,
            naming.GROUP, naming.API_VERSION, cluster.namespace, kind.plural, name,
            verb="get", resource=rbac_name(kind), namespace=cluster.namespace, server=cluster.server,
            name=name, _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
    except PluginError as err:
        if err.status == 404:
            _list_kind(cluster, kind)  # says so if the CRD itself is missing
        raise
    return obj


def _list_kind(cluster: Cluster, kind: naming.Kind) -> list[Obj]:
    try:
        listed: Obj = call(
            cluster.custom.list_namespaced_custom_object,
            naming.GROUP, naming.API_VERSION, cluster.namespace, kind.plural,
            verb="list", resource=rbac_name(kind), namespace=cluster.namespace, server=cluster.server,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
    except PluginError as err:
        if err.status == 404:
            raise PluginError(
                f"the API server at {cluster.server} does not serve {rbac_name(kind)}: the txnkeeper CRDs"
                " are not installed (helm install txnkeeper helm/txnkeeper, or kubectl apply -f crds/)"
            ) from err
        raise
    items: list[Obj] = listed.get("items") or []
    return sorted(items, key=lambda o: str(o["metadata"]["name"]))


def resources(cluster: Cluster, refs: list[Ref]) -> list[Obj]:
    """The resources ``refs`` name, in order; a named one that does not exist is an error."""
    out: list[Obj] = []
    for ref in refs:
        if ref.name is None:
            out.extend(_list_kind(cluster, ref.kind))
        else:
            out.append(get_resource(cluster, ref.kind, ref.name))
    return out


def events_of(cluster: Cluster, obj: Obj) -> list[Obj]:
    """Every core/v1 Event whose involvedObject is this resource (this incarnation: by uid)."""
    uid = obj["metadata"].get("uid", "")
    listed = call(
        cluster.core.list_namespaced_event,
        cluster.namespace,
        field_selector=f"involvedObject.uid={uid}",
        verb="list", resource="events", namespace=cluster.namespace, server=cluster.server,
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    return [_sanitize(cluster, e) for e in listed.items or []]


def cron_job(cluster: Cluster, name: str) -> Obj | None:
    """The CronJob, or None if it does not exist."""
    try:
        found = call(
            cluster.batch.read_namespaced_cron_job,
            name, cluster.namespace,
            verb="get", resource="cronjobs.batch", namespace=cluster.namespace, server=cluster.server,
            name=name, _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
    except PluginError as err:
        if err.status == 404:
            return None
        raise
    return _sanitize(cluster, found)
