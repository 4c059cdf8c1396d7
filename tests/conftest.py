"""Session fixtures. Tests that need Kubernetes ask for `kube` (and usually `namespace`): the first such
test starts a real control plane from the cached binaries; if it cannot start, those tests fail (never
skip), with the component's log tail in the error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from devcluster.tickets import TicketServiceProcess
from support.agentrun import install_crds
from support.clusters import CONSOLE_URL, operator_identity, opt_in_for_attempts
from support.kube import Kube, wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Browser
    from xdist.remote import Producer


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> object | None:
    """`--dist loadfile` (as `make test` runs the suite): the longest files first (support.schedule)."""
    if config.getoption("dist") != "loadfile":
        return None
    from support.schedule import LongestFileFirst  # noqa: PLC0415 (xdist is imported only when it runs)

    return LongestFileFirst(config, log)


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(state_dir=tmp_path_factory.mktemp("devcluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster) -> Kube:
    return Kube(local_cluster.kubeconfig, Path(local_cluster.binary("kubectl")))


def _fresh_namespace(kube: Kube, request: pytest.FixtureRequest) -> str:
    """A namespace; on a test's local cluster (when it has one) with its bucket on the cluster's store (a
    bucket per namespace, as the operator makes it for a namespace that opts in): tests write a
    namespace's objects there as the store's root."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    if "local_cluster" in request.fixturenames:
        cluster: LocalCluster = request.getfixturevalue("local_cluster")
        cluster.prepare_namespace_bucket(name)
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"agentrun.dev/test": "true"}}})
    wait_for(
        lambda: kube.core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        timeout=30,
        what=f"default service account in {name}",
    )
    return name


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose default service account exists (Pods are refused until it does)."""
    name = _fresh_namespace(kube, request)
    yield name
    kube.core.delete_namespace(name)


@pytest.fixture(scope="module")
def module_namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace shared by the tests of one module (for tests that only need distinct names)."""
    name = _fresh_namespace(kube, request)
    yield name
    kube.core.delete_namespace(name)


@pytest.fixture(scope="session")
def agentrun_crds(kube: Kube) -> None:
    """The agentrun.dev CRDs from crds/, applied once per session and ready: Established, serving the
    four kinds and enforcing their CEL rules. Request it for its effect."""
    install_crds(kube)


@pytest.fixture(scope="session")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's own identity and the admission policies: every test meets the API server rules of
    a Helm install."""
    return operator_identity(kube, tmp_path_factory)


@pytest.fixture(scope="session")
def notify_sink() -> str:
    """The sink on the operator's notification allow-list; a test that expects notifications listens on it
    (until then, deliveries to it are retried in the operator's background and never hold up a Run)."""
    return f"http://127.0.0.1:{free_port()}/events"


@pytest.fixture(scope="session")
def operator(
    local_cluster: LocalCluster,
    agentrun_crds: None,
    operator_kubeconfig: Path,
    notify_sink: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The agentrun operator, running as its own process and ServiceAccount against the test cluster (not
    in a Pod, so it is told its account, as the chart's Deployment tells it through the downward API)."""
    # Metrics on a free port: the default, 8000, may be held by any other process on a shared machine,
    # and the operator then logs an ERROR that test_the_operator_starts_without_an_error would see.
    env = {
        "AGENTRUN_METRICS_PORT": str(free_port()),
        "AGENTRUN_NOTIFY_SINKS": notify_sink,
        "AGENTRUN_CONSOLE_URL": CONSOLE_URL,
        **security.OPERATOR_ENV,
        # the cluster's versitygw, as `make operator` and the demo have it, and the operator's own
        # credentials (it writes checkpoint indexes and log tails there); each run_namespace gets the
        # credentials Secret its Pods read from the fixture, so the operator is not told to make it
        **security.local_store_operator_env(local_cluster, provision=False),
    }
    process = OperatorProcess(
        operator_kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", env=env
    )
    process.start()
    process.wait_ready()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def tickets(tmp_path: Path) -> Iterator[TicketServiceProcess]:
    """The example ticket service (the world outside the cluster), started for one test."""
    service = TicketServiceProcess(tmp_path / "tickets.json", tmp_path / "tickets.log")
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def run_namespace(kube: Kube, local_cluster: LocalCluster, namespace: str) -> Iterator[str]:
    """A namespace whose default service account may do what an attempt Pod does (agentrun.rbac), is
    opted in for attempt Pods (labelled agentrun.dev/agent=true), and holds the state-store credentials
    Secret its attempt Pods read (its own principal, in a bucket of the namespace's own, taken back after
    the test as an operator would once the namespace is gone). The session's operator stands for a
    cluster whose administrator provides the Secrets (it is not told AGENTRUN_STATE_STORE_PROVISION, so
    a namespace without them fails its Runs: test_store_access), so the fixture, as that administrator,
    takes the principal back; an operator administering the bundled server does it itself."""
    opt_in_for_attempts(kube, namespace)
    try:
        kube.core.create_namespaced_secret(
            namespace, security.state_store_secret(namespace, local_cluster.namespace_store_env(namespace))
        )
        yield namespace
    finally:
        local_cluster.forget_namespace_store(namespace)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """A headless Chromium from the distribution's packages, driven by Playwright (the console's tests)."""
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 (only the browser tests pay for it)

    from support.console import launch  # noqa: PLC0415

    with sync_playwright() as driver:
        launched = launch(driver)
        yield launched
        launched.close()
