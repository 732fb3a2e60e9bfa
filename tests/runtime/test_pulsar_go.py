"""Apache Pulsar's Go client (github.com/apache/pulsar-client-go, unmodified; tests/peers/pulsar-go)
runs transactions against a coordinator pod and a store pod (issue 26): it finds the coordinator the
way Pulsar's clients do (partitioned metadata and lookup of the coordinator-assign topic), a committed
transaction's messages are delivered, an aborted one's never are, and a consume-transform-produce
step's input ack commits with its output. `make test` builds the program (Makefile, PULSAR_GO_PEER)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from runtime_pods import ServePod

PEER = os.environ.get("PULSAR_GO_PEER", "")


@pytest.mark.skipif(
    not PEER or not Path(PEER).exists(),
    reason="the Go peer is not built: `make test` builds it (needs Go and the Go module proxy)",
)
def test_the_go_client_commits_and_aborts_transactions(pulsar_pods: tuple[ServePod, ServePod]) -> None:
    coordinator, store = pulsar_pods
    run = subprocess.run(
        [PEER, "-url", f"pulsar://{store.listen}", "-topic-prefix", "persistent://public/default/go"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-3000:]}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["committed"] == ["commit-0", "commit-1", "commit-2"]
    assert seen["aborted_seen"] is None
    assert seen["transformed"] == ["t-in-0", "t-in-1", "t-in-2", "t-in-3"]
    assert seen["input_redelivered"] is None
    # The coordinator logged the transactions; nothing was refused on either pod.
    for pod in (coordinator, store):
        assert " ERROR " not in pod.log(), pod.log()[-2000:]
