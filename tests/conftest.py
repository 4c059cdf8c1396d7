"""Session fixtures. Tests that need Kubernetes ask for `kube` (and usually `namespace`): the first such
test starts a real control plane from the cached binaries; if it cannot start, those tests fail (never
skip), with the component's log tail in the error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster import LocalCluster
from support.kube import Kube, wait_for


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


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace whose default service account exists (Pods are refused until it does)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"agentrun.dev/test": "true"}}})
    wait_for(
        lambda: kube.core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        timeout=30,
        what=f"default service account in {name}",
    )
    yield name
    kube.core.delete_namespace(name)
