"""The memory soak (bench/memory_soak.py): its 2-minute form against real pods, and its judge.

The full hour is not part of a test run (docs/performance.md, "Memory soak"); its 2-minute form is:
real coordinator and store processes under the soak's whole mix (transactions on topics with and
without subscriptions, lazy consumers, a writer flood), asserting the verdict's structure and that each
process stayed under its documented RSS budget. Throughput is whatever the machine reached: nothing
here asserts speed, and flatness is judged only by the long run (two minutes are mostly warm-up).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "memory_soak.py"


def load_bench() -> ModuleType:
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))  # its sibling txn_e2e, as when run as a script
    spec = importlib.util.spec_from_file_location("memory_soak", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def samples(store_mb: list[float], kept: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "t": 10.0 * i,
            "rss_mb": {"tc-0": 60.0, "pas-0": mb},
            "store": {"txnkeeper_topic_kept_txn_outcomes": k},
        }
        for i, (mb, k) in enumerate(zip(store_mb, kept, strict=True))
    ]


def test_the_judge_tells_flat_from_growing_and_checks_the_budget() -> None:
    bench = load_bench()
    pods = {"tc-0": "coordinator", "pas-0": "store"}
    flat = bench.judge(samples([50, 100, 101, 100, 102, 103, 104], [0] * 7), 60.0, pods)
    assert flat["verdict"] == {"flat": True, "under_budget": True}
    assert flat["mark_seconds"] == 10.0 and flat["window_seconds"] == [50.0, 60.0]

    growing = bench.judge(samples([50, 100, 101, 103, 104, 105, 106], [0] * 7), 60.0, pods)
    assert growing["processes"]["pas-0"]["flat"] is False  # 6 % above the mark
    assert growing["processes"]["tc-0"]["flat"] is True

    over = bench.judge(samples([50, 100, 100, 100, 100, 100, 10_000], [0] * 7), 60.0, pods)
    assert over["processes"]["pas-0"]["under_budget"] is False

    # 1 MiB of growth, all of it 2**20 / 41 kept outcomes: explained, nothing left over.
    kept = bench.judge(
        samples([50, 100, 100, 100, 100, 100, 101], [0, 0, 0, 0, 0, 0, 2**20 // 41]), 60.0, pods
    )
    assert kept["growth"]["mb_explained_by_kept_outcomes"] == 1.0
    assert kept["growth"]["mb_unexplained"] == 0.0


def test_bursts_of_single_samples_do_not_decide_flatness_but_growth_of_the_level_does() -> None:
    """An hour sampled every 10 s: every sixth sample 8 % up (a burst's transient) over a flat level is
    flat; the same bursts over a level that grows 6 % are not."""
    bench = load_bench()
    pods = {"tc-0": "coordinator", "pas-0": "store"}
    n = 361
    bursty = [100.0 * (1.08 if i % 6 == 3 else 1.0) for i in range(n)]
    result = bench.judge(samples(bursty, [0] * n), 3600.0, pods)["processes"]["pas-0"]
    assert result["flat"] is True and result["growth_pct"] == 0.0
    assert result["sample_growth_pct"] == 8.0 and result["rss_mb_peak"] == 108.0
    growing = [mb * (1.06 if i >= 300 else 1.0) for i, mb in enumerate(bursty)]
    result = bench.judge(samples(growing, [0] * n), 3600.0, pods)["processes"]["pas-0"]
    assert result["flat"] is False and round(result["growth_pct"]) == 6


@pytest.mark.soak
# Two minutes of load whatever the machine: it runs in the side pytest process beside the wall-clock
# tests, which keeps the two processes of `make test` about equally long.
@pytest.mark.wallclock
@pytest.mark.timeout(600)
def test_two_minutes_of_the_soak_mix_stay_under_the_budgets(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--seconds", "120", "--interval", "5"],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a verdict failed; judged below
    result = json.loads(done.stdout)
    assert result["benchmark"] == "memory_soak" and result["seconds"] >= 120
    assert set(result["budget_mb"]) == {"coordinator", "store"}
    roles = {p["role"] for p in result["processes"].values()}
    assert roles == {"coordinator", "store"}
    for name, process in result["processes"].items():
        assert process["rss_mb_peak"] > 0
        assert process["under_budget"], (name, process, result["growth"])
    assert result["verdict"]["under_budget"] is True
    assert isinstance(result["verdict"]["flat"], bool)
    assert len(result["samples"]) >= 6
    counts = result["counts"]
    # Every part of the mix ran.
    assert counts["txn_with_subscription"] > 0 and counts["txn_without_subscription"] > 0, counts
    assert counts["lazy_consumers_opened"] >= 16, counts
    assert counts["setup_appends_never_written"] > 0 and counts["setup_appends_refused"] == 0, counts
    assert counts["single_key_commits"] > 0, counts
    assert result["achieved_txn_per_s"] > 0
    # Where the memory went: both processes' C heaps, the store's tail cache (within its budget).
    parts = result["memory_parts_mb"]
    assert parts["coordinator"]["heap in_use"]["last"] > 0 and parts["store"]["heap in_use"]["last"] > 0
    assert 0 < parts["store"]["txnkeeper_store_tail_cache_bytes"]["last"] <= 64, parts


@pytest.mark.timeout(300)
def test_a_soak_stopped_with_sigterm_stops_its_pods(tmp_path: Path) -> None:
    soak = subprocess.Popen(
        [sys.executable, str(BENCH), "--seconds", "600", "--interval", "5", "--rate", "20", "--progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert soak.stderr is not None
    first_sample = soak.stderr.readline()  # printed once both pods answered
    assert first_sample.startswith("{"), first_sample + soak.stderr.read()[-3000:]
    pods = [int(pid) for pid in Path(f"/proc/{soak.pid}/task/{soak.pid}/children").read_text().split()]
    assert len(pods) == 2, pods
    try:
        soak.send_signal(signal.SIGTERM)
        assert soak.wait(timeout=120) == 128 + signal.SIGTERM
        for pid in pods:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                continue  # gone and reaped
            assert state == "Z", f"pod {pid} still runs after its soak was stopped"
    finally:
        for pid in pods:  # a failed run leaves no pods behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
