"""Which executor ran a task: read from real process trees, and the per-executor tally of a report."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from txnkeeper.verifier.executors import LOCAL_EXECUTOR, ExecutorRef, current_executor, tally
from txnkeeper.verifier.model import ExecutorTasks, Report, RolloverMarkers

# A Python worker's view: the process that started it is the executor JVM (here a stand-in parent whose
# command line carries the flags an executor backend is launched with).
CHILD = (
    "import json; from txnkeeper.verifier.executors import current_executor; "
    "print(json.dumps(list(__import__('dataclasses').astuple(current_executor()))))"
)
PARENT = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)"


def _as_worker_of(*flags: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD, *flags], capture_output=True, text=True, timeout=60, check=True
    )
    result: list[str] = json.loads(completed.stdout)
    return result


def test_executor_id_and_host_come_from_the_executor_backends_command_line() -> None:
    flags = ["--driver-url", "spark://CoarseGrainedScheduler@10.0.0.1:7078", "--executor-id", "7",
             "--hostname", "10.1.2.3", "--cores", "1"]  # fmt: skip
    assert _as_worker_of(*flags) == ["7", "10.1.2.3"]


def test_a_local_mode_worker_belongs_to_the_driver() -> None:
    executor, _ = _as_worker_of("org.apache.spark.deploy.SparkSubmit", "pyspark-shell")
    assert executor == LOCAL_EXECUTOR


def test_outside_spark_the_executor_is_unknown_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_EXECUTOR_ID", raising=False)
    assert current_executor().executor == "unknown"
    monkeypatch.setenv("SPARK_EXECUTOR_ID", "5")  # what Kubernetes executor pods carry
    assert current_executor().executor == "5"


def test_tally_counts_tasks_per_executor_in_numeric_order() -> None:
    refs = [ExecutorRef("10", "h2"), ExecutorRef("2", "h1"), ExecutorRef("10", "h2"), ExecutorRef("2", "h1")]
    refs += [ExecutorRef("driver", "h0")]
    assert tally(refs) == (
        ExecutorTasks("2", "h1", 2),
        ExecutorTasks("10", "h2", 2),
        ExecutorTasks("driver", "h0", 1),
    )
    assert tally([]) == ()


def test_reports_carry_executors_and_older_reports_without_them_still_read() -> None:
    markers = RolloverMarkers(taken_at=datetime(2026, 11, 28, tzinfo=UTC), ledgers={"log0": 7})
    report = Report(markers.taken_at, markers, True, "SAFE", (), (), (ExecutorTasks("0", "127.0.0.2", 3),))
    doc = report.to_dict()
    assert doc["executors"] == [{"executor": "0", "host": "127.0.0.2", "tasks": 3}]
    assert Report.from_dict(doc) == report
    del doc["executors"]  # a report of a verifier that predates the field
    assert Report.from_dict(doc) == dataclasses.replace(report, executors=())
