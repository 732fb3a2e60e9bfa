"""The cluster itself: the pinned API server, and a node that runs pods the way the operator needs.

Why these tests exist before any operator test: every operator test relies on them. A StatefulSet pod
must become Ready through its real readiness probe, get its env and volumes as the API describes them,
keep its PersistentVolume data across deletion, die (SIGTERM, then SIGKILL) when deleted, and be
restarted by the kubelet when the runtime kills its container.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.helpers import (
    IMAGE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    Cluster,
    http_get,
    http_post,
    k8s_version,
    pod_ready,
    wait_for,
)

Obj = dict[str, Any]
SERVER = (Path(__file__).parent / "podapps" / "probe_server.py").read_text()


def probe_statefulset(name: str, *, grace: int = 10, ignore_sigterm: bool = False) -> Obj:
    """A one-replica StatefulSet running probe_server.py with every env and volume kind we support."""

    def field(path: str) -> Obj:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "securityContext": RESTRICTED_POD,
                    "containers": [
                        {
                            "name": "server",
                            "image": IMAGE,
                            "securityContext": RESTRICTED_CONTAINER,
                            "command": ["python", "/app/probe_server.py"],
                            "args": [
                                "--bind",
                                "0.0.0.0",
                                "--pod-ip",
                                "$(POD_IP)",
                                "--port",
                                "8000",
                                "--data",
                                "/data",
                                "--ignore-sigterm",
                                "yes" if ignore_sigterm else "no",
                                "--expanded",
                                "$(POD_NAME).$(POD_NAMESPACE)",
                                "--escaped",
                                "$$(POD_NAME)",
                            ],
                            "env": [
                                {"name": "POD_IP", **field("status.podIP")},
                                {"name": "POD_NAME", **field("metadata.name")},
                                {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                                {"name": "POD_UID", **field("metadata.uid")},
                                {"name": "LISTEN", "value": "$(POD_IP):8000"},
                                {"name": "UNDEFINED_REF", "value": "$(NOT_DEFINED)"},
                                {
                                    "name": "GREETING",
                                    "valueFrom": {
                                        "configMapKeyRef": {"name": "probe-config", "key": "greeting"}
                                    },
                                },
                                {
                                    "name": "TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "probe-secret", "key": "token"}},
                                },
                            ],
                            "envFrom": [{"configMapRef": {"name": "probe-config"}, "prefix": "CFG_"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": "http"},
                                "periodSeconds": 1,
                                "failureThreshold": 1,
                            },
                            "volumeMounts": [
                                {"name": "app", "mountPath": "/app"},
                                {"name": "data", "mountPath": "/data"},
                                {"name": "secret", "mountPath": "/etc/probe-secret", "readOnly": True},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "app", "configMap": {"name": "probe-app"}},
                        {"name": "secret", "secret": {"secretName": "probe-secret"}},
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "64Mi"}},
                    },
                }
            ],
        },
    }


def deploy_probe(cluster: Cluster, ns: str, name: str = "probe", **kw: Any) -> Obj:
    # Dict bodies where the signatures say V1ConfigMap, V1Secret and V1StatefulSet: the client validates
    # them into those.
    app = {"metadata": {"name": "probe-app"}, "data": {"probe_server.py": SERVER}}
    cluster.core.create_namespaced_config_map(ns, app)  # type: ignore[arg-type]
    config = {"metadata": {"name": "probe-config"}, "data": {"greeting": "hello", "mode": "e2e"}}
    cluster.core.create_namespaced_config_map(ns, config)  # type: ignore[arg-type]
    secret = {"metadata": {"name": "probe-secret"}, "stringData": {"token": "s3cret"}}
    cluster.core.create_namespaced_secret(ns, secret)  # type: ignore[arg-type]
    cluster.apps.create_namespaced_stateful_set(ns, probe_statefulset(name, **kw))  # type: ignore[arg-type]
    return wait_ready(cluster, ns, f"{name}-0")


def wait_ready(cluster: Cluster, ns: str, pod: str, timeout: float = 90.0) -> Obj:
    def ready() -> Obj | None:
        p = cluster.pod(ns, pod)
        return p if pod_ready(p) else None

    return wait_for(
        ready,
        f"pod {ns}/{pod} Ready",
        timeout=timeout,
        describe=lambda: json.dumps((cluster.pod(ns, pod) or {}).get("status"))[:2000],
    )


def info(cluster: Cluster, ns: str, pod: str) -> Obj:
    with cluster.endpoint(ns, pod, 8000) as ep:
        code, body = http_get(f"http://{ep}/info")
    assert code == 200, body
    result: Obj = json.loads(body)
    return result


def test_api_server_is_the_pinned_release_with_one_ready_node(cluster: Cluster) -> None:
    version = client.VersionApi(cluster.api).get_code()
    assert version.major == "1"
    assert version.git_version == f"v{k8s_version()}"
    nodes = cluster.core.list_node().items
    assert len(nodes) == 1
    status = nodes[0].status
    assert status is not None and status.conditions is not None
    assert any(c.type == "Ready" and c.status == "True" for c in status.conditions)


def _bridges() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True, check=True
    )
    return {line.split(": ")[1] for line in out.stdout.splitlines()}


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="adding bridges needs root and ip"
)
def test_a_dead_bridge_hiding_the_kind_network_is_deleted_by_the_engine_script(cluster: Cluster) -> None:
    """A bridge another data root's dockerd left (same subnet, no port) made the node unreachable once.

    engine.sh up deletes such a bridge, and only such: one on another subnet stays."""
    inspect = ["docker", "network", "inspect", "kind", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"]
    subnets = subprocess.run(inspect, capture_output=True, text=True, check=True).stdout.split()
    kind_net = next(ipaddress.ip_network(s) for s in subnets if ipaddress.ip_network(s).version == 4)
    hiding, unrelated = "br-0badc0ffee00", "br-0badc0ffee01"
    script = Path(__file__).parent / "kind" / "engine.sh"
    try:
        for dev, address in (
            (hiding, f"{next(kind_net.hosts())}/{kind_net.prefixlen}"),
            (unrelated, "10.254.77.1/24"),
        ):
            subprocess.run(["ip", "link", "add", dev, "type", "bridge"], check=True)
            # Up with no port (NO-CARRIER) as a dead engine's bridge is, so that its route exists; the
            # metric keeps that route behind the live one while it does.
            subprocess.run(["ip", "link", "set", dev, "up"], check=True)
            subprocess.run(["ip", "addr", "add", address, "dev", dev, "metric", "4242"], check=True)
        up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, check=True)
        assert f"deleting bridge {hiding}" in up.stderr
        assert hiding not in _bridges() and unrelated in _bridges()
        assert up.stdout.startswith("export DOCKER_HOST=")
        assert len(cluster.core.list_node().items) == 1
    finally:
        for dev in (hiding, unrelated):
            subprocess.run(["ip", "link", "delete", dev], capture_output=True, check=False)


def test_invalid_builtin_object_is_rejected_with_the_field_and_reason(
    cluster: Cluster, namespace: str
) -> None:
    with pytest.raises(client.ApiException) as err:
        cluster.apps.create_namespaced_stateful_set(
            namespace,
            {  # type: ignore[arg-type]  # a dict body for a V1StatefulSet: the client validates it into one
                **probe_statefulset("bad"),
                "spec": {**probe_statefulset("bad")["spec"], "replicas": -1},
            },
        )
    assert err.value.status == 422
    assert err.value.body is not None
    assert "spec.replicas" in err.value.body and "greater than or equal to 0" in err.value.body


def test_statefulset_pod_runs_with_env_volumes_and_readiness(cluster: Cluster, namespace: str) -> None:
    pod = deploy_probe(cluster, namespace)
    ip = pod["status"]["podIP"]
    got = info(cluster, namespace, "probe-0")
    env = got["env"]
    assert env["POD_IP"] == ip and env["POD_NAME"] == "probe-0" and env["POD_NAMESPACE"] == namespace
    assert env["POD_UID"] == pod["metadata"]["uid"]
    assert env["LISTEN"] == f"{ip}:8000"  # $(VAR) expanded against earlier env entries
    assert env["UNDEFINED_REF"] == "$(NOT_DEFINED)"  # undefined references stay as written
    assert env["GREETING"] == "hello" and env["TOKEN"] == "s3cret"
    assert env["CFG_greeting"] == "hello" and env["CFG_mode"] == "e2e"
    argv = got["argv"]
    assert argv[argv.index("--expanded") + 1] == f"probe-0.{namespace}"
    assert argv[argv.index("--escaped") + 1] == "$(POD_NAME)"
    assert argv[argv.index("--pod-ip") + 1] == ip
    assert got["hostname"] == "probe-0"
    assert got["hostnameResolvesTo"] == ip  # the pod's /etc/hosts, as the kubelet writes it
    assert got["files"]["/etc/probe-secret/token"] == "s3cret"
    # Every pod gets a service-account token (the API's ServiceAccount admission adds the volume).
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert got["files"][f"{sa_dir}/namespace"] == namespace
    assert got["files"][f"{sa_dir}/token"].count(".") == 2  # a JWT
    # Its own network namespace: an address of the pod network, not the node's.
    assert ipaddress.ip_address(ip) != ipaddress.ip_address(pod["status"]["hostIP"])
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"  # the image's ENV, as a real runtime applies it


def test_readiness_follows_the_process_probe(cluster: Cluster, namespace: str) -> None:
    deploy_probe(cluster, namespace)
    with cluster.endpoint(namespace, "probe-0", 8000) as ep:
        assert http_post(f"http://{ep}/unready")[0] == 200
        wait_for(lambda: not pod_ready(cluster.pod(namespace, "probe-0")), "probe-0 to become NotReady", 30)
        assert http_post(f"http://{ep}/ready")[0] == 200
    wait_ready(cluster, namespace, "probe-0", timeout=30)


def test_pvc_data_survives_pod_deletion_and_sigterm_is_delivered(cluster: Cluster, namespace: str) -> None:
    first = deploy_probe(cluster, namespace)
    old_uid = first["metadata"]["uid"]
    cluster.core.delete_namespaced_pod("probe-0", namespace)
    # The StatefulSet controller recreates probe-0 (new UID) once the old pod object is gone.
    wait_for(
        lambda: (p := cluster.pod(namespace, "probe-0")) is not None and p["metadata"]["uid"] != old_uid,
        "probe-0 to be recreated",
        timeout=60,
    )
    new = wait_ready(cluster, namespace, "probe-0")
    got = info(cluster, namespace, "probe-0")
    boots = [line.split()[0] for line in got["boots"]]
    assert boots == [old_uid, new["metadata"]["uid"]]  # the same volume, one boot line per pod
    assert got["shutdown"] == f"SIGTERM {old_uid}\n"  # the old process got SIGTERM and exited cleanly


def test_deleting_a_pod_that_ignores_sigterm_kills_it_after_the_grace_period(
    cluster: Cluster, namespace: str
) -> None:
    pod = deploy_probe(cluster, namespace, grace=2, ignore_sigterm=True)
    cid = cluster.container_id(namespace, "probe-0", "server")
    assert cluster.container_running(cid)
    cluster.apps.delete_namespaced_stateful_set("probe", namespace)
    cluster.core.delete_namespaced_pod("probe-0", namespace)
    wait_for(lambda: cluster.pod(namespace, "probe-0") is None, "probe-0 to be deleted", timeout=60)
    # The runtime no longer runs it: SIGTERM was ignored, so only the kubelet's SIGKILL ended it.
    assert not cluster.container_running(cid)
    shutdown = cluster.node_exec("cat", f"{_pv_dir(cluster, namespace)}/shutdown.log")
    assert shutdown == f"SIGTERM {pod['metadata']['uid']}\n"  # ignored, then killed


def test_a_container_killed_by_the_runtime_is_restarted_and_counted(cluster: Cluster, namespace: str) -> None:
    deploy_probe(cluster, namespace)
    before = cluster.pod(namespace, "probe-0")
    assert before is not None
    killed = cluster.kill_container(namespace, "probe-0", "server")

    def restarted() -> Obj | None:
        p = cluster.pod(namespace, "probe-0")
        if not p or not pod_ready(p):
            return None
        cs = p["status"]["containerStatuses"][0]
        return p if cs["restartCount"] == 1 else None

    after = wait_for(restarted, "probe-0 restarted and Ready", timeout=90)
    cs = after["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 137  # 128 + SIGKILL
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # same pod, restarted container
    assert after["status"]["podIP"] == before["status"]["podIP"]  # same sandbox
    assert cluster.container_id(namespace, "probe-0", "server") != killed
    assert len(info(cluster, namespace, "probe-0")["boots"]) == 2


def test_job_pod_runs_to_completion_with_in_cluster_credentials(cluster: Cluster, namespace: str) -> None:
    """What the operator Deployment and the verifier Job rely on: a pod's service account token and
    KUBERNETES_SERVICE_* env work with the kubernetes client's in-cluster configuration, under RBAC."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    # Dict bodies where the signatures say V1Role, V1RoleBinding and V1Job: the client validates them
    # into those.
    rbac.create_namespaced_role(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    script = (
        "from kubernetes import client, config; config.load_incluster_config(); "
        "import os; ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read(); "
        "pods = client.CoreV1Api().list_namespaced_pod(ns).items; "
        "print('pods-listed', [p.metadata.name for p in pods]); "
        "raise SystemExit(0 if any(p.metadata.name == os.environ['POD_NAME'] for p in pods) else 3)"
    )
    cluster.batch.create_namespaced_job(
        namespace,
        {  # type: ignore[arg-type]
            "metadata": {"name": "incluster"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "securityContext": RESTRICTED_POD,
                        "containers": [
                            {
                                "name": "list",
                                "image": IMAGE,
                                "securityContext": RESTRICTED_CONTAINER,
                                "command": ["python", "-c", script],
                                "env": [
                                    {
                                        "name": "POD_NAME",
                                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                    }
                                ],
                            }
                        ],
                    }
                },
            },
        },
    )

    def finished() -> str | None:
        job = cluster.batch.read_namespaced_job("incluster", namespace)
        assert job.status is not None
        for c in job.status.conditions or []:
            if c.type in ("Complete", "Failed") and c.status == "True":
                return str(c.type)
        return None

    assert wait_for(finished, "job incluster to finish", timeout=90) == "Complete"


def _pv_dir(cluster: Cluster, ns: str) -> Path:
    pvc = cluster.core.read_namespaced_persistent_volume_claim("data-probe-0", ns)
    assert pvc.spec is not None and pvc.spec.volume_name is not None
    pv = cluster.core.read_persistent_volume(pvc.spec.volume_name)
    assert pv.spec is not None and pv.spec.host_path is not None
    return Path(pv.spec.host_path.path)
