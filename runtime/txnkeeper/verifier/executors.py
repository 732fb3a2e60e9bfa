"""Which Spark executor runs this task, so a job's report can say where its work ran.

PySpark gives a Python task its partition and attempt (TaskContext) but not its executor. The executor
is the JVM that started this Python worker (through PySpark's daemon): Spark launches every executor
backend (standalone, YARN, Kubernetes) with `--executor-id ID --hostname HOST`, so the worker reads
them from that ancestor's command line; Kubernetes executors also carry SPARK_EXECUTOR_ID. In local mode
the ancestor is the driver's JVM, and Spark calls that executor "driver". Stdlib only: this module is
shipped to executors with the job (`shipping`).
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from txnkeeper.verifier.model import ExecutorTasks

LOCAL_EXECUTOR = "driver"
# worker -> daemon -> executor JVM, plus slack for a wrapper script in between.
_ANCESTORS_SEARCHED = 5


@dataclass(frozen=True, slots=True, order=True)
class ExecutorRef:
    executor: str
    host: str


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command name in parentheses may itself contain spaces and parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _argument(command: list[str], flag: str) -> str | None:
    for index, part in enumerate(command[:-1]):
        if part == flag:
            return command[index + 1]
    return None


def current_executor() -> ExecutorRef:
    """The executor running this Python worker (call it inside a task)."""
    fallback_host = os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()
    pid = os.getppid()
    for _ in range(_ANCESTORS_SEARCHED):
        if pid <= 1:
            break
        command = _command_line(pid)
        executor = _argument(command, "--executor-id")
        if executor is not None:
            return ExecutorRef(executor, _argument(command, "--hostname") or fallback_host)
        if any(part.endswith("org.apache.spark.deploy.SparkSubmit") for part in command):
            return ExecutorRef(LOCAL_EXECUTOR, fallback_host)
        pid = _parent(pid)
    return ExecutorRef(os.environ.get("SPARK_EXECUTOR_ID", "unknown"), fallback_host)


def tally(refs: Iterable[ExecutorRef]) -> tuple[ExecutorTasks, ...]:
    """Tasks per executor, one ref per task, sorted by executor id (numerically where numeric)."""
    counts = Counter(refs)
    return tuple(ExecutorTasks(ref.executor, ref.host, counts[ref]) for ref in sorted(counts, key=_order))


def _order(ref: ExecutorRef) -> tuple[bool, int, str, str]:
    numeric = ref.executor.isdigit()
    return (not numeric, int(ref.executor) if numeric else 0, ref.executor, ref.host)
