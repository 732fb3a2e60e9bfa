"""Spark on Kubernetes, the verifier's side: the driver's settings from the pod's environment, the
executor pod template (restricted), and the executors' entry point (the official image's contract)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from txnkeeper.verifier import spark_executor, spark_k8s
from txnkeeper.verifier.job import spark_session
from txnkeeper.verifier.model import VerifierInputError

ENV = {
    "POD_IP": "10.244.0.17",
    "POD_NAME": "txn-verify-1-abcde",
    "POD_NAMESPACE": "prod",
    "TXNKEEPER_SPARK_IMAGE": "txnkeeper-verifier:e2e",
    "TXNKEEPER_SPARK_IMAGE_PULL_POLICY": "Never",
}
EXECUTOR_ENV = {
    "JAVA_HOME": "/usr/lib/jvm/java-17",
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.244.0.17:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_APPLICATION_ID": "spark-app-1",
    "SPARK_EXECUTOR_POD_IP": "10.244.0.20",
    "SPARK_EXECUTOR_POD_NAME": "txnkeeper-verify-exec-2",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_JAVA_OPT_10": "-Dlater=1",
    "SPARK_JAVA_OPT_2": "-Dearlier=1",
}


def test_driver_settings_come_from_the_pods_environment(tmp_path: Path) -> None:
    conf = spark_k8s.kubernetes_conf(ENV, tmp_path, "-XX:+UseSerialGC")
    assert conf["spark.kubernetes.namespace"] == "prod"
    assert conf["spark.kubernetes.container.image"] == "txnkeeper-verifier:e2e"
    assert conf["spark.kubernetes.container.image.pullPolicy"] == "Never"
    # Executors owned by the driver pod, calling back to its IP on fixed ports.
    assert conf["spark.kubernetes.driver.pod.name"] == "txn-verify-1-abcde"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.244.0.17"
    assert (conf["spark.driver.port"], conf["spark.driver.blockManager.port"]) == ("7078", "7079")
    assert conf["spark.executor.instances"] == "2"
    assert conf["spark.executor.extraJavaOptions"] == "-XX:+UseSerialGC"
    # Nothing but pods asked of the API (the Role grants nothing else).
    assert conf["spark.kubernetes.executor.disableConfigMap"] == "true"
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.driver.reusePersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "false"
    assert conf["spark.kubernetes.executor.deleteOnTermination"] == "true"
    template = json.loads(Path(conf["spark.kubernetes.executor.podTemplateFile"]).read_text())
    assert template == spark_k8s.executor_pod_template()
    assert (
        spark_k8s.kubernetes_conf({**ENV, "TXNKEEPER_SPARK_EXECUTORS": "3"}, tmp_path, "")[
            "spark.executor.instances"
        ]
        == "3"
    )


def test_executor_pods_are_restricted_without_an_api_token() -> None:
    spec = spark_k8s.executor_pod_template()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # Files shipped with the job land in the working directory: a writable one.
    assert container["workingDir"] == "/tmp"
    assert container["volumeMounts"] == [{"name": "spark-local-dir-1", "mountPath": "/tmp"}]
    assert container["command"][1:] == ["-m", "txnkeeper.verifier.spark_executor"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "needs POD_IP, POD_NAME, POD_NAMESPACE, TXNKEEPER_SPARK_IMAGE in the environment"),
        ({**ENV, "POD_IP": ""}, "needs POD_IP in the environment"),
        ({**ENV, "TXNKEEPER_SPARK_EXECUTORS": "0"}, "TXNKEEPER_SPARK_EXECUTORS must be a positive number"),
        ({**ENV, "TXNKEEPER_SPARK_EXECUTORS": "two"}, "got 'two'"),
    ],
)
def test_a_driver_outside_the_operators_job_is_told_what_is_missing(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(VerifierInputError, match=message):
        spark_k8s.kubernetes_conf(env, tmp_path, "")


def test_a_k8s_master_without_the_pods_environment_fails_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("pyspark")
    for name in spark_k8s.REQUIRED_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(VerifierInputError, match="the operator's verifier CronJob sets them"):
        spark_session("k8s://https://kubernetes.default.svc")


def test_executor_command_is_the_official_entrypoints() -> None:
    home = Path("/opt/pyspark")
    assert spark_executor.command(EXECUTOR_ENV, home) == [
        "/usr/lib/jvm/java-17/bin/java",
        "-Dearlier=1",
        "-Dlater=1",
        "-Xms512m",
        "-Xmx512m",
        "-cp",
        "/opt/pyspark/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", "spark://CoarseGrainedScheduler@10.244.0.17:7078",
        "--executor-id", "2",
        "--cores", "1",
        "--app-id", "spark-app-1",
        "--hostname", "10.244.0.20",
        "--resourceProfileId", "0",
        "--podName", "txnkeeper-verify-exec-2",
    ]  # fmt: skip
    ipv6 = spark_executor.command({**EXECUTOR_ENV, "SPARK_EXECUTOR_POD_IP": "fd00::5"}, home)
    assert ipv6[ipv6.index("--hostname") + 1] == "[fd00::5]"


def test_executor_entry_refuses_to_run_outside_spark() -> None:
    with pytest.raises(spark_executor.ExecutorSetupError, match="SPARK_DRIVER_URL, SPARK_EXECUTOR_ID"):
        spark_executor.command({"SPARK_EXECUTOR_CORES": "1"}, Path("/opt/pyspark"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
    done = subprocess.run(
        [sys.executable, "-m", "txnkeeper.verifier.spark_executor", "executor"],
        capture_output=True, text=True, env=clean, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "not started as a Spark executor" in done.stderr, done.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "txnkeeper.verifier.spark_executor"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.mark.spark
def test_executor_entry_starts_sparks_kubernetes_executor_backend(tmp_path: Path) -> None:
    """The real JVM with PySpark's jars: the backend starts, then fails to reach a driver that is not
    there (a closed port), naming it: the entry point is right, no Spark distribution needed."""
    pytest.importorskip("pyspark")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPARK_")},
        **EXECUTOR_ENV,
        "JAVA_HOME": os.environ.get("JAVA_HOME", ""),
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9",  # discard: nothing listens
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_EXECUTOR_MEMORY": "128m",
        "SPARK_JAVA_OPT_0": "-XX:TieredStopAtLevel=1",
        "SPARK_JAVA_OPT_1": "-XX:+UseSerialGC",
    }
    if not env["JAVA_HOME"]:
        del env["JAVA_HOME"]  # then `java` from PATH
    done = subprocess.run(
        [sys.executable, "-m", "txnkeeper.verifier.spark_executor", "executor"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "KubernetesExecutorBackend: Started daemon" in done.stderr, done.stderr[-3000:]
    assert "Failed to connect to /127.0.0.1:9" in done.stderr, done.stderr[-3000:]


def test_executor_pod_settings_from_the_job_reach_spark_and_nothing_else(tmp_path: Path) -> None:
    secret = {"spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID": "creds:AWS_ACCESS_KEY_ID"}
    conf = spark_k8s.kubernetes_conf(
        {**ENV, "TXNKEEPER_SPARK_EXECUTOR_CONF": json.dumps(secret)}, tmp_path, ""
    )
    assert secret.items() <= conf.items()
    for text, message in (
        ("{", "TXNKEEPER_SPARK_EXECUTOR_CONF is not JSON"),
        ('["a"]', "must be a JSON object of strings"),
        ('{"spark.kubernetes.executor.label.a": 1}', "must be a JSON object of strings"),
        (
            '{"spark.driver.host": "1.2.3.4"}',
            r"may only set spark.kubernetes.executor.\* .*spark.driver.host",
        ),
    ):
        with pytest.raises(VerifierInputError, match=message):
            spark_k8s.kubernetes_conf({**ENV, "TXNKEEPER_SPARK_EXECUTOR_CONF": text}, tmp_path, "")
