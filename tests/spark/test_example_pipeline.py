"""examples/spark_order_totals.py runs as documented (--self-contained: real pods, real Spark) and its
Parquet output holds exactly the committed orders' per-customer totals (the aborted ones left out)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_order_totals.py"


def test_the_example_pipeline_writes_committed_totals(tmp_path: Path) -> None:
    out = tmp_path / "totals"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--self-contained", "--output", str(out), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # 30 orders over 4 customers, every fifth aborted: 24 committed.
    expected = [tuple(row) for row in result["expected"]]
    assert sum(n for _, n, _ in expected) == 24
    table = pq.read_table(out).to_pylist()
    got = sorted((r["customer"], r["orders"], r["totalCents"]) for r in table)
    assert got == expected
