"""pytest fixtures for the cluster tests: the session's kind cluster and a fresh namespace per test.

Why: `make e2e` creates the kind cluster (e2e/kind/up.sh) and passes its kubeconfig in KUBECONFIG; the
suite only uses it, so a developer can keep one cluster up across runs (`make kind-up`, then
`eval "$(cat e2e/.state/kind.env)"` and pytest) and the Makefile deletes it after a full run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from e2e.helpers import Cluster, api_ready, load_api, name_of, wait_for


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    kubeconfig = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
    if not kubeconfig.exists():
        raise pytest.UsageError(
            f"no kubeconfig at {kubeconfig}: run the suite with `make e2e`, or `make kind-up` and export "
            "what it prints"
        )
    api = load_api(kubeconfig)
    # e2e/kind/up.sh waited for this too; a cluster kept up across runs may have stopped answering.
    wait_for(lambda: api_ready(api), f"the API server of {kubeconfig} to answer", timeout=180)
    try:
        yield Cluster("kind", kubeconfig, api)
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes' ApiClient.close is unannotated


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test, deleted (and waited for: its pods' processes gone) afterwards."""
    name = f"e2e-{request.node.name.removeprefix('test_').replace('_', '-')[:40]}-{uuid.uuid4().hex[:5]}"
    name = name.lower().strip("-")
    # Pod Security Admission enforces "restricted" here, as a hardened cluster would: every pod the
    # operator, the chart or a test creates must run as non-root, drop all capabilities, use the
    # runtime's seccomp profile and never escalate.
    labels = {
        "txnkeeper.io/e2e": "true",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    body = {"metadata": {"name": name, "labels": labels}}
    cluster.core.create_namespace(body)  # type: ignore[arg-type]  # a dict: the client validates it
    wait_for(
        lambda: _has_default_sa(cluster, name),
        f"the default ServiceAccount in {name}",
        timeout=60,
    )
    yield name
    cluster.record_containers(name)
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


_SESSION_CLUSTER: list[Cluster] = []


@pytest.fixture(scope="session", autouse=True)
def _remember_cluster(cluster: Cluster) -> Iterator[None]:
    _SESSION_CLUSTER.append(cluster)
    yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The containers the session's pods ran, with the runtime's container ids and the images' digests."""
    for cluster in _SESSION_CLUSTER:
        terminalreporter.section("control-plane restarts since the cluster was created")
        try:
            for line in cluster.control_plane_restarts():
                terminalreporter.write_line(line)
        except Exception as err:  # a summary line must not turn a result into an error
            terminalreporter.write_line(f"(not available: {type(err).__name__}: {err})")
        if cluster.containers_seen:
            terminalreporter.section(f"containers run on {cluster.kind} (id, image, image digest)")
            for line in cluster.containers_seen:
                terminalreporter.write_line(line)
