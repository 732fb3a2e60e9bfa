"""Fixtures for the verifier tests: one shared local SparkSession and synthetic pods on real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from txnkeeper.verifier.synthetic import SyntheticPods


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One small local session for every Spark test (the machine is shared; sessions are heavy)."""
    pytest.importorskip("pyspark")
    from txnkeeper.verifier.job import spark_session

    session = spark_session("local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def pods() -> Iterator[SyntheticPods]:
    with SyntheticPods() as servers:
        yield servers
