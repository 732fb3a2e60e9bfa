"""The Spark side of the verifier: spread the pods over partitions, fetch and judge there, decide.

Each partition fetches its pods' ledgers documents with a thread pool (HTTP is I/O bound, so threads,
not more partitions, give the parallelism) and judges every reported store against the broadcast
markers; the driver only adds the expected-but-missing stores and the overall verdict (`decide`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from txnkeeper.verifier.decide import finalize, judge_document, judge_failure
from txnkeeper.verifier.executors import ExecutorRef, current_executor, tally
from txnkeeper.verifier.fetch import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, fetch_all
from txnkeeper.verifier.model import (
    ExecutorTasks,
    PodEndpoint,
    PodOutcome,
    Report,
    RolloverMarkers,
    StoreVerdict,
    VerifierInfraError,
    VerifierInputError,
)
from txnkeeper.verifier.registration import await_executors
from txnkeeper.verifier.shipping import ship_executor_code
from txnkeeper.verifier.spark_k8s import is_kubernetes, kubernetes_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "txnkeeper-verify-invalidation"
DEFAULT_MASTER = "local[*]"
# The job lives seconds, so the JVM's start matters more than peak JIT: C1 only and the serial GC halve
# session start on a busy 2-core machine (measured 18-23 s -> 8-11 s at load 8). Applied only when this
# process launches the JVM itself (not under spark-submit, whose flags already started it).
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Partitions per core: enough to keep every core busy while some pods are slow to answer.
PARTITIONS_PER_CORE = 2


@dataclass(frozen=True, slots=True)
class FetchSettings:
    timeout_s: float = DEFAULT_TIMEOUT_S
    concurrency: int = DEFAULT_CONCURRENCY

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise VerifierInputError(f"timeout must be positive, got {self.timeout_s}")
        if self.concurrency < 1:
            raise VerifierInputError(f"concurrency must be at least 1, got {self.concurrency}")


PodResult = tuple[PodOutcome, list[StoreVerdict]]


def check_pods(
    endpoints: Iterable[PodEndpoint], markers: Mapping[str, int], settings: FetchSettings
) -> Iterator[PodResult]:
    """Fetch and judge a group of pods (one Spark partition); usable without Spark as well."""
    for result in fetch_all(endpoints, settings.timeout_s, settings.concurrency):
        if result.error is not None:
            yield judge_failure(result.endpoint, result.error)
        else:
            yield judge_document(result.endpoint, result.document, markers)


def launched_by_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway; its --master then applies."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(master: str | None = None) -> SparkSession:
    """The session the job runs on: an existing one if any, else a small one on `master`."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise VerifierInfraError("pyspark is not installed (pip install 'txnkeeper[spark]')") from exc
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    same_image = master is not None and (master.startswith("local") or is_kubernetes(master))
    if same_image and "PYSPARK_PYTHON" not in os.environ:
        # PySpark starts workers with `python3` from PATH unless told otherwise; in local mode and on
        # Kubernetes (executors from this image) they must run this interpreter, which has txnkeeper.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName(APP_NAME)
    if master is not None:
        builder = builder.master(master)
    if not launched_by_spark_submit():
        builder = builder.config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
    if is_kubernetes(master):
        work_dir = Path(tempfile.mkdtemp(prefix="txnkeeper-spark-k8s-"))
        for key, value in kubernetes_conf(os.environ, work_dir, DRIVER_JAVA_OPTIONS).items():
            builder = builder.config(key, value)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
    )
    try:
        return builder.getOrCreate()
    except Exception as exc:
        raise VerifierInfraError(f"cannot start Spark ({master or 'default master'}): {exc}") from exc


def spark_running() -> bool:
    """Whether this process already has a SparkContext (getOrCreate would then return it)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None


def _partition_count(spark: SparkSession, pods: int) -> int:
    return max(1, min(pods, int(spark.sparkContext.defaultParallelism) * PARTITIONS_PER_CORE))


def collect_on_spark(
    spark: SparkSession,
    endpoints: Sequence[PodEndpoint],
    markers: Mapping[str, int],
    settings: FetchSettings,
) -> tuple[list[PodResult], tuple[ExecutorTasks, ...]]:
    """Run `check_pods` over the endpoints on Spark's executors: every pod's result, and how many
    tasks each executor ran."""
    context = spark.sparkContext
    ship_executor_code(context)
    await_executors(context)
    shared_markers = context.broadcast(dict(markers))
    try:

        def run_partition(part: Iterable[PodEndpoint]) -> Iterator[tuple[ExecutorRef, list[PodResult]]]:
            # One element per task: its executor, and its pods' results.
            yield current_executor(), list(check_pods(part, shared_markers.value, settings))

        rdd = context.parallelize(list(endpoints), _partition_count(spark, len(endpoints)))
        tasks = rdd.mapPartitions(run_partition).collect()
    except Exception as exc:
        raise VerifierInfraError(f"Spark job failed: {type(exc).__name__}: {exc}") from exc
    finally:
        shared_markers.unpersist()
    return [result for _, results in tasks for result in results], tally(ref for ref, _ in tasks)


def _now() -> datetime:
    return datetime.now(UTC)


def verify(
    endpoints: Sequence[PodEndpoint],
    markers: RolloverMarkers,
    *,
    master: str | None = DEFAULT_MASTER,
    spark: SparkSession | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    concurrency: int = DEFAULT_CONCURRENCY,
    keep_session: bool = False,
    clock: Callable[[], datetime] = _now,
) -> Report:
    """Verify that every store's batched data is invalidated (contracts §7); the public entry point.

    `endpoints`: the pods to ask (their admin API base URLs); `markers`: LastBatchedLedger per store and
    when they were taken. Uses `spark` if given, else an active session, else starts one on `master`
    (stopped again afterwards unless `keep_session`). Raises VerifierInputError for unusable inputs and
    VerifierInfraError when Spark cannot run; a store-level problem is never an exception, it is a
    "not safe" verdict in the report.
    """
    if not endpoints:
        raise VerifierInputError("no pod endpoints to check: a verification of nothing proves nothing")
    # Empty markers are legitimate: a PendingAckStore whose pods host no subscription yet rolled over
    # nothing. The pods are still asked, so a store that appeared since is judged (unmarked: not safe).
    settings = FetchSettings(timeout_s=timeout_s, concurrency=concurrency)
    owned = False
    if spark is None:
        # Only a session this call started is stopped here; one the caller runs (a test suite, the
        # fleet) is reused as it is.
        owned = not keep_session and not spark_running()
        spark = spark_session(master)
    try:
        generated_at = clock()
        results, executors = collect_on_spark(spark, endpoints, markers.ledgers, settings)
    finally:
        if owned:
            spark.stop()
    outcomes = [outcome for outcome, _ in results]
    verdicts = [verdict for _, pod_verdicts in results for verdict in pod_verdicts]
    return dataclasses.replace(finalize(generated_at, markers, outcomes, verdicts), executors=executors)
