"""Fixtures for the verifier tests: one shared local SparkSession and synthetic pods on real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txnkeeper.verifier.synthetic import SyntheticPods

from .tiers import offload_topic


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


@pytest.fixture
def tiered(tmp_path: Path) -> tuple[Path, Path]:
    """(a pod's data dir, its filesystem tier) after 45 entries were written and offloaded."""
    root, tier = tmp_path / "pas-0", tmp_path / "tier"
    tier.mkdir()
    asyncio.run(offload_topic(root, tier, 45))
    return root, tier
