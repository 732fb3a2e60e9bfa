"""pytest fixtures for the cluster tests: the session's cluster and a fresh namespace per test.

Why: E2E_CLUSTER=local (default) starts the local control plane for the session unless one is already
up (`make cluster-up`), and stops it afterwards, so nothing is left running; E2E_CLUSTER=kind uses the
kind cluster that e2e/kind/up.sh created (KUBECONFIG or the default kubeconfig).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from e2e.helpers import Cluster, load_api, name_of, wait_for
from e2e.localcluster import controlplane
from e2e.localcluster.config import Layout, state_dir

E2E_CLUSTER = os.environ.get("E2E_CLUSTER", "local")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if E2E_CLUSTER == "kind":
        kubeconfig = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
        yield Cluster("kind", kubeconfig, load_api(kubeconfig))
        return
    if E2E_CLUSTER != "local":
        raise pytest.UsageError(f"E2E_CLUSTER must be local or kind, not {E2E_CLUSTER!r}")
    started_here = not controlplane.is_up()
    if started_here:
        controlplane.up()
    kubeconfig = Layout(state_dir()).admin_kubeconfig
    api = load_api(kubeconfig)
    try:
        yield Cluster("local", kubeconfig, api)
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes' ApiClient.close is unannotated
        if started_here and not os.environ.get("E2E_KEEP_CLUSTER"):
            controlplane.down()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test, deleted (and waited for: its pods' processes gone) afterwards."""
    name = f"e2e-{request.node.name.removeprefix('test_').replace('_', '-')[:40]}-{uuid.uuid4().hex[:5]}"
    name = name.lower().strip("-")
    body = {"metadata": {"name": name, "labels": {"txnkeeper.io/e2e": "true"}}}
    cluster.core.create_namespace(body)  # type: ignore[arg-type]  # a dict: the client validates it
    wait_for(
        lambda: _has_default_sa(cluster, name),
        f"the default ServiceAccount in {name}",
        timeout=60,
    )
    yield name
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(f"\n===== diagnostics for {name} =====\n{cluster.diagnostics(name)}")
    cluster.core.delete_namespace(name)
    # Its pods gone means their processes are gone; the rest of the namespace may finish later.
    wait_for(
        lambda: not cluster.core.list_namespaced_pod(name).items, f"the pods of {name} to be deleted", 180
    )


def _has_default_sa(cluster: Cluster, ns: str) -> bool:
    return any(name_of(sa) == "default" for sa in cluster.core.list_namespaced_service_account(ns).items)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Expose each phase's report on the item, so fixtures can print diagnostics after a failure."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
