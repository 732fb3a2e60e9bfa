"""pytest fixtures for the cluster tests: the session's kind cluster and a fresh namespace per test.

Why: `make e2e` creates the kind cluster (e2e/kind/up.sh) and passes its kubeconfig in KUBECONFIG; the
suite only uses it, so a developer can keep one cluster up across runs (`make kind-up`, then
`eval "$(cat e2e/.state/kind.env)"` and pytest) and the Makefile deletes it after a full run.

`make e2e` runs the suite in two pytest-xdist workers on the one cluster (E2E_WORKERS): the suite mostly
waits on pods, rollouts and Spark (alone it used 0.86 of a core), and each test has a namespace of its
own. What the workers share is the operator (one helm release in txnkeeper-system). Each worker installs
it once (``helm upgrade --install`` of the same values changes nothing the second time) and leaves it
installed (the Makefile deletes the cluster after the run). A test that takes the operator down or
restarts it on purpose is marked ``disrupts_operator``: it holds a lock that the other worker's
disrupting tests and installs also take, so it never finds the operator missing or patched by the
other worker (the other tests only see an operator restart, which the operator resumes from).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
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


@contextmanager
def operator_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Exclusive among the pytest-xdist workers of this run (a no-op without xdist)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    # Each worker's base temp is a directory of the run's shared one.
    path = tmp_path_factory.getbasetemp().parent / "operator.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def operator_release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed once per pytest process (e2e/test_operator.py's ``operator`` fixture)."""
    from e2e.test_operator import OPERATOR_NS, install_operator, uninstall_operator

    with operator_lock(tmp_path_factory):
        install_operator(cluster)
    yield OPERATOR_NS
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cluster.record_containers(OPERATOR_NS)  # the other worker may still use it
    else:
        uninstall_operator(cluster)


@pytest.fixture(autouse=True)
def _operator_disruption(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A ``disrupts_operator`` test holds the operator lock from before its namespace exists until
    it is deleted (autouse: set up before the test's other function fixtures, torn down after them)."""
    if request.node.get_closest_marker("disrupts_operator") is None:
        yield
        return
    with operator_lock(tmp_path_factory):
        yield


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
_CONTAINERS_FILE = "containers-{worker}.txt"  # under xdist: each worker's lines for the summary


@pytest.fixture(scope="session", autouse=True)
def _remember_cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    _SESSION_CLUSTER.append(cluster)
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # the summary is printed by the controlling process, which ran no test
        shared = tmp_path_factory.getbasetemp().parent
        (shared / _CONTAINERS_FILE.format(worker=worker)).write_text(
            "".join(f"{line}\n" for line in cluster.containers_seen)
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The containers the session's pods ran, with the runtime's container ids and the images' digests."""
    clusters = list(_SESSION_CLUSTER)
    factory = getattr(config, "_tmp_path_factory", None)
    if not clusters and factory is not None and getattr(config.option, "numprocesses", None):
        # The xdist controller: the cluster of KUBECONFIG, the containers the workers wrote down.
        kubeconfig = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
        if not kubeconfig.exists():
            return
        cluster = Cluster("kind", kubeconfig, load_api(kubeconfig))
        for path in sorted(factory.getbasetemp().glob(_CONTAINERS_FILE.format(worker="*"))):
            cluster.containers_seen.extend(path.read_text().splitlines())
        clusters.append(cluster)
    for cluster in clusters:
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
