"""The modules here bring their own operators, each watching only its own namespaces (or none at all), so
they share a control plane of their worker's on which no operator watches the whole cluster: the session's
cluster-wide `operator` (tests/conftest.py) would decide their Runs too. The operator's identity and the
admission policies are installed when it starts, so every module here meets the API server rules of a Helm
install whatever ran before it. Each fixture below stands in for the session fixture of the same name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster import LocalCluster
from support.clusters import cluster_kube, operator_identity, started_cluster
from support.kube import Kube


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from started_cluster(tmp_path_factory, "namespaced-cluster")


@pytest.fixture(scope="session")
def kube(local_cluster: LocalCluster) -> Kube:
    """The admin's client, once the CRDs are served."""
    return cluster_kube(local_cluster)


@pytest.fixture(scope="session")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return operator_identity(kube, tmp_path_factory)


@pytest.fixture(scope="session")
def agentrun_crds(kube: Kube) -> None:
    """Installed with `kube` on this control plane."""


@pytest.fixture(scope="session")
def operator() -> None:
    raise AssertionError(
        "tests/integration/namespaced/ has no cluster-wide operator: start one for the test's namespace"
    )


@pytest.fixture(scope="session", autouse=True)
def admission_policies(operator_kubeconfig: Path) -> None:
    """The operator's identity and the admission policies, before any module here runs."""
