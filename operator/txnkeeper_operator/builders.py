"""Kubernetes manifests the operator owns, built as plain dicts by pure functions.

Pure so they can be validated offline (kubernetes-validate, tests) and applied with server-side apply.
The StatefulSet uses updateStrategy OnDelete: a template change restarts nothing by itself; the rollout
engine decides which pod restarts when. The template also carries the start-up batch settings as an
annotation, so what a recreated pod would start with is read back from one object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txnkeeper.contract.placement import SHARDS_PER_REPLICA, Member, Placement
from txnkeeper_operator import gated, naming, podsettings, tlsspec
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

Manifest = dict[str, Any]

RUN_AS = 10001
_RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
_RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _meta(cr: Resource, name: str, extra_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": cr.namespace,
        "labels": {**naming.labels(cr.kind, cr.name), **(extra_labels or {})},
        "ownerReferences": [cr.owner_reference()],
    }


def startup_config(batch: BatchSettings, extra: Mapping[str, Any] | None = None) -> str:
    """The --config file (contracts §6) a pod starts with: the batchedWrite block plus ``extra``
    top-level sections (flushMode inside batchedWrite, offload, singleKeyTransactions, topicPolicies,
    transactions)."""
    doc: dict[str, Any] = {"batchedWrite": batch.to_block()}
    for key, value in (extra or {}).items():
        if key == "flushMode":
            doc["batchedWrite"]["flushMode"] = value
        else:
            doc[key] = value
    return json.dumps(doc, sort_keys=True)


def pod_config(cr: Resource, version: str | None) -> dict[str, Any]:
    """What the CR adds to the start-up batch settings for a pod starting at ``version``: the
    batchedWrite flushMode when the spec sets one, the gated sections its release has and the
    settings every release reads (``podsettings``)."""
    extra: dict[str, Any] = {}
    flush_mode = cr.section("batchedWrite").get("flushMode")
    if flush_mode:
        extra["flushMode"] = str(flush_mode)
    if version is not None:
        extra.update(gated.config_sections(cr, version))
    extra.update(podsettings.config_sections(cr))
    return extra


def config_map(cr: Resource, batch: BatchSettings, version: str | None = None) -> Manifest:
    """The pod config file; ``version`` is the template's release (gated sections need a feature)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cr, naming.config_map(cr.name)),
        "data": {"config.json": startup_config(batch, pod_config(cr, version))},
    }


def token_secret(cr: Resource, token: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(cr, naming.token_secret(cr.name)),
        "type": "Opaque",
        "stringData": {"token": token},
    }


def cluster_secret(namespace: str, secret: str) -> Manifest:
    """The namespace's cluster secret (coordinator <-> store authentication, txn tickets). Created once,
    never updated, and owned by no resource: every resource's pods in the namespace mount it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": naming.CLUSTER_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"secret": secret},
    }


def service_account(cr: Resource) -> Manifest:
    # The runtime never calls the Kubernetes API: no token is mounted.
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(cr, cr.name),
        "automountServiceAccountToken": False,
    }


def headless_service(cr: Resource) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cr, cr.name),
        "spec": {
            "clusterIP": "None",
            # Peers and the verifier must reach a pod that is starting or failing readiness too.
            "publishNotReadyAddresses": True,
            "selector": naming.selector_labels(cr.kind, cr.name),
            "ports": [
                # Pulsar's conventional name and port: both wires are served on it (pulsar://<svc>:6650).
                {"name": "pulsar", "port": naming.CLIENT_PORT, "targetPort": "pulsar"},
                {"name": "admin", "port": naming.ADMIN_PORT, "targetPort": "admin"},
            ],
        },
    }


def pod_disruption_budget(cr: Resource) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(cr, cr.name),
        "spec": {
            # More than the pods there are means all of them (kubectl scale is never refused for it).
            "maxUnavailable": max(1, min(int(cr.spec.get("maxUnavailable", 1)), cr.replicas)),
            "selector": {"matchLabels": naming.selector_labels(cr.kind, cr.name)},
        },
    }


@dataclass(frozen=True, slots=True)
class PodCount:
    """How many pods the StatefulSet runs now (the scaling engine's choice, not spec.replicas while
    work moves), and the first record's replica and unit counts every pod is started with: a pod that
    holds no copy of the record yet uses ``Placement.initial`` of exactly those (docs/contracts.md §12),
    so they never change for the resource's life."""

    replicas: int
    initial_replicas: int
    units: int

    @classmethod
    def of(cls, cr: Resource) -> PodCount:
        """Before any record exists: what the first record will be."""
        return cls(cr.replicas, cr.replicas, initial_units(cr))


