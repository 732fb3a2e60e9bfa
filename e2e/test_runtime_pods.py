"""The txnkeeper runtime as pods (contracts §6), without the operator: the platform half of the story.

Why: before the operator drives them, `txnkeeper serve` pods must work on the cluster as the operator
will run them: listening in their own network namespace, Ready through the admin API's /ready, their
ledgers on the PersistentVolume, and every committed transaction still there after a pod is deleted
and recreated.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from e2e.helpers import (
    IMAGE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    TMP_MOUNT,
    TMP_VOLUME,
    Cluster,
    pod_ready,
    wait_for,
)
from e2e.test_node import wait_ready
from e2e.workload import produce, verify

Obj = dict[str, Any]
DATA = "/var/lib/txnkeeper"


def serve_statefulset(name: str, role: str, replicas: int, extra: list[str]) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 20,
                    "securityContext": RESTRICTED_POD,
                    "containers": [
                        {
                            "name": "txnkeeper",
                            "image": IMAGE,
                            "securityContext": RESTRICTED_CONTAINER,
                            "command": ["txnkeeper", "serve"],
                            "args": [
                                f"--role={role}",
                                f"--data-dir={DATA}",
                                "--release=2.0.0",
                                "--listen=0.0.0.0:6650",
                                "--admin-listen=0.0.0.0:8080",
                                "--pod-name=$(POD_NAME)",
                                "--admin-token-file=/etc/txnkeeper/token/token",
                                "--cluster-secret-file=/etc/txnkeeper/token/cluster",
                                *extra,
                            ],
                            "env": [
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                            ],
                            "ports": [
                                {"name": "client", "containerPort": 6650},
                                {"name": "admin", "containerPort": 8080},
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": "admin"},
                                "periodSeconds": 1,
                            },
                            "volumeMounts": [
                                {"name": "data", "mountPath": DATA},
                                {"name": "token", "mountPath": "/etc/txnkeeper/token", "readOnly": True},
                                TMP_MOUNT,
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "token", "secret": {"secretName": "admin-token", "defaultMode": 0o440}},
                        TMP_VOLUME,
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "256Mi"}},
                    },
                }
            ],
        },
    }


def addresses(cluster: Cluster, ns: str, prefix: str, n: int, port: int) -> list[str]:
    out = []
    for i in range(n):
        pod = cluster.pod(ns, f"{prefix}-{i}")
        assert pod is not None
        out.append(f"{pod['status']['podIP']}:{port}")
    return out


def test_runtime_pods_keep_committed_transactions_across_pod_deletion(
    cluster: Cluster, namespace: str
) -> None:
    if not cluster.pods_routed:
        pytest.skip("the client here reaches pods by pod IP, and this machine does not route the pod network")
    # Dict bodies where the signatures say V1Secret and V1StatefulSet: the client validates them into those.
    # One Secret holds the admin token and the cluster secret coordinator and store pods share.
    secret = {
        "metadata": {"name": "admin-token"},
        "stringData": {"token": "t0ken", "cluster": "e2e-cluster-secret-0123456789"},
    }
    cluster.core.create_namespaced_secret(namespace, secret)  # type: ignore[arg-type]
    tc_set = serve_statefulset("tc", "coordinator", 1, ["--coordinators=1", "--coordinator-ids=0"])
    cluster.apps.create_namespaced_stateful_set(namespace, tc_set)  # type: ignore[arg-type]
    store_set = serve_statefulset("store", "store", 2, [])
    cluster.apps.create_namespaced_stateful_set(namespace, store_set)  # type: ignore[arg-type]
    for pod in ("tc-0", "store-0", "store-1"):
        wait_ready(cluster, namespace, pod, timeout=120)
    coordinators = addresses(cluster, namespace, "tc", 1, 6650)
    stores = addresses(cluster, namespace, "store", 2, 6650)
    topics = ["persistent://public/default/orders", "persistent://public/default/payments"]
    record = asyncio.run(produce(coordinators, stores, topics, txns=12))
    assert record.committed_txns == 9 and record.aborted_txns == 3

    # Delete every pod; the StatefulSets recreate them on the same volumes (new pod IPs possible).
    old = {p: cluster.pod(namespace, p)["metadata"]["uid"] for p in ("tc-0", "store-0", "store-1")}  # type: ignore[index]
    for pod in old:
        cluster.core.delete_namespaced_pod(pod, namespace)
    for pod, uid in old.items():
        wait_for(
            lambda pod=pod, uid=uid: (
                (p := cluster.pod(namespace, pod)) is not None  # type: ignore[misc]
                and p["metadata"]["uid"] != uid
                and pod_ready(p)
            ),
            f"{pod} recreated and Ready",
            timeout=120,
        )
    stores = addresses(cluster, namespace, "store", 2, 6650)
    asyncio.run(verify(stores, record))
