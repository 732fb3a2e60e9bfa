"""Spark on Kubernetes for the verifier jobs: the driver in the job's pod, executors as pods.

With a ``k8s://`` master the job's pod is Spark's driver (client mode) and Spark creates the executor
pods itself. Everything Spark needs for that comes from the pod's environment, which the operator
renders (contracts §7): the pod's IP, name and namespace (downward API), and the verifier image with
its pull policy. The executors are started from that same image (``spark_executor`` is their entry
point), so their Python workers import the same txnkeeper as the driver; they run as restricted pods
(the namespaces enforce Pod Security ``restricted``), without an API token, owned by the driver pod.

Only what Spark's driver needs of the API is used, so its Role stays small: pods (create, get, list,
watch, delete, deletecollection) in its own namespace. No ConfigMap for the executors' Spark
configuration files (there are none), no PersistentVolumeClaim look-ups, and no Service clean-up (a
client-mode driver has no Service).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txnkeeper.verifier.model import VerifierInputError

MASTER_PREFIX = "k8s://"
# The environment the operator gives the job's container (names shared with its builders).
ENV_POD_IP = "POD_IP"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_IMAGE = "TXNKEEPER_SPARK_IMAGE"
ENV_PULL_POLICY = "TXNKEEPER_SPARK_IMAGE_PULL_POLICY"
ENV_EXECUTORS = "TXNKEEPER_SPARK_EXECUTORS"
# JSON object of executor-pod settings the job's pod has and its executors need too (the offload
# audit's tier credentials and shared claim); only spark.kubernetes.executor.* keys are accepted.
ENV_EXECUTOR_CONF = "TXNKEEPER_SPARK_EXECUTOR_CONF"
EXECUTOR_CONF_PREFIX = "spark.kubernetes.executor."
# With TLS the executors fetch from the pods' https admin APIs with the job's certificate files
# (mounted by spark.kubernetes.executor.secrets.*): the files' env, and nothing else, may be set too.
EXECUTOR_TLS_ENV_PREFIX = "spark.executorEnv.TXNKEEPER_TLS_"
REQUIRED_ENV = (ENV_POD_IP, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_IMAGE)
# Fixed so the executors can be told where to call back (and a NetworkPolicy could name them).
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
DEFAULT_EXECUTORS = 2
EXECUTOR_LABELS = {
    "app.kubernetes.io/part-of": "txnkeeper",
    "app.kubernetes.io/component": "verifier-executor",
}
# Small: a verifier partition is a few HTTP requests and a JSON judgement per pod.
EXECUTOR_MEMORY = "512m"
EXECUTOR_CPU_REQUEST = "100m"
# The API server's CA and the service account's token, where Kubernetes mounts them in every pod.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RUN_AS = 10001
# Spark takes a template's mounts named spark-local-dir-* as the executor's local dirs instead of adding
# its own emptyDir (which, at the job's SPARK_LOCAL_DIRS=/tmp, would collide with a mount at /tmp).
LOCAL_DIR_VOLUME = "spark-local-dir-1"


def is_kubernetes(master: str | None) -> bool:
    return master is not None and master.startswith(MASTER_PREFIX)


def executor_pod_template() -> dict[str, Any]:
    """What Spark merges its executor pod into: restricted (Pod Security), no API token, the image's
    executor entry point, and a writable /tmp as working and local directory (the root filesystem is
    read-only; files added to the job land in the working directory)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS,
                "runAsGroup": RUN_AS,
                "fsGroup": RUN_AS,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "executor",
                    # Spark appends the argument `executor` (the official image's entrypoint contract).
                    "command": [sys.executable, "-m", "txnkeeper.verifier.spark_executor"],
                    "workingDir": "/tmp",
                    "env": [{"name": "HOME", "value": "/tmp"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": LOCAL_DIR_VOLUME, "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": LOCAL_DIR_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


def _executors(env: Mapping[str, str]) -> int:
    text = env.get(ENV_EXECUTORS, str(DEFAULT_EXECUTORS))
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise VerifierInputError(f"{ENV_EXECUTORS} must be a positive number of executors, got {text!r}")
    return count


def _executor_conf(env: Mapping[str, str]) -> dict[str, str]:
    text = env.get(ENV_EXECUTOR_CONF) or "{}"
    try:
        conf = json.loads(text)
    except ValueError as exc:
        raise VerifierInputError(f"{ENV_EXECUTOR_CONF} is not JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(conf, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in conf.items()
    ):
        raise VerifierInputError(f"{ENV_EXECUTOR_CONF} must be a JSON object of strings, got {text[:200]!r}")
    outside = sorted(k for k in conf if not k.startswith((EXECUTOR_CONF_PREFIX, EXECUTOR_TLS_ENV_PREFIX)))
    if outside:
        raise VerifierInputError(
            f"{ENV_EXECUTOR_CONF} may only set {EXECUTOR_CONF_PREFIX}* (executor pods) and"
            f" {EXECUTOR_TLS_ENV_PREFIX}* (their TLS files), got {outside}"
        )
    return conf


def kubernetes_conf(env: Mapping[str, str], work_dir: Path, java_options: str) -> dict[str, str]:
    """Spark settings for a client-mode driver in this pod; writes the executor pod template into
    ``work_dir``. Raises VerifierInputError naming every missing variable (the job was not started
    by the operator's CronJob, or from an older one)."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise VerifierInputError(
            f"a {MASTER_PREFIX} master runs the driver in this pod and needs {', '.join(missing)} in the"
            " environment (the operator's verifier CronJob sets them; set them when running it by hand)"
        )
    executors = _executors(env)
    extra = _executor_conf(env)
    template = work_dir / "executor-pod.json"
    template.write_text(json.dumps(executor_pod_template(), indent=2) + "\n", encoding="utf-8")
    conf = {
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": env[ENV_POD_NAMESPACE],
        "spark.kubernetes.container.image": env[ENV_IMAGE],
        "spark.kubernetes.container.image.pullPolicy": env.get(ENV_PULL_POLICY) or "IfNotPresent",
        # The executors are owned by this pod: gone with it even when Spark cannot delete them.
        "spark.kubernetes.driver.pod.name": env[ENV_POD_NAME],
        "spark.kubernetes.authenticate.caCertFile": f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        "spark.kubernetes.authenticate.oauthTokenFile": f"{SERVICE_ACCOUNT_DIR}/token",
        # Both the pod IP: Spark 4 tells executors the bind address instead of the host when
        # spark.kubernetes.executor.useDriverPodIP is on, so 0.0.0.0 there would send them nowhere.
        "spark.driver.host": env[ENV_POD_IP],
        "spark.driver.bindAddress": env[ENV_POD_IP],
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.instances": str(executors),
        "spark.executor.cores": "1",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.kubernetes.executor.request.cores": EXECUTOR_CPU_REQUEST,
        "spark.executor.extraJavaOptions": java_options,
        "spark.kubernetes.executor.podTemplateFile": str(template),
        "spark.kubernetes.executor.podTemplateContainerName": "executor",
        "spark.kubernetes.executor.deleteOnTermination": "true",
        # A client-mode driver has no Service; without this Spark's stop deletes Services by label.
        "spark.kubernetes.driver.service.deleteOnTermination": "false",
        # No Spark configuration files to ship: no ConfigMap (and no configmaps in the Role).
        "spark.kubernetes.executor.disableConfigMap": "true",
        # No PersistentVolumeClaims: nothing to own or reuse (and no persistentvolumeclaims in the Role).
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        # Every executor takes part: start the job only when all have registered.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
        **{f"spark.kubernetes.executor.label.{k}": v for k, v in EXECUTOR_LABELS.items()},
        **extra,
    }
    return conf