def initial_units(cr: Resource) -> int:
    """The first record's shard count (spec.shards, default 16 per pod) or coordinator-id count."""
    if cr.kind is naming.TRANSACTION_COORDINATOR:
        return cr.coordinators
    return int(cr.spec.get("shards") or SHARDS_PER_REPLICA * cr.replicas)


def member(cr: Resource, ordinal: int) -> Member:
    """How a pod is reached, by its DNS name behind the headless Service (what the record names)."""
    host = f"{cr.name}-{ordinal}.{cr.name}.{cr.namespace}.svc"
    return Member(
        f"{host}:{naming.CLIENT_PORT}",
        f"pulsar://{host}:{naming.CLIENT_PORT}",
        f"http://{host}:{naming.ADMIN_PORT}",
    )


def placement_config_map(cr: Resource, record: Placement, moves: str) -> Manifest:
    """ConfigMap ``<resource>-placement``: the record (key placement.json, Placement.dumps()) and the
    operator's scaling state (key moves.json: moves in flight with their phase, failed moves, the
    first record's replica count). Owned by the resource, written only by the operator."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cr, naming.placement_config_map(cr.name)),
        "data": {naming.PLACEMENT_KEY: record.dumps(), naming.MOVES_KEY: moves},
    }


def _args(cr: Resource, version: str, count: PodCount) -> list[str]:
    args = [
        "serve",
        "--role",
        cr.kind.role,
        "--data-dir",
        naming.DATA_DIR,
        "--release",
        version,
        "--listen",
        f"0.0.0.0:{naming.CLIENT_PORT}",
        "--admin-listen",
        f"0.0.0.0:{naming.ADMIN_PORT}",
        "--pod-name",
        "$(POD_NAME)",
        "--admin-token-file",
        naming.TOKEN_FILE,
        "--cluster-secret-file",
        naming.CLUSTER_SECRET_FILE,
        "--config",
        naming.CONFIG_FILE,
    ]
    if cr.kind is naming.TRANSACTION_COORDINATOR:
        args += ["--coordinators", str(cr.coordinators), "--coordinator-ids", "auto"]
    else:
        args += ["--shards", str(count.units)]
    # The first record's count, never the current one (see PodCount).
    args += ["--replicas", str(count.initial_replicas)]
    return args


def pulsar_urls(cr: Resource) -> str:
    """``pulsar://`` URLs of the resource's pods in ordinal order, by their DNS names behind the
    headless Service: what Pulsar lookups answer (the pods' --pulsar-urls or
    --pulsar-coordinator-urls), so a client in the cluster is sent to the pod itself."""
    return ",".join(
        f"pulsar://{cr.name}-{i}.{cr.name}.{cr.namespace}.svc:{naming.CLIENT_PORT}"
        for i in range(cr.replicas)
    )


def _pulsar_env(cr: Resource, peer: Resource | None) -> list[dict[str, Any]]:
    """Both placement flags: the resource's own pods, and with ``peer`` (spec.pulsar's reference) the
    other role's, so that a Pulsar client reaching either finds topics and coordinators alike (a
    store pod also registers Pulsar transactions with the coordinator pods at those URLs)."""
    stores, coordinators = (cr, peer) if cr.kind is naming.PENDING_ACK_STORE else (peer, cr)
    env: list[dict[str, Any]] = []
    if stores is not None:
        env.append({"name": "TXNKEEPER_PULSAR_URLS", "value": pulsar_urls(stores)})
    if coordinators is not None:
        env.append({"name": "TXNKEEPER_PULSAR_COORDINATOR_URLS", "value": pulsar_urls(coordinators)})
        if cr.kind is naming.PENDING_ACK_STORE:
            # How many coordinators exist: the partitions of Pulsar's coordinator-assign topic.
            env.append({"name": "TXNKEEPER_COORDINATORS", "value": str(coordinators.coordinators)})
    return env


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _resources(cr: Resource) -> dict[str, Any]:
    section = cr.section("resources")
    return {k: dict(section[k]) for k in ("requests", "limits") if section.get(k)}


def _client_authentication(
    cr: Resource,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts, env) giving store pods spec.clientAuthentication's token key as a file."""
    secret = cr.section("clientAuthentication").get("tokenKeySecret") or {}
    if cr.kind is not naming.PENDING_ACK_STORE or not secret.get("name"):
        return [], [], []
    volume = {
        "name": "client-token-key",
        "secret": {
            "secretName": str(secret["name"]),
            "items": [{"key": str(secret.get("key") or "key"), "path": "key"}],
            "defaultMode": 0o440,
        },
    }
    mount = {"name": "client-token-key", "mountPath": naming.CLIENT_TOKEN_KEY_DIR, "readOnly": True}
    env = {"name": "TXNKEEPER_CLIENT_TOKEN_KEY_FILE", "value": naming.CLIENT_TOKEN_KEY_FILE}
    return [volume], [mount], [env]


