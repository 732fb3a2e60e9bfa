"""Fixtures starting real runtime processes; every process is stopped by a finalizer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pulsar_wire import free_port, placement_flags
from runtime_pods import ServePod, started_pods


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Callable[..., ServePod]]:
    yield from started_pods(tmp_path)


@pytest.fixture
def cluster(pods: Callable[..., ServePod]) -> tuple[ServePod, ServePod]:
    """One coordinator pod and one store pod, batching on."""
    batch = {"enabled": True, "maxRecords": 512, "maxSizeBytes": 4194304, "maxDelayMillis": 1}
    return pods("tc-0", "coordinator", config=batch), pods("pas-0", "store", config=batch)


@pytest.fixture
def pulsar_pods(pods: Callable[..., ServePod]) -> tuple[ServePod, ServePod]:
    """One coordinator pod and one store pod that tell Pulsar's clients where each other is (their
    ports are chosen first: each pod's placement flags name both)."""
    store_port, coordinator_port = free_port(), free_port()
    flags = placement_flags(store_port, coordinator_port)
    coordinator = pods("tc-0", "coordinator", extra=[*flags, "--listen", f"127.0.0.1:{coordinator_port}"])
    store = pods("pas-0", "store", extra=[*flags, "--listen", f"127.0.0.1:{store_port}"])
    return coordinator, store
