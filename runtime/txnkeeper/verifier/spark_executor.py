"""The executor entry point of the verifier image under Spark on Kubernetes.

Spark's driver creates each executor pod from the verifier image with the argument ``executor`` and the
executor's settings in ``SPARK_*`` variables: the contract of the official Spark image's entrypoint,
which this image (PySpark from pip, no Spark distribution) does not have. This module honours the same
contract: it starts ``KubernetesExecutorBackend`` on the JVM with PySpark's jars, so the executor's
Python workers run this image's interpreter with txnkeeper installed.

    python -m txnkeeper.verifier.spark_executor executor
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
JAVA_OPT_PREFIX = "SPARK_JAVA_OPT_"
# (flag, variable): what Spark's driver sets on every executor pod.
_FLAGS = (
    ("--driver-url", "SPARK_DRIVER_URL"),
    ("--executor-id", "SPARK_EXECUTOR_ID"),
    ("--cores", "SPARK_EXECUTOR_CORES"),
    ("--app-id", "SPARK_APPLICATION_ID"),
    ("--hostname", "SPARK_EXECUTOR_POD_IP"),
    ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
    ("--podName", "SPARK_EXECUTOR_POD_NAME"),
)


class ExecutorSetupError(RuntimeError):
    """The pod was not started the way Spark starts executors (the message says what is missing)."""


def spark_home() -> Path:
    """PySpark's package directory: its jars/ are a Spark distribution's."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _java_options(env: Mapping[str, str]) -> list[str]:
    # SPARK_JAVA_OPT_0, _1, ...: numbered, and the order matters (later options win).
    numbered = []
    for name, value in env.items():
        suffix = name.removeprefix(JAVA_OPT_PREFIX)
        if name.startswith(JAVA_OPT_PREFIX) and suffix.isdigit():
            numbered.append((int(suffix), value))
    return [value for _, value in sorted(numbered)]


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip


def command(env: Mapping[str, str], home: Path) -> list[str]:
    """The executor's JVM command line, as the official image's entrypoint builds it."""
    env = {**env, "SPARK_RESOURCE_PROFILE_ID": env.get("SPARK_RESOURCE_PROFILE_ID") or "0"}
    missing = [variable for _, variable in _FLAGS if not env.get(variable)]
    if not env.get("SPARK_EXECUTOR_MEMORY"):
        missing.append("SPARK_EXECUTOR_MEMORY")
    if missing:
        raise ExecutorSetupError(
            f"not started as a Spark executor: {', '.join(missing)} not set (Spark's driver sets them on"
            " the executor pods it creates; this entry point is not meant to be run by hand)"
        )
    java_home = env.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else "java"
    classpath = [str(home / "jars" / "*")]
    classpath += [env[name] for name in ("SPARK_CLASSPATH", "SPARK_DIST_CLASSPATH") if env.get(name)]
    memory = env["SPARK_EXECUTOR_MEMORY"]
    args = [java, *_java_options(env), f"-Xms{memory}", f"-Xmx{memory}", "-cp", ":".join(classpath), BACKEND]
    for flag, variable in _FLAGS:
        value = env[variable]
        args += [flag, _host(value) if flag == "--hostname" else value]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv != ["executor"]:
        print(f"usage: python -m txnkeeper.verifier.spark_executor executor (got {argv})", file=sys.stderr)
        return 2
    home = spark_home()
    try:
        args = command(os.environ, home)
    except ExecutorSetupError as exc:
        print(f"spark-executor: {exc}", file=sys.stderr)
        return 2
    # PySpark's workers find pyspark through SPARK_HOME; its python/lib zips are not needed (installed).
    os.environ.setdefault("SPARK_HOME", str(home))
    sys.stdout.flush()
    os.execvp(args[0], args)


if __name__ == "__main__":
    sys.exit(main())