def tls_on(cr: Resource, settings: OperatorSettings) -> bool:
    """Whether the resource's pods serve TLS: spec.tls.enabled, else the operator's default."""
    return tlsspec.enabled(cr.spec, settings.tls_default)


def _tls_files(cr: Resource) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(volume, volumeMount, env) of the resource's Secret <cr>-tls: the pods' certificate, and the
    client certificate of the verifier jobs (the same env names: contract/tls.py reads them)."""
    volume = {
        "name": tlsspec.VOLUME,
        "secret": {"secretName": tlsspec.secret_name(cr.name), "defaultMode": 0o440},
    }
    mount = {"name": tlsspec.VOLUME, "mountPath": tlsspec.TLS_DIR, "readOnly": True}
    env = [
        {"name": "TXNKEEPER_TLS_CERT_FILE", "value": tlsspec.CERT_FILE},
        {"name": "TXNKEEPER_TLS_KEY_FILE", "value": tlsspec.KEY_FILE},
        {"name": "TXNKEEPER_TLS_CA_FILE", "value": tlsspec.CA_FILE},
    ]
    return volume, mount, env


def _pod_tls(
    cr: Resource, settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], str]:
    """(volumes, volumeMounts, env, probe scheme) of a runtime pod: with TLS all three listeners
    (client, admin, peers) serve the Secret's certificate; the admin port only *requests* a client
    certificate (the kubelet's probes present none; mutating verbs stay behind the admin token)."""
    if not tls_on(cr, settings):
        return [], [], [], "HTTP"
    volume, mount, env = _tls_files(cr)
    env += [
        {"name": "TXNKEEPER_TLS_CLIENT_AUTH", "value": tlsspec.client_auth(cr.spec)},
        {"name": "TXNKEEPER_TLS_ADMIN_CLIENT_AUTH", "value": "request"},
    ]
    return [volume], [mount], env, "HTTPS"


def _job_tls(
    cr: Resource, settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts, env) of a verifier or audit job that calls the pods' admin APIs: the
    resource's Secret, whose certificate is also a client certificate (pods' admin ports verify it)."""
    if not tls_on(cr, settings):
        return [], [], []
    volume, mount, env = _tls_files(cr)
    return [volume], [mount], env


def tls_executor_conf(cr: Resource, settings: OperatorSettings) -> dict[str, str]:
    """On a k8s:// master Spark's executors fetch from the pods too: the same Secret at the same path
    (Spark's executor secret mounts) and the same env."""
    if not tls_on(cr, settings) or not spark_on_kubernetes(cr):
        return {}
    _, _, env = _tls_files(cr)
    conf = {f"spark.kubernetes.executor.secrets.{tlsspec.secret_name(cr.name)}": tlsspec.TLS_DIR}
    conf.update({f"spark.executorEnv.{e['name']}": str(e["value"]) for e in env})
    return conf


def statefulset(
    cr: Resource,
    template: Template,
    settings: OperatorSettings,
    peer: Resource | None = None,
    count: PodCount | None = None,
) -> Manifest:
    """``peer``: the resource spec.pulsar names (reconcile reads it), whose pods' Pulsar URLs the
    pods are told; ``count``: the pods to run and the first record's counts (default: spec.replicas
    before any record exists)."""
    count = count or PodCount.of(cr)
    storage = cr.section("storage")
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(storage.get("size", "1Gi"))}},
    }
    if storage.get("storageClassName"):
        claim_spec["storageClassName"] = storage["storageClassName"]
    selector = naming.selector_labels(cr.kind, cr.name)
    offload_volumes, offload_mounts = gated.offload_volumes(cr, template.version)
    auth_volumes, auth_mounts, auth_env = _client_authentication(cr)
    tls_volumes, tls_mounts, tls_env, scheme = _pod_tls(cr, settings)
    container = {
        "name": "txnkeeper",
        "image": str(cr.spec.get("image") or settings.image),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["txnkeeper"],
        "args": _args(cr, template.version, count),
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": "TXNKEEPER_RELEASE", "value": template.version},
            *gated.offload_env(cr, template.version),
            *podsettings.connection_env(cr),
            *podsettings.memory_env(cr),
            *_pulsar_env(cr, peer),
            *auth_env,
            *tls_env,
        ],
        "ports": [
            {"name": "pulsar", "containerPort": naming.CLIENT_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": naming.ADMIN_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "admin", "scheme": scheme},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "admin", "scheme": scheme},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": _resources(cr),
        "securityContext": _RESTRICTED_CONTAINER,
        "volumeMounts": [
            {"name": "data", "mountPath": naming.DATA_DIR},
            {"name": "config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
            {"name": "admin-token", "mountPath": naming.TOKEN_DIR, "readOnly": True},
            {"name": "cluster-secret", "mountPath": naming.CLUSTER_SECRET_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            *offload_mounts,
            *auth_mounts,
            *tls_mounts,
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(cr, cr.name),
        "spec": {
            "serviceName": cr.name,
            "replicas": count.replicas,
            # Pods start together; the operator alone sequences restarts (OnDelete).
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            # Ledgers outlive the resource: deleting it keeps the PVCs. Scaling down deletes the removed
            # pods' PVCs: the operator shrinks the StatefulSet only once those pods own nothing and
            # report holding no data (their shards moved and released), so nothing reachable is lost
            # and no stale copy waits for a later scale-out to pick it up.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Delete"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": {**naming.labels(cr.kind, cr.name), naming.VERSION_LABEL: template.version},
                    "annotations": {naming.STARTUP_BATCH_ANNOTATION: startup_config(template.batch)},
                },
                "spec": {
                    "serviceAccountName": cr.name,
                    "automountServiceAccountToken": False,
                    "securityContext": _RESTRICTED_POD,
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": naming.config_map(cr.name)}},
                        {
                            "name": "admin-token",
                            "secret": {"secretName": naming.token_secret(cr.name), "defaultMode": 0o440},
                        },
                        {
                            "name": "cluster-secret",
                            "secret": {"secretName": naming.CLUSTER_SECRET, "defaultMode": 0o440},
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        *offload_volumes,
                        *auth_volumes,
                        *tls_volumes,
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": selector},
                    "spec": claim_spec,
                }
            ],
        },
    }


def started_with(statefulset_obj: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """The first record's (replicas, shards) the StatefulSet's pods are started with (``--replicas``,
    ``--shards``; None where absent: a StatefulSet from before placement, or none)."""
    if not statefulset_obj:
        return None, None
    containers = statefulset_obj["spec"]["template"]["spec"].get("containers") or []
    args = [str(a) for a in (containers[0].get("args") or [])] if containers else []

    def flag(name: str) -> int | None:
        if name in args[:-1] and args[args.index(name) + 1].isdecimal():
            return int(args[args.index(name) + 1])
        return None

    return flag("--replicas"), flag("--shards")


def template_of(statefulset_obj: Mapping[str, Any] | None) -> Template | None:
    """Read back what a recreated pod would start with (None: no StatefulSet yet)."""
    if not statefulset_obj:
        return None
    meta = statefulset_obj["spec"]["template"]["metadata"]
    version = (meta.get("labels") or {}).get(naming.VERSION_LABEL)
    if not version:
        return None
    raw = (meta.get("annotations") or {}).get(naming.STARTUP_BATCH_ANNOTATION, "{}")
    block = json.loads(raw).get("batchedWrite", {})
    return Template(version=str(version), batch=BatchSettings.from_block(block))


# ---- the verifier: RBAC, markers, on-demand Job and periodic CronJob ----------------------------------


def verifier_service_account(cr: Resource) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(cr, naming.verifier(cr.name)),
    }


# What Spark's driver does with executor pods on a k8s:// master (runtime verifier/spark_k8s.py): create
# them, watch and list them by label, get its own pod (the executors' owner), delete a failed one, and
# at its stop delete all of its executors by label (deletecollection).
SPARK_EXECUTOR_POD_VERBS = ["create", "delete", "deletecollection", "get", "list", "watch"]


def spark_on_kubernetes(cr: Resource) -> bool:
    """Whether the verifier jobs run Spark's executors as pods (spec.verifier.sparkMaster k8s://)."""
    return _spark_master(cr).startswith("k8s://")


def verifier_role(cr: Resource) -> Manifest:
    # Exactly what the job does: find the pods, read the markers, write the report; on a k8s:// master
    # also Spark's executor pods, in this namespace only (no ConfigMaps, Services or claims: the job
    # tells Spark not to make any). Applied whole, so switching back to local[*] takes the grant away.
    pod_verbs = SPARK_EXECUTOR_POD_VERBS if spark_on_kubernetes(cr) else ["get", "list"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(cr, naming.verifier(cr.name)),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [
                    naming.markers_config_map(cr.name),
                    naming.report_config_map(cr.name),
                    naming.offload_audit_report(cr.name),
                ],
                "verbs": ["get", "update", "patch"],
            },
        ],
    }


def verifier_role_binding(cr: Resource) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(cr, naming.verifier(cr.name)),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": naming.verifier(cr.name),
        },
        "subjects": [{"kind": "ServiceAccount", "name": naming.verifier(cr.name), "namespace": cr.namespace}],
    }


