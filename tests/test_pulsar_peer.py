"""The Pulsar peer benchmark's own logic (bench/pulsar_peer/run.py), without a JVM.

The benchmark itself is optional and slow (``make bench-pulsar``); these checks keep the parts that
turn its observations into figures honest: which metric lines count as commits, how the ratios are
formed, and that a missing jar directory is refused with what to do.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

RUN_PY = Path(__file__).resolve().parent.parent / "bench" / "pulsar_peer" / "run.py"


def load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pulsar_peer_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_committed_counts_every_coordinator_and_nothing_else() -> None:
    run = load_run()
    metrics = "\n".join(
        [
            "# TYPE pulsar_txn_committed_total gauge",
            'pulsar_txn_committed_total{cluster="standalone",coordinator_id="0"} 1200.0',
            'pulsar_txn_committed_total{cluster="standalone",coordinator_id="1"} 34.0',
            'pulsar_txn_committed_total_created{cluster="standalone"} 99.0',
            'pulsar_txn_aborted_total{cluster="standalone",coordinator_id="0"} 7.0',
        ]
    )
    assert sum(float(v) for v in run.COMMITTED.findall(metrics)) == 1234.0


def test_ratio_is_txnkeeper_over_pulsar_per_mode_and_level() -> None:
    run = load_run()
    pulsar = {
        "batching_off": [{"concurrency": 1, "txn_per_s": 50.0}, {"concurrency": 16, "txn_per_s": 0.0}],
        "batching_on": [{"concurrency": 1, "txn_per_s": 40.0}, {"concurrency": 256, "txn_per_s": 800.0}],
    }
    txnkeeper = {
        "batching_off": [{"concurrency": 1, "txn_per_s": 100.0}, {"concurrency": 16, "txn_per_s": 10.0}],
        "batching_on": [{"concurrency": 1, "txn_per_s": 10.0}],
    }
    assert run.ratios(pulsar, txnkeeper) == {
        # A level Pulsar did not complete any transaction at has no ratio; one only Pulsar ran is left out.
        "batching_off": {"1": 2.0, "16": None},
        "batching_on": {"1": 0.25},
    }


def test_rounds_are_summarised_by_each_ratios_median() -> None:
    run = load_run()
    rounds = [
        {"batching_off": {"1": 1.2, "16": 1.4}, "produce": 0.9},
        {"batching_off": {"1": 1.6, "16": None}, "produce": 1.3},
        {"batching_off": {"1": 1.3, "16": 1.6}, "produce": 1.1},
    ]
    # A level without a ratio in some round (Pulsar completed nothing there) counts the others only.
    assert run.median_ratios(rounds) == {"batching_off": {"1": 1.3, "16": 1.5}, "produce": 1.1}


def test_a_lib_directory_without_the_broker_is_refused_with_what_to_do(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(RUN_PY), "--lib", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"--lib {tmp_path}: no pulsar-broker jar there" in done.stderr
    assert "make bench-pulsar" in done.stderr
