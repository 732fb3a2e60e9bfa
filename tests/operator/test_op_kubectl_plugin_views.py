"""The kubectl plugin without a cluster: its console script is installed and answers, resource names
parse as kubectl's do, and status sections only a newer operator writes (``status.placement``) render."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from txnkeeper_operator import naming
from txnkeeper_operator.kubectl_plugin import refs, views

SCRIPT = Path(sys.executable).parent / "kubectl-txnkeeper"


def test_console_script_is_installed_and_answers() -> None:
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for verb in ("status", "rollout", "verify", "pause", "resume", "certs"):
        assert verb in done.stdout
    done = subprocess.run(
        [str(SCRIPT), "rollout", "history", "deployment/x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: unknown resource type 'deployment'") and "Traceback" not in done.stderr
    )


def test_no_kubeconfig_and_not_in_a_pod(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    done = subprocess.run(
        [str(SCRIPT), "status"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot configure the Kubernetes client from the in-cluster")
    assert "set --kubeconfig or $KUBECONFIG" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("words", "kind", "name"),
    [
        (["tc", "a"], naming.TRANSACTION_COORDINATOR, "a"),
        (["TransactionCoordinator/a"], naming.TRANSACTION_COORDINATOR, "a"),
        (["pendingackstores.txnkeeper.io", "b"], naming.PENDING_ACK_STORE, "b"),
        (["pas"], naming.PENDING_ACK_STORE, None),
    ],
)
def test_resource_names(words: list[str], kind: naming.Kind, name: str | None) -> None:
    assert refs.parse(words, need_name=False) == [refs.Ref(kind, name)]


@pytest.mark.parametrize(
    ("words", "need_name", "message"),
    [
        (["tc/"], True, "no name after the '/'"),
        (["tc/a", "b"], True, "not both"),
        (["tc", "a", "b"], True, "one resource at a time"),
        ([], True, "name a resource"),
        (["pods", "x"], False, "unknown resource type 'pods'"),
    ],
)
def test_bad_resource_names(words: list[str], need_name: bool, message: str) -> None:
    with pytest.raises(refs.UsageError, match=message):
        refs.parse(words, need_name=need_name)


def test_placement_and_unknown_release_render() -> None:
    status = {
        "phase": "Ready",
        "currentVersion": "9.0.0",
        "placement": {
            "kind": "store-shards",
            "epoch": 4,
            "shards": 8,
            "phase": "Rebalancing",
            "rebalance": "load",
            "pods": [
                {"pod": "s-0", "owned": [0, 1, 2, 3, 4], "count": 5},
                {"pod": "s-1", "owned": [5, 6, 7]},
            ],
            "moves": [{"id": "m1", "unit": 4, "source": 0, "target": 1, "phase": "receive"}],
            "failedMoves": [{"id": "m0", "unit": 2, "source": 0, "target": 1, "error": "fenced twice"}],
        },
    }
    text = views.status_text({"kind": "PendingAckStore", "metadata": {"name": "s"}, "status": status})
    assert "9.0.0 (format level ?)" in text
    assert "Placement:   Rebalancing (kind store-shards, epoch 4, shards 8)" in text
    lines = [line.split() for line in text.splitlines()]
    assert ["s-0", "5", "0,1,2,3,4"] in lines and ["s-1", "3", "5,6,7"] in lines
    assert ["m1", "4", "0", "1", "receive"] in lines
    assert ["m0", "2", "0", "1", "failed", "fenced", "twice"] in lines
    assert "Placement" not in views.status_text(
        {"kind": "PendingAckStore", "metadata": {}, "status": {"phase": "Ready"}}
    )