def markers_config_map(cr: Resource, markers: Mapping[str, int], taken_at: str) -> Manifest:
    doc = {"takenAt": taken_at, "stores": dict(sorted(markers.items()))}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cr, naming.markers_config_map(cr.name)),
        "data": {naming.MARKERS_KEY: json.dumps(doc, sort_keys=True)},
    }


def report_config_map(cr: Resource) -> Manifest:
    """Pre-created (owned, so it goes with the resource); the Job fills in report.json."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cr, naming.report_config_map(cr.name)),
    }


def _spark_master(cr: Resource) -> str:
    return str(cr.section("verifier").get("sparkMaster") or "local[*]")


# The environment a k8s:// driver reads (runtime verifier/spark_k8s.py: the same names).
SPARK_DRIVER_PORT = 7078
SPARK_BLOCK_MANAGER_PORT = 7079


def _spark_env(
    cr: Resource, settings: OperatorSettings, executor_conf: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """On a k8s:// master the job's pod is Spark's driver: it tells the executors its IP, owns them by
    its name, and starts them from its own image (side-loaded images: the operator's pull policy);
    ``executor_conf``: executor-pod settings the executors need as well (the offload audit's tier)."""
    if not spark_on_kubernetes(cr):
        return []
    env = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "TXNKEEPER_SPARK_IMAGE", "value": settings.verifier_image},
        {"name": "TXNKEEPER_SPARK_IMAGE_PULL_POLICY", "value": settings.image_pull_policy},
    ]
    if executor_conf:
        env.append({"name": "TXNKEEPER_SPARK_EXECUTOR_CONF", "value": json.dumps(dict(executor_conf))})
    return env


