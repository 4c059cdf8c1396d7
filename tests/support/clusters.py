"""A control plane of a module's own, the operator's identity on it, and namespaces opted in for
attempt Pods: what conftest's session fixtures set up, for modules that need their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.rbac import AGENT_ACCOUNT_PATCH, attempt_role
from devcluster import security
from devcluster.cluster import LocalCluster
from support.agentrun import install_crds
from support.kube import Kube

# The console the operator's notifications link to (nothing listens there: the link is what is tested).
CONSOLE_URL = "http://console.agentrun.test"


def started_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, *, with_object_store: bool = True
) -> Iterator[LocalCluster]:
    """A control plane (with its object store, unless told otherwise) started for the caller (a module's
    `local_cluster` fixture), stopped after it."""
    cluster = LocalCluster(state_dir=tmp_path_factory.mktemp(name), with_object_store=with_object_store)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cluster_kube(cluster: LocalCluster) -> Kube:
    """A client of `cluster` as its admin, with the CRDs installed."""
    kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
    install_crds(kube)
    return kube


def own_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, *, instant: bool = False
) -> Iterator[Kube]:
    """A control plane started for the caller (a module's `kube` fixture), with the CRDs installed."""
    cluster = LocalCluster(state_dir=tmp_path_factory.mktemp(name), instant=instant)
    try:
        cluster.start()
        kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
        install_crds(kube)
        yield kube
    finally:
        cluster.stop()


def operator_identity(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's own identity (a ServiceAccount with agentrun.rbac's rules), with the admission
    policies of agentrun.admission enforced: the API server rules of a Helm install."""
    return security.install(
        str(kube.kubectl_path), kube.kubeconfig, tmp_path_factory.mktemp("operator-identity") / "kubeconfig"
    )


def opt_in_for_attempts(kube: Kube, namespace: str) -> str:
    """The namespace's default service account may do what an attempt Pod does (agentrun.rbac), and is
    opted in for attempt Pods (labelled agentrun.dev/agent=true)."""
    kube.core.patch_namespaced_service_account("default", namespace, AGENT_ACCOUNT_PATCH)
    kube.rbac.create_namespaced_role(namespace, attempt_role(namespace))
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "agentrun-attempt"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentrun-attempt"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        },
    )
    return namespace
