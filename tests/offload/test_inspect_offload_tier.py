"""``txnkeeper inspect-offload`` on a real tier (a real pod offloaded a topic), then damaged: it must
find what the pod's reader finds (issue 25 item 8: a data object cut to half on a block boundary
passed inspection with ``"problem": null`` and exit 0 while the pod refused it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .tier_pods import BLOCK_BYTES, ServePod, offloaded_topic


@pytest.fixture
def pods() -> Iterator[list[ServePod]]:
    started: list[ServePod] = []
    yield started
    for pod in started:
        pod.stop()


def inspect(*args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "txnkeeper.cli", "inspect-offload", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr


def test_a_data_object_cut_on_a_block_boundary_is_reported(tmp_path: Path, pods: list[ServePod]) -> None:
    topic = offloaded_topic(tmp_path, pods)
    topic.store.stop()  # the files are inspected as an operator would: a copy at rest
    data, index = topic.segment_files()
    full = data.stat().st_size
    blocks = full // BLOCK_BYTES
    assert full == blocks * BLOCK_BYTES and blocks >= 10, full

    code, report, err = inspect(str(data), "--index", str(index))
    assert code == 0 and report["problem"] is None, (report, err)

    half = blocks // 2 * BLOCK_BYTES
    with open(data, "r+b") as f:
        f.truncate(half)
    uuid = data.name
    for args in ((str(data), "--index", str(index)), (str(data),), (str(index),)):
        code, report, err = inspect(*args)
        assert code == 1, (args, report, err)
        problem = report["problem"]
        assert uuid in problem, (args, problem)
        assert f"index says the data object is {full} bytes, it is {half}" in problem, (args, problem)
        assert "restore the object from a backup" in problem, (args, problem)
