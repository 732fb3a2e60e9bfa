"""Fixtures for the Spark data source tests: one SparkSession per module (the machine is shared)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# ServePod lives with the runtime tests (imported top-level there, as pytest's rootdir import does).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A small local session with the txnkeeper format registered; one that already runs (another
    suite's) is used and left running."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from txnkeeper.spark import register
    from txnkeeper.verifier.job import spark_session

    owned = SparkSession.getActiveSession() is None
    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    if owned:
        session.stop()