def _spark_ports(cr: Resource) -> dict[str, Any]:
    if not spark_on_kubernetes(cr):
        return {}
    return {
        "ports": [
            {"name": "spark-driver", "containerPort": SPARK_DRIVER_PORT, "protocol": "TCP"},
            {"name": "spark-blocks", "containerPort": SPARK_BLOCK_MANAGER_PORT, "protocol": "TCP"},
        ]
    }


def _verifier_pod_spec(cr: Resource, settings: OperatorSettings) -> dict[str, Any]:
    tls_volumes, tls_mounts, tls_env = _job_tls(cr, settings)
    return {
        "serviceAccountName": naming.verifier(cr.name),
        "restartPolicy": "Never",
        "securityContext": _RESTRICTED_POD,
        "containers": [
            {
                "name": "verifier",
                "image": settings.verifier_image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["txnkeeper"],
                "args": [
                    "verify-invalidation",
                    "--selector",
                    naming.selector_string(cr.kind, cr.name),
                    "--namespace",
                    cr.namespace,
                    "--admin-port",
                    str(naming.ADMIN_PORT),
                    "--markers-configmap",
                    naming.markers_config_map(cr.name),
                    "--output",
                    f"configmap:{naming.report_config_map(cr.name)}",
                    "--master",
                    _spark_master(cr),
                ],
                # Spark writes scratch files and its ivy cache under HOME and the local dirs.
                "env": [
                    {"name": "HOME", "value": "/tmp"},
                    {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"},
                    *_spark_env(cr, settings, tls_executor_conf(cr, settings)),
                    *tls_env,
                ],
                **_spark_ports(cr),
                "securityContext": _RESTRICTED_CONTAINER,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *tls_mounts],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, *tls_volumes],
    }


def _job_spec(cr: Resource, settings: OperatorSettings) -> dict[str, Any]:
    return {
        "backoffLimit": 1,
        # Exit 1 is the verifier's "not safe" verdict (its report is written): retrying it only burns a
        # Spark run. Other failures (exit 2: infrastructure) get the one retry.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "verifier", "operator": "In", "values": [1]},
                }
            ]
        },
        "activeDeadlineSeconds": 900,
        "ttlSecondsAfterFinished": 600,
        "template": {
            "metadata": {"labels": naming.verifier_labels(cr.name)},
            "spec": _verifier_pod_spec(cr, settings),
        },
    }


def verifier_cron_job(cr: Resource, settings: OperatorSettings) -> Manifest:
    schedule = str(cr.section("verifier").get("schedule") or "")
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _meta(cr, naming.verifier(cr.name)),
        "spec": {
            # Without a schedule the CronJob only serves as the template of on-demand runs.
            "schedule": schedule or "@hourly",
            "suspend": not schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 2,
            "failedJobsHistoryLimit": 2,
            "jobTemplate": {
                "metadata": {"labels": naming.verifier_labels(cr.name)},
                "spec": _job_spec(cr, settings),
            },
        },
    }


def verifier_job(cr: Resource, settings: OperatorSettings, stamp: int) -> Manifest:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **_meta(cr, naming.verifier_job(cr.name, stamp)),
            "labels": naming.verifier_labels(cr.name),
        },
        "spec": _job_spec(cr, settings),
    }


# ---- the offload audit: a periodic verify-offload against the tier (PendingAckStores with offload) -----


def _offload_audit_pod_spec(cr: Resource, settings: OperatorSettings) -> dict[str, Any]:
    # Without a usable spec.offload: no settings, no credentials, no claim (a manual run says so).
    audit_settings = gated.audit_settings(cr) if gated.audits_offload(cr) else {}
    volumes, mounts = gated.offload_volumes(cr, cr.version)
    executor_conf = {**gated.offload_executor_conf(cr, cr.version), **tls_executor_conf(cr, settings)}
    # The audit only reads the tier: the filesystem driver's shared claim is mounted read-only.
    mounts = [{**mount, "readOnly": True} for mount in mounts]
    tls_volumes, tls_mounts, tls_env = _job_tls(cr, settings)
    return {
        # The verifier's account: list pods, write its own report ConfigMap, nothing else.
        "serviceAccountName": naming.verifier(cr.name),
        "restartPolicy": "Never",
        "securityContext": _RESTRICTED_POD,
        "containers": [
            {
                "name": "verify-offload",
                "image": settings.verifier_image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["txnkeeper"],
                "args": [
                    "verify-offload",
                    "--selector",
                    naming.selector_string(cr.kind, cr.name),
                    "--namespace",
                    cr.namespace,
                    "--admin-port",
                    str(naming.ADMIN_PORT),
                    # The same blob-store settings the pods get (their config file's offload section).
                    "--offload-json",
                    json.dumps(audit_settings, sort_keys=True),
                    "--output",
                    f"configmap:{naming.offload_audit_report(cr.name)}",
                    "--master",
                    _spark_master(cr),
                ],
                "env": [
                    {"name": "HOME", "value": "/tmp"},
                    {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"},
                    *gated.offload_env(cr, cr.version),
                    *_spark_env(cr, settings, executor_conf),
                    *tls_env,
                ],
                **_spark_ports(cr),
                "securityContext": _RESTRICTED_CONTAINER,
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mounts, *tls_mounts],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, *volumes, *tls_volumes],
    }


def offload_audit_cron_job(cr: Resource, settings: OperatorSettings) -> Manifest | None:
    """The periodic tier audit of a PendingAckStore (None for coordinators). Like the verifier's
    CronJob it always exists: suspended without spec.offload.verifySchedule (a template for
    ``kubectl create job --from=cronjob/NAME``) and whenever the spec has no offload its release can
    use, then with empty settings. Kept rather than deleted: the operator may delete pods only."""
    if cr.kind is not naming.PENDING_ACK_STORE:
        return None
    active = gated.audits_offload(cr)
    schedule = str(cr.section("offload").get("verifySchedule") or "") if active else ""
    labels = naming.offload_audit_labels(cr.name)
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _meta(cr, naming.offload_audit(cr.name), labels),
        "spec": {
            "schedule": schedule or "@daily",
            "suspend": not schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 2,
            "failedJobsHistoryLimit": 2,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    # Exit 1 means findings (the report is written): a retry would find them again.
                    "backoffLimit": 1,
                    "podFailurePolicy": {
                        "rules": [
                            {
                                "action": "FailJob",
                                "onExitCodes": {
                                    "containerName": "verify-offload",
                                    "operator": "In",
                                    "values": [1],
                                },
                            }
                        ]
                    },
                    "activeDeadlineSeconds": 3600,
                    "ttlSecondsAfterFinished": 600,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": _offload_audit_pod_spec(cr, settings),
                    },
                },
            },
        },
    }


def offload_audit_report_config_map(cr: Resource) -> Manifest:
    """Pre-created (owned) so the audit only patches its key and the report goes with the resource."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cr, naming.offload_audit_report(cr.name), naming.offload_audit_labels(cr.name)),
    }


def children(cr: Resource, settings: OperatorSettings) -> list[Manifest]:
    """Everything that exists independently of the rollout (the StatefulSet and its ConfigMap are
    written only by the engine's ApplyTemplate; the token Secret only once)."""
    audit = offload_audit_cron_job(cr, settings)
    return [
        service_account(cr),
        headless_service(cr),
        pod_disruption_budget(cr),
        verifier_service_account(cr),
        verifier_role(cr),
        verifier_role_binding(cr),
        verifier_cron_job(cr, settings),
        *([audit] if audit is not None else []),
    ]
